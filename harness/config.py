"""Scales, dtypes, device resolution and thread ownership: defined once, used by the CLI, runner and tests."""
from __future__ import annotations

import os
from typing import Dict, NamedTuple, Optional, Tuple

SCALES = ("full", "quick", "test", "paper")  # paper: the papers' own sizes, where an experiment declares them
THREADS_ENV = "ATTNLIP_THREADS"


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: use {', '.join(SCALES)}")
    return scale


def check_dtype(dtype: str) -> str:
    """A run's dtype name, checked against harness.settings.DTYPES."""
    from harness import settings

    return settings.check_dtype(dtype)


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


def threads_problem(threads: Optional[int], workers: int = 1) -> Optional[Tuple[str, str]]:
    """(what is wrong, the fix) for --threads on `workers` processes of this machine, or None when it is fine: at
    least 1, and all their threads together not more than the available cores (oversubscribed threads only wait
    on each other)."""
    if threads is None:
        return None
    if threads < 1:
        return f"{threads} is not a thread count", "give a whole number >= 1"
    cores = available_cores()
    if threads * workers > cores:
        return (f"{threads} x {workers} worker(s) on {cores} available core(s) would only slow the run down",
                f"pass --threads {max(1, cores // workers)} or less (or fewer -j)")
    return None


def check_threads(threads: Optional[int], workers: int = 1) -> None:
    """ValueError naming threads_problem's fault and fix, if any."""
    problem = threads_problem(threads, workers)
    if problem:
        raise ValueError(f"--threads {problem[0]}; {problem[1]}")


# The seeds every generator the toolkit seeds accepts: torch's take 64-bit integers, numpy's Generator and the
# `datasets` shuffles non-negative ones; up to 2**63 - 1 leaves room for the offsets added to a run's seed
# (harness.context.Context.generator).
SEED_MAX = 2**63 - 1


def seed_problem(seed) -> Optional[Tuple[str, str]]:
    """(what is wrong, the fix) for --seed, or None when it is a whole number from 0 to SEED_MAX."""
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
        return f"{seed!r} is not a seed", f"give a whole number from 0 to {SEED_MAX} (2**63 - 1)"
    return None


def check_seed(seed) -> None:
    """ValueError naming seed_problem's fault and fix, if any."""
    problem = seed_problem(seed)
    if problem:
        raise ValueError(f"--seed {problem[0]}; {problem[1]}")


def _proc_stat() -> Optional[dict]:
    """{cpu index: (busy jiffies, total jiffies)} from /proc/stat's per-CPU lines; None where there is none."""
    try:
        text = open("/proc/stat").read()
    except OSError:
        return None
    out = {}
    for line in text.splitlines():
        if line.startswith("cpu") and line[3:4].isdigit():
            name, *vals = line.split()
            v = [int(x) for x in vals[:8]]
            idle = v[3] + (v[4] if len(v) > 4 else 0)  # idle + iowait
            out[int(name[3:])] = (sum(v) - idle, sum(v))
    return out or None


def busy_cores(interval: float = 0.1) -> Optional[float]:
    """How many of this process's cores other work keeps busy now: /proc/stat sampled twice, `interval` seconds
    apart, summed over the CPUs of the affinity mask. None where /proc/stat is unreadable (not Linux)."""
    import time

    a = _proc_stat()
    if a is None:
        return None
    time.sleep(interval)
    b = _proc_stat()
    if b is None:
        return None
    try:
        mine = os.sched_getaffinity(0)
    except (AttributeError, OSError):
        mine = set(b)
    busy = 0.0
    for cpu in mine:
        if cpu in a and cpu in b and b[cpu][1] > a[cpu][1]:
            busy += (b[cpu][0] - a[cpu][0]) / (b[cpu][1] - a[cpu][1])
    return busy


class ThreadChoice(NamedTuple):
    """A thread count and where it came from (for notes and manifests)."""
    count: int
    source: str  # "--threads" | "$ATTNLIP_THREADS" | "$OMP_NUM_THREADS" | "cpu sample" | "load average"
    detail: str = ""  # the measurement behind an automatic choice


def free_cores(cores: Optional[int] = None) -> int:
    """Cores not taken by other work now, at least 1 (see `free_cores_choice`)."""
    return free_cores_choice(cores).count


def free_cores_choice(cores: Optional[int] = None) -> ThreadChoice:
    """Cores not taken by other work now: the available cores minus the cores a live CPU sample (/proc/stat over
    0.1 s) finds busy, at least 1. The sample follows the load at once; the 1-minute load average, used only where
    there is no /proc/stat, lags behind a job that just ended (it still counts that job's cores for a minute)."""
    cores = cores or available_cores()
    busy = busy_cores()
    if busy is not None:
        return ThreadChoice(max(1, min(cores, int(cores - busy + 0.5))), "cpu sample",
                            f"{busy:.2f} of {cores} cores busy in a 0.1 s sample")
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return ThreadChoice(cores, "available cores", f"{cores} cores, no load measurement")
    return ThreadChoice(max(1, min(cores, int(cores - load + 0.5))), "load average",
                        f"1-minute load average {load:.2f} on {cores} cores")


def torch_already_loaded() -> bool:
    """Whether torch is imported in this process already (then its CPU code path is chosen, pinned or not)."""
    import sys

    return "torch" in sys.modules


