"""Process-wide memory setting of `attnlip analyze`, the benchmark reports and the experiment runner's cells.

glibc's malloc serves every block above its mmap threshold (128 KiB at start; it rises with freed blocks, up to
32 MiB) with a fresh mapping that `free` unmaps, and trims the heap top beyond its trim threshold (128 KiB, twice
the mmap threshold once that has risen). A kernel that allocates and frees tensors of a few MB at every step (a
Lanczos vector of BERT-base at n = 512 is 3 MB, its n x n x heads scores 25 MB) then takes a page fault per 4 KiB
page each time it reuses that memory: 2.1-2.5 million faults and 4-5 s of system time for one BERT-base layer at
n = 512. `retain_freed_memory` keeps freed blocks of up to 32 MiB (the largest threshold glibc accepts) in the
process for reuse and stops trimming: 0.3 million faults, that layer 20.1 -> 18.0 s of wall on 2 threads, all 12
layers 200.6 -> 163.8 s (docs/notes/harness.md, "Memory"). Values are unchanged (allocation does not change
arithmetic). The cost is memory: the resident size keeps its high-water mark until the process ends, and the peak
can rise (BERT-base: 1.64 -> 1.87 GB), since freed blocks are reused rather than returned.

The experiment runner's worker (harness.run.worker) sets it before every cell and gives the freed memory back to the
system after the cell (`release_freed_memory`, glibc's malloc_trim), so a cell reuses its own freed blocks while
each cell's peak RSS (cell metadata, the memory-budget warning) is still its own, not an earlier cell's high-water
mark. The kernels keep their Lanczos basis themselves (harness.kernels.lanczos_steps.basis_buffer, one buffer
per thread of up to 256 MiB, so bases above 32 MiB are not mapped afresh either), and `release_freed_memory` drops
the calling thread's buffer too. Python callers may call both themselves. A user's own MALLOC_MMAP_THRESHOLD_ /
MALLOC_TRIM_THRESHOLD_ or glibc.malloc tunables win; other C libraries (musl, macOS) are left alone."""
from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 * 2 ** 20  # glibc's maximum (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = 2 ** 31 - 1  # mallopt takes an int: never trim below 2 GiB of free heap top
USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def _glibc(name: str):
    """The function `name` of glibc, or None under another C library."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  (glibc only)
        return getattr(libc, name)
    except (OSError, AttributeError):
        return None


def _mallopt():
    """glibc's mallopt, or None under another C library."""
    mallopt = _glibc("mallopt")
    if mallopt is not None:
        mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt


def user_allocator_settings() -> bool:
    """True when the environment already tunes glibc's malloc (its variables or glibc.malloc tunables)."""
    return any(k in os.environ for k in USER_SETTINGS) or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", "")


def retain_freed_memory() -> bool:
    """Keep freed blocks up to 32 MiB mapped for reuse in this process (see module docstring). True when this call
    set both thresholds; False where the user tunes malloc, the C library is not glibc, or glibc refused."""
    mallopt = None if user_allocator_settings() else _mallopt()
    if mallopt is None:
        return False
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1


def release_freed_memory() -> bool:
    """Give the memory freed so far back to the system (glibc's malloc_trim(0): free heap pages, top and middle),
    after dropping the Lanczos basis buffer the kernels keep between calls where they are loaded. True where
    malloc_trim ran; False under another C library."""
    steps = sys.modules.get("harness.kernels.lanczos_steps")  # never imported here: this module loads before torch
    if steps is not None:
        steps.release_workspace()
    trim = _glibc("malloc_trim")
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
