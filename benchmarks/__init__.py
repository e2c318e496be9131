"""Benchmarks (pytest-benchmark); also plain tests under --benchmark-disable."""
