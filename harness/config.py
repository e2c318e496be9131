"""Scales, dtypes, device resolution and thread ownership: defined once, used by the CLI, runner and tests."""
from __future__ import annotations

import os
from typing import Optional

SCALES = ("full", "quick", "test", "paper")  # paper: the papers' own sizes, where an experiment declares them
DTYPES = ("float64", "float32", "float16", "bfloat16")
THREADS_ENV = "ATTNLIP_THREADS"


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: use {', '.join(SCALES)}")
    return scale


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use {', '.join(DTYPES)}")
    return dtype


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when available else 'cpu'; 'cuda' without a GPU -> ValueError."""
    device = str(device)
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ValueError(f"unknown device {device!r}: use cpu, cuda, cuda:N or auto")
    if device == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda" if device == "auto" else device
    if device == "auto":
        return "cpu"
    raise ValueError(f"device {device!r} requested but torch.cuda.is_available() is False")


def device_kind(device: str) -> str:
    """'cuda:1' -> 'cuda': results depend on the kind of device, not on which one."""
    return str(device).split(":")[0]


def apply_threads(threads: Optional[int]) -> int:
    """The one place that sets torch's intra-op thread count (runner and workers call it; experiments never do).

    threads None: $ATTNLIP_THREADS if set, else torch's default. Returns the count in effect."""
    import torch

    if threads is None:
        env = os.environ.get(THREADS_ENV)
        threads = int(env) if env else None
    if threads is not None:
        if int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity, which a container or `taskset` narrows), else cpu_count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def free_cores(cores: Optional[int] = None) -> int:
    """Cores not taken by other work now: the available cores minus the 1-minute load average, at least 1."""
    cores = cores or available_cores()
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return cores
    return max(1, min(cores, int(cores - load + 0.5)))


def prefer_passive_wait() -> bool:
    """OMP_WAIT_POLICY=PASSIVE unless the user set a policy; only before torch is imported (libgomp reads it once,
    when torch loads it). Child processes (pool workers, Slurm jobs) inherit it. True when it is in effect."""
    import sys

    if "OMP_WAIT_POLICY" not in os.environ and "torch" not in sys.modules:
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"


def thread_count(threads: Optional[int] = None, jobs: int = 1) -> int:
    """torch threads per worker: `threads` (--threads), else $ATTNLIP_THREADS, else $OMP_NUM_THREADS, else the
    cores free now (available cores minus the load average) shared by `jobs` workers, at least 1."""
    count = threads if threads is not None else (os.environ.get(THREADS_ENV) or
                                                 os.environ.get("OMP_NUM_THREADS", "").split(",")[0] or None)
    if count is None:
        return max(1, free_cores() // max(1, int(jobs)))
    try:
        ok = int(count) >= 1
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"threads must be a whole number >= 1, got {count!r} (from --threads, ${THREADS_ENV} or "
                         f"$OMP_NUM_THREADS)")
    return int(count)


def init_threads(threads: Optional[int] = None, jobs: int = 1) -> int:
    """The thread policy of the entry points (run_all.py / attnlip, analyze, benchmarks): call it first, before
    torch is imported (measured in docs/notes/harness.md, "Threads"):
    - OpenMP threads wait passively (prefer_passive_wait): a thread spinning at a barrier while its partner is
      descheduled takes the core from the very thread it waits for, and from other jobs;
    - torch's intra-op count is thread_count(threads, jobs): on a machine whose cores are taken, fewer threads
      than cores, since a team of threads runs at the pace of its most descheduled member.
    Returns the count in effect."""
    prefer_passive_wait()
    return apply_threads(thread_count(threads, jobs))