def prefer_passive_wait() -> bool:
    """OMP_WAIT_POLICY=PASSIVE unless the user set a policy; only before torch is imported (libgomp reads it once,
    when torch loads it). Child processes (pool workers, Slurm jobs) inherit it. True when it is in effect."""
    if "OMP_WAIT_POLICY" not in os.environ and not torch_already_loaded():
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"


PORTABLE_ISA = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
NATIVE_ISA_ENV = "ATTNLIP_NATIVE_ISA"


def _has_avx2() -> bool:
    """Whether this is an x86-64 Linux CPU with AVX2 (from /proc/cpuinfo; False where that cannot be read)."""
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64") or not os.path.exists("/proc/cpuinfo"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.startswith("flags") and " avx2" in line for line in f)
    except OSError:
        return False


def portable_numerics() -> Dict[str, str]:
    """Pin torch's CPU kernels to their AVX2 code paths (ATen's dispatch, MKL, oneDNN: PORTABLE_ISA) on x86-64
    CPUs that have AVX2, so that results do not depend on whether the machine also has AVX-512; only before torch
    is imported (each library reads its variable once), unless $ATTNLIP_NATIVE_ISA=1. A variable the user set
    keeps the user's value. Child processes (pool workers, Slurm jobs) inherit the settings.

    Why: AVX-512 and AVX2 kernels round differently (other summation orders and vector widths), about 1e-7 in a
    float32 forward pass and 1e-4 after float32 training; results committed from an AVX2 machine then fail
    `run_all.py --verify` (tolerance 1e-9) on an AVX-512 one, and reproduce when both run the AVX2 paths. MKL is
    limited to AVX2 instructions (MKL_ENABLE_INSTRUCTIONS), not put in its reproducibility mode (MKL_CBWR, whose
    other algorithms changed results of LipViT training). NumPy's BLAS (ARPACK, LAPACK eigensolvers) is not
    pinned. Returns the variables in effect (manifests record them)."""
    if not torch_already_loaded() and os.environ.get(NATIVE_ISA_ENV, "") in ("", "0") and _has_avx2():
        for k, v in PORTABLE_ISA.items():
            os.environ.setdefault(k, v)
    return {k: os.environ[k] for k in PORTABLE_ISA if k in os.environ}


COMMITTED_CAPABILITY = "AVX2"  # torch's CPU code path of the committed results on x86-64 (portable_numerics)


def committed_kernels_differ() -> Optional[str]:
    """Why this process does not compute with the CPU kernels the committed results were computed with, or None
    when it does (or when that cannot differ: a CPU without AVX2, where nothing is pinned anywhere). Callers that
    recompute committed numbers in-process (the test suite) skip with this reason."""
    if not _has_avx2():
        return None
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    if cap == COMMITTED_CAPABILITY:
        return None
    how = (f"${NATIVE_ISA_ENV}=1" if os.environ.get(NATIVE_ISA_ENV, "") not in ("", "0") else
           f"ATEN_CPU_CAPABILITY={os.environ['ATEN_CPU_CAPABILITY']}" if "ATEN_CPU_CAPABILITY" in os.environ else
           "torch was imported before config.portable_numerics() ran")
    return (f"torch runs its {cap} CPU kernels here ({how}), the committed results were computed with "
            f"{COMMITTED_CAPABILITY}: their last bits differ; unset it to compare with committed numbers")


def thread_choice(threads: Optional[int] = None, jobs: int = 1) -> ThreadChoice:
    """torch threads per worker and where the count came from: `threads` (--threads), else $ATTNLIP_THREADS, else
    $OMP_NUM_THREADS, else the cores free now (free_cores_choice) shared by `jobs` workers, at least 1."""
    for source, count in (("--threads", threads), (f"${THREADS_ENV}", os.environ.get(THREADS_ENV)),
                          ("$OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "").split(",")[0] or None)):
        if count is None:
            continue
        try:
            ok = int(count) >= 1
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"threads must be a whole number >= 1, got {count!r} (from --threads, ${THREADS_ENV} "
                             f"or $OMP_NUM_THREADS)")
        return ThreadChoice(int(count), source)
    free = free_cores_choice()
    return ThreadChoice(max(1, free.count // max(1, int(jobs))), free.source, free.detail)


def thread_count(threads: Optional[int] = None, jobs: int = 1) -> int:
    """thread_choice(threads, jobs).count."""
    return thread_choice(threads, jobs).count


def init_threads(threads: Optional[int] = None, jobs: int = 1) -> int:
    """The thread policy of the entry points (run_all.py / attnlip, analyze, benchmarks): call it first, before
    torch is imported (measured in docs/notes/harness.md, "Threads"):
    - OpenMP threads wait passively (prefer_passive_wait): a thread spinning at a barrier while its partner is
      descheduled takes the core from the very thread it waits for, and from other jobs;
    - torch's intra-op count is thread_count(threads, jobs): on a machine whose cores are taken, fewer threads
      than cores, since a team of threads runs at the pace of its most descheduled member.
    Returns the count in effect (init_threads_choice: and where it came from)."""
    return init_threads_choice(threads, jobs).count


def init_threads_choice(threads: Optional[int] = None, jobs: int = 1) -> ThreadChoice:
    """init_threads, returning the ThreadChoice whose count is now in effect."""
    prefer_passive_wait()
    choice = thread_choice(threads, jobs)
    return choice._replace(count=apply_threads(choice.count))
