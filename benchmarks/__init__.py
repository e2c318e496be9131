"""Benchmarks (pytest-benchmark); also plain tests under --benchmark-disable."""
from harness.config import prefer_passive_wait

prefer_passive_wait()  # before any benchmark imports torch (each sets its own thread counts)
