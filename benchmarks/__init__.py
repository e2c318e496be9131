"""Benchmarks (pytest-benchmark); also plain tests under --benchmark-disable."""
from harness.config import prefer_passive_wait
from harness.process import retain_freed_memory

prefer_passive_wait()  # before any benchmark imports torch (each sets its own thread counts)
retain_freed_memory()  # as the entry points do (the peak-memory children set their own threshold)
