"""Process-wide memory setting of the entry points (`run_all.py`, `attnlip`, the benchmarks).

glibc's malloc serves every block above its mmap threshold (128 KiB at start; it rises with freed blocks, up to
32 MiB) with a fresh mapping that `free` unmaps, and trims the heap top beyond its trim threshold. A kernel that
allocates and frees tensors of a few MB at every step (a Lanczos vector of BERT-base at n = 512 is 3 MB, its
n x n x heads scores 25 MB) then takes a page fault per 4 KiB page each time it reuses that memory: 2.1-2.5 million
faults for one BERT-base layer at n = 512 (`attnlip analyze --layers 0`), 3-5 s of system time.
`retain_freed_memory` keeps freed blocks of up to 32 MiB (the largest threshold glibc accepts) in the process for
reuse and stops trimming: 0.3 million faults, the same analysis 20.1 -> 18.0 s of wall on 2 threads (docs/notes/
harness.md, "Memory"). Allocations are unchanged, so values and peak memory are too; the resident size no longer
shrinks after a peak until the process ends.

It sets both the allocator of this process (`mallopt`) and the environment variables with the same meaning, so
pool workers (spawned) and Slurm jobs start with it. A user's own MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_
wins; other C libraries (musl, macOS) are left alone."""
from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2 ** 20  # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 2 ** 31 - 1  # mallopt takes an int: never trim below 2 GiB of free heap top
ENV = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD)}


def retain_freed_memory() -> bool:
    """Keep freed blocks up to 32 MiB mapped for reuse (see module docstring). True when in effect for this process
    and its children; False where the user set either variable or the C library is not glibc."""
    if any(k in os.environ for k in ENV) or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt, gnu = libc.mallopt, libc.gnu_get_libc_version  # glibc only
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    del gnu
    if mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) != 1 or mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) != 1:
        return False
    os.environ.update(ENV)
    return True
