"""Timing helpers of the benchmark reports (benchmarks.report, benchmarks.floor, benchmarks.device): thread counts
for torch and numpy's BLAS together, the median of wall-clock repeats with millisecond calls repeated for a steady
median, and the machine line every report starts with."""
from __future__ import annotations

import os
import platform
import statistics
import time

import torch

_BLAS_FIRST = []  # the first BLAS limiter: restoring it gives back the thread counts from before any set_threads


def set_threads(n: int) -> None:
    """n threads for torch and for numpy's BLAS (ARPACK's numpy operator): both sides of a comparison get the same
    count (numpy's OpenBLAS otherwise starts one thread per core whatever torch is told). The BLAS limit stays in
    force until `restore_threads()` (threadpoolctl limits are not undone by garbage collection)."""
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    lim = threadpool_limits(limits=n, user_api="blas")
    if not _BLAS_FIRST:
        _BLAS_FIRST.append(lim)


def restore_threads() -> None:
    """BLAS thread counts as they were before the first set_threads (torch's count is the caller's business)."""
    for lim in _BLAS_FIRST:
        lim.restore_original_limits()
    _BLAS_FIRST.clear()


FAST_CALL = 0.05  # seconds: a call this short gets repeated for about FAST_WALL seconds (at most FAST_REPEATS)
FAST_WALL, FAST_REPEATS = 1.0, 60


def measure(fn, repeats: int, warmup: bool):
    """(value, median seconds) of wall-clock repeats. After a warm-up call shorter than FAST_CALL, the call is
    repeated for about FAST_WALL seconds (at most FAST_REPEATS times, at least `repeats`): the median of three
    millisecond calls moved by about 10 % between runs on a shared host."""
    if warmup:
        repeats = _repeats_after_warmup(fn, repeats)
    times, val = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        val = fn()
        times.append(time.perf_counter() - t0)
    return val, statistics.median(times)


def _repeats_after_warmup(fn, repeats: int) -> int:
    """Run fn once (the warm-up) and return how often to time it: `repeats`, or for a call under FAST_CALL enough
    for about FAST_WALL seconds (at most FAST_REPEATS)."""
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    return max(repeats, min(FAST_REPEATS, int(FAST_WALL / max(first, 1e-6)))) if first < FAST_CALL else repeats


def measure_alternating(fns: dict, repeats: int) -> dict:
    """{name: (value, median seconds)} for callables compared with each other: each gets its warm-up and its number
    of timed calls as in `measure`, but the calls are made in rounds, one block of each callable per round (as
    many rounds as the fewest calls any of them gets, each callable's calls spread evenly over them), so a load
    that comes and goes on a shared host falls on every side alike instead of on whichever ran during it
    (measured one after the other, two runs of the same code path a few seconds apart differed by 30 % on such a
    host). Within a block the calls follow each other, as repeated calls in a user's program do."""
    counts = {name: _repeats_after_warmup(fn, repeats) for name, fn in fns.items()}
    rounds = max(1, min(counts.values()))
    times = {name: [] for name in fns}
    vals = {}
    for r in range(rounds):
        for name, fn in fns.items():
            for _ in range(counts[name] // rounds + (1 if r < counts[name] % rounds else 0)):
                t0 = time.perf_counter()
                vals[name] = fn()
                times[name].append(time.perf_counter() - t0)
    return {name: (vals.get(name), statistics.median(times[name]) if times[name] else float("nan"))
            for name in fns}


def cpu_name() -> str:
    """The processor's model name (/proc/cpuinfo), else what platform knows."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return cpu


def machine(counts=None) -> str:
    """The line a report starts with: processor, visible cores, torch version, thread count(s), load average."""
    cpu = cpu_name()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    threads = "/".join(map(str, counts)) if counts else str(torch.get_num_threads())
    return (f"{cpu}, {os.cpu_count()} cores visible, torch {torch.__version__} with {threads} "
            f"threads, load average {load:.1f} at start")
