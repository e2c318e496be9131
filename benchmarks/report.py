"""One-shot LoFAST benchmark report: `python -m benchmarks.report [--threads 2] [--quick]` prints a markdown table.

Times are medians of wall-clock repeats (time.perf_counter); peak memory is the increase of the process RSS
over its value before the call, polled every 2 ms by a thread (psutil), so it counts torch's CPU allocations
(tracemalloc would not see them). Each measurement starts after a warm-up call of the same function
(except the dense SVDs and the Jacobian runs, measured once).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time

import torch

from benchmarks.bench_lofast import (JAC_BATCH, JAC_ITERS, SIZES, case, dense_m_bytes, dense_m_norms, dense_zeta,
                                     jac_batched, jac_loop, peak_rss_mb, svds_m_norms, svds_zeta)
from harness.bounds import lofast as L


def measure(fn, repeats: int, warmup: bool):
    """(value, median seconds, peak RSS MB of the first timed call)."""
    if warmup:
        fn()
    times, mb, val = [], None, None
    for r in range(repeats):
        t0 = time.perf_counter()
        if r == 0:
            val, mb = peak_rss_mb(fn)
        else:
            val = fn()
        times.append(time.perf_counter() - t0)
    return val, statistics.median(times), mb


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{cpu}, {os.cpu_count()} cores visible, torch {torch.__version__} with {torch.get_num_threads()} "
            f"threads, load average {load:.1f} at start")


def rows_small(scale: str, repeats: int):
    X, w = case(scale)  # float64
    n, d, h = SIZES[scale]
    out = []
    for name, ours, dense, svds in (("||M_l|| all heads", lambda: L.m_norms(X, w), lambda: dense_m_norms(X, w),
                                     lambda: svds_m_norms(X, w)),
                                    ("zeta", lambda: L.zeta(X, w), lambda: dense_zeta(X, w), lambda: svds_zeta(X, w))):
        v0, t0, m0 = measure(ours, repeats, True)
        vd, td, md = measure(dense, 1, False)
        vs, ts, ms = measure(svds, repeats, True)
        err = lambda v: float(((v - vd).abs() / vd).max())
        tag = f"n={n} d={d} h={h} f64"
        out += [(tag, name, "matrix-free (ours, Lanczos)", t0, "1", m0, f"{err(v0):.1e}"),
                (tag, name, "dense explicit matrix + SVD", td, f"{td / t0:.0f}x", md, "ref"),
                (tag, name, "scipy svds on LinearOperator", ts, f"{ts / t0:.1f}x", ms, f"{err(vs):.1e}")]
    return out


def rows_large(scale: str, repeats: int):
    X, w = case(scale, dtype=torch.float32)
    n, d, h = SIZES[scale]
    tag = f"{scale} n={n} d={d} h={h} f32"
    out = []
    for name, fn in (("||M_l|| all heads", lambda: L.m_norms(X, w)), ("zeta", lambda: L.zeta(X, w))):
        _, t, mb = measure(fn, repeats, True)
        out.append((tag, name, "matrix-free (ours, Lanczos)", t, "-", mb, "-"))
    out.append((tag, "dense M_l (one head)", "not run: memory", float("nan"), "-",
                dense_m_bytes(n, d) / 2**20, "-"))
    Xb, _ = case(scale, dtype=torch.float32, batch=(JAC_BATCH,))
    vb, tb, mb = measure(lambda: jac_batched(Xb, w), 1, False)
    vl, tl, ml = measure(lambda: jac_loop(Xb, w), 1, False)
    name = f"jacobian_norm x{JAC_BATCH} ({JAC_ITERS} Lanczos steps)"
    out += [(tag, name, "batched", tb, "1", mb, "-"),
            (tag, name, "Python loop", tl, f"{tl / tb:.1f}x", ml, f"{float(((vl - vb).abs() / vb).max()):.0e}")]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="tiny sizes only (smoke run)")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    print(f"Machine: {machine()}\n")
    rows = rows_small("tiny" if a.quick else "dense", a.repeats)
    for scale in (("tiny",) if a.quick else ("vitb", "minilm")):
        rows += rows_large(scale, 1 if not a.quick else a.repeats)
    print("| size | quantity | method | median time (s) | time / ours | peak RSS increase (MB) | rel. err vs dense |")
    print("|---|---|---|---|---|---|---|")
    for tag, name, meth, t, ratio, mb, err in rows:
        ts = "-" if t != t else f"{t:.3g}"
        print(f"| {tag} | {name} | {meth} | {ts} | {ratio} | {mb:.0f} | {err} |")


if __name__ == "__main__":
    main()
