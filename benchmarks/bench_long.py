"""`python -m benchmarks.report --part long`: the certified exact local constant of a Llama-2-7B-size attention
layer (d = 4096, 32 heads, RoPE theta 1e4, causal, random init std 0.02, X standard normal like an RMSNorm output)
at long n, by kernels.layer.truth with certify=dict(steps=24, fail_prob=1e-9), float64 inputs, under an 8 GiB
memory plan (kernels.route.set_memory_cap).

Each size runs in a fresh child process (its peak RSS: ru_maxrss); the child measures the float64 and float32 GEMM
rates just before its truth, so "products at the GEMM rate" (products x kernels.route.product_flops / rate, each
phase at its dtype's rate) is measured beside the run it is compared with. Then the n = 1024 truth through the
materialised route (forced) against the streamed one (every size's row runs the streamed route, forced, so
the rows and the fit describe one route), and the linear fit of peak memory in n. Progress (products
done / expected, elapsed, estimated time left) goes to stderr.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

import torch

D, HEADS, THETA, STD = 4096, 32, 1e4, 0.02
CERT = dict(steps=24, fail_prob=1e-9)
CAP_GIB = 8
EXPECTED_EXTRA = 6  # products beyond the certificate's steps a run usually needs (for the progress estimate)


def layer_case(n: int, seed: int = 0):
    from harness.kernels.attention import AttentionWeights
    from harness.kernels.streamed import rope_tables

    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(D, HEADS, scale=STD * D ** 0.5, generator=g)
    X = torch.randn(n, D, dtype=torch.float64, generator=g)
    return X, w, rope_tables(n, D // HEADS, THETA)


def gemm_rate(dtype, size: int = 2048, reps: int = 3) -> float:
    """Best of `reps` square GEMMs, flop/s."""
    A = torch.randn(size, size, dtype=dtype)
    A @ A
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        A @ A
        best = min(best, time.perf_counter() - t)
    return 2.0 * size ** 3 / best


def _progress(fn, n: int, t0: float, counter: list):
    """fn counted as one product per call, with a progress line on stderr."""
    expected = CERT["steps"] + EXPECTED_EXTRA

    def wrapped(U):
        out = fn(U)
        counter[0] += 1
        el = time.perf_counter() - t0
        left = max(expected - counter[0], 0) * el / counter[0]
        print(f"[long n={n}] product {counter[0]} / ~{expected}, {el:.0f} s, ~{left:.0f} s left", file=sys.stderr,
              flush=True)
        return out
    return wrapped


def job(n: int, route: str) -> dict:
    """One certified truth in this process (the child): numbers, times, peak RSS."""
    from harness.kernels import layer, route as R

    R.set_memory_cap(CAP_GIB * 2**30)
    rates = {"float64": gemm_rate(torch.float64), "float32": gemm_rate(torch.float32)}
    X, w, rope = layer_case(n)
    counter, t0 = [0], time.perf_counter()
    real = layer.streamed_operator, layer.layer_operator
    wrap = lambda f: (lambda *a, **k: tuple(_progress(m, n, t0, counter) if i == 0 else m
                                            for i, m in enumerate(f(*a, **k))))
    layer.streamed_operator, layer.layer_operator = wrap(real[0]), wrap(real[1])
    try:
        r = layer.truth(X, w, causal=True, certify=CERT, route=route, rope=rope)
    finally:
        layer.streamed_operator, layer.layer_operator = real
    wall = time.perf_counter() - t0
    p32 = int(r.info.get("products32", 0))
    p64 = int(r.iters) - p32
    flops = R.product_flops(n, D, D, causal=True)
    at_rate = p64 * flops / rates["float64"] + p32 * flops / rates["float32"]
    return dict(n=n, route=r.info["route"], basis=r.info["basis"], value=float(r.value), upper=float(r.upper),
                converged=bool(r.converged), products64=p64, products32=p32, wall=wall, at_rate=at_rate,
                gemm64=rates["float64"], gemm32=rates["float32"], flops=flops,
                peak_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def probe(n: int, dtype_name: str) -> dict:
    """One streamed Gram product (jvp then vjp) at n in `dtype_name`, in this process (the child): the setup and
    product times, the flop rate of the product, peak RSS (the operator's state and one product's temporaries;
    the basis comes on top, kernels.route.basis_plan's vectors x their bytes)."""
    from harness.kernels import route as R
    from harness.kernels.streamed import streamed_operator

    dt = getattr(torch, dtype_name)
    rate = gemm_rate(dt)
    X, w, rope = layer_case(n)
    X, w, rope = X.to(dt), w.to(dtype=dt), tuple(t.to(dt) for t in rope)
    t0 = time.perf_counter()
    mv, rmv = streamed_operator(X, w, True, rope)
    setup = time.perf_counter() - t0
    U = torch.randn(X.shape, dtype=dt)
    t0 = time.perf_counter()
    rmv(mv(U))
    prod = time.perf_counter() - t0
    f = R.product_flops(n, D, D, causal=True)
    return dict(n=n, dtype=dtype_name, setup=setup, product=prod, flops=f, rate=f / prod, gemm=rate,
                peak_gib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20)


def run_child(n: int, route: str, threads: int, timeout: float):
    cmd = [sys.executable, "-m", "benchmarks.report", "--long-job", str(n), route, "--threads", str(threads)]
    try:
        r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None
    try:
        return json.loads(r.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return None


def long_report(sizes, threads: int, timeout: float, compare: bool = True) -> str:
    from harness.kernels.route import product_flops

    lines = ["| n | route | basis | products (f64 + f32) | wall (s) | products at GEMM rate (s) | ratio | "
             "GEMM f64 / f32 (GFLOP/s) | peak RSS (GiB) | value | certified upper |", "|" + "---|" * 11]
    done = []
    for n in sizes:
        r = run_child(n, "streamed", threads, timeout)
        if r is None:
            lines.append(f"| {n} | did not finish within {timeout:.0f} s (est. {product_flops(n, D, D, True):.2e} "
                         f"flop per product) |" + " |" * 9)
            continue
        done.append(r)
        lines.append(f"| {n} | {r['route']} | {r['basis']} | {r['products64']} + {r['products32']} | "
                     f"{r['wall']:.0f} | {r['at_rate']:.0f} | {r['wall'] / r['at_rate']:.2f} | "
                     f"{r['gemm64'] / 1e9:.0f} / {r['gemm32'] / 1e9:.0f} | {r['peak_gib']:.2f} | "
                     f"{r['value']:.10g} | {r['upper']:.6g} |")
    out = ["\n".join(lines)]
    if len(done) >= 2:
        import numpy as np

        ns, pk = np.array([r["n"] for r in done], float), np.array([r["peak_gib"] for r in done])
        a, b = np.polyfit(ns, pk, 1)
        res = np.abs(pk - (a * ns + b)).max()
        out.append(f"Peak RSS fit: {b:.3f} GiB + {a * 1024:.3f} GiB per 1024 tokens (largest residual {res:.3f} GiB)")
    if compare:
        s = next((r for r in done if r["n"] == 1024), None) or run_child(1024, "streamed", threads, timeout)
        m = run_child(1024, "materialised", threads, timeout)
        if m and s:
            rel = lambda k: abs(m[k] - s[k]) / abs(m[k])
            out.append(f"n = 1024, materialised vs streamed: value {m['value']:.15g} vs {s['value']:.15g} "
                       f"(rel. diff {rel('value'):.1e}), upper rel. diff {rel('upper'):.1e}; wall {m['wall']:.0f} s "
                       f"vs {s['wall']:.0f} s, peak {m['peak_gib']:.2f} vs {s['peak_gib']:.2f} GiB")
        else:
            out.append("n = 1024 comparison did not finish")
    return "\n\n".join(out)


def estimate_report(sizes, threads: int) -> str:
    """--estimate: memory and time of each size's truth before computing anything: the route, the basis plan under
    the 8 GiB cap (kernels.route.basis_plan with the operator's planned state), the flops per product and the
    time of steps + EXPECTED_EXTRA products at the GEMM rates measured now."""
    from harness.kernels import route as R

    rates = {"float64": gemm_rate(torch.float64), "float32": gemm_rate(torch.float32)}
    lines = [f"GEMM rate now: {rates['float64'] / 1e9:.0f} (float64) / {rates['float32'] / 1e9:.0f} (float32) "
             f"GFLOP/s on {threads} threads; plans under a {CAP_GIB} GiB cap\n",
             "| n | products route | basis plan | operator state (GiB) | basis (GiB) | flop / product | "
             "expected products | estimated time (s) |", "|" + "---|" * 8]
    for n in sizes:
        p = R.plan_truth(n, D, HEADS, CERT["steps"], CAP_GIB * 2**30)
        if p["plan"] is None:
            lines.append(f"| {n} | {p['route']} | does not fit: {p['why']} |" + " |" * 5)
            continue
        f, k, plan = p["flops"], CERT["steps"] + EXPECTED_EXTRA, p["plan"]
        if plan.krylov32:
            t = CERT["steps"] * f / rates["float32"] + EXPECTED_EXTRA * f / rates["float64"]
        else:
            t = k * f / rates["float64"]
        lines.append(f"| {n} | {p['route']} | {plan.describe()} | {p['state_bytes'] / 2**30:.2f} | "
                     f"{p['basis_bytes'] / 2**30:.2f} | {f:.2e} | {k} | {t:.0f} |")
    return "\n".join(lines)


def probe_report(sizes, threads: int, timeout: float) -> str:
    """--probe: one streamed Gram product per size and dtype, each in a child (see `probe`)."""
    lines = ["| n | dtype | setup (s) | one Gram product (s) | product GFLOP/s | GEMM GFLOP/s | product / GEMM time | "
             "peak RSS (GiB) |", "|" + "---|" * 8]
    for n in sizes:
        for dt in ("float32", "float64"):
            r = run_child(n, "probe-" + dt, threads, timeout)
            if r is None:
                lines.append(f"| {n} | {dt} | did not finish within {timeout:.0f} s |" + " |" * 5)
                continue
            lines.append(f"| {n} | {dt} | {r['setup']:.0f} | {r['product']:.0f} | {r['rate'] / 1e9:.1f} | "
                         f"{r['gemm'] / 1e9:.1f} | {r['gemm'] / r['rate']:.2f} | {r['peak_gib']:.2f} |")
    return "\n".join(lines)


def part(sizes: str, quick: bool, estimate: bool, probe_only: bool, threads: int, timeout: float,
         compare: bool) -> str:
    """The long part as `benchmarks.report --part long` runs it (sizes: comma-separated n, None: the default)."""
    default = "256" if quick else ("4096,8192" if probe_only else "1024,2048,4096,8192")
    ns = [int(x) for x in (sizes or default).split(",")]  # checked by benchmarks.report's argument parser
    if estimate:
        return estimate_report(ns, threads)
    if probe_only:
        return probe_report(ns, threads, timeout)
    return long_report(ns, threads, timeout, compare and not quick)


def main_job(n: int, route: str) -> None:
    if route.startswith("probe-"):
        print(json.dumps(probe(n, route[len("probe-"):])))
        return
    print(json.dumps(job(n, route)))


if __name__ == "__main__":  # pragma: no cover
    main_job(int(sys.argv[1]), sys.argv[2])
