"""Where the zeta time goes (`python -m benchmarks.report --part floor` / `--part peak`): ours against our operator's
products alone (float64 and float32), ARPACK, the float64 GEMM floor of our products and the ratios to ARPACK those
products allow; and the machine's GEMM rate
(docs/notes/kernels.md, "Where the time goes")."""
from __future__ import annotations

import sys
import time

import torch

from benchmarks.timing import measure
from harness.bounds import lofast as L


def peak_report() -> str:
    """float64/float32 GEMM rate of this machine (torch matmul, 2048^2) and the implied floor for zeta at ViT-B."""
    lines = ["| dtype | GEMM GFLOP/s (2048 x 2048) | zeta ViT-B floor (s), 45 products x 1.05 GFLOP |",
             "|---|---|---|"]
    for dt in (torch.float64, torch.float32):
        rate = gemm_rate(dt)
        floor = 45 * zeta_flops(197, 768) / (rate * 1e9)
        lines.append(f"| {str(dt).replace('torch.', '')} | {rate:.1f} | {floor:.2f} |")
    return "\n".join(lines)


def zeta_flops(n: int, d: int) -> int:
    """FLOPs of one Gram product of the Lemma 1 operator (matvec + adjoint: 4 n d^2 + 2 n^2 d multiply-adds)."""
    return 2 * (4 * n * d * d + 2 * n * n * d)


def gemm_rate(dt) -> float:
    """GFLOP/s of torch matmul on 2048 x 2048 matrices of dtype dt (median of 5, after a warm-up)."""
    a, b = torch.randn(2048, 2048, dtype=dt), torch.randn(2048, 2048, dtype=dt)
    _, t = measure(lambda: a @ b, 5, True)
    return 2 * 2048 ** 3 / t / 1e9


def floor_report(sizes, repeats: int) -> str:
    """What bounds our zeta time from below where the zeta targets are not met (docs/notes/kernels.md).

    Per size, in one run: ours end to end (`lofast.zeta`, tol 1e-8) and its Gram products; the same number of
    products of our operator alone (`ZetaGram.gram` under inference mode, no solver; for a batch, k products of the
    whole batch scaled to the products its inputs took), in float64 and in float32;
    ARPACK end to end and its Gram products (rmatvec calls), with the time spent inside its numpy operator; and the
    float64 GEMM floor of our products (multiply-adds per product / this machine's 2048^2 GEMM rate). The last two
    columns are the most any solver spending our number of products could reach against ARPACK: ARPACK's time over
    our operator's alone, in float64 and with every product in float32 (a float64 result needs some float64
    products on top: docs/notes/kernels.md, "Mixed precision"). A speed target above them cannot be met with these
    products on this machine. At n = 32 ours runs the NumPy solver (harness.kernels.small), with its own products of
    the same arithmetic; a batch size (`batch`) runs every input's operator in one batch, ARPACK input by input."""
    from benchmarks.cases import SIZES as KS, arpack_zeta, case as kcase
    from harness.bounds.lofast_ops import prepare, stable_probs
    from harness.kernels.operators import ZetaGram

    rate = gemm_rate(torch.float64)
    lines = [f"float64 GEMM rate (2048^2 torch matmul): {rate:.1f} GFLOP/s", "",
             "| size | ours (ms) | our products | our operator alone (ms) | same, float32 (ms) | ARPACK (ms) | "
             "ARPACK products | ARPACK operator (ms) | GEMM floor of our products (ms) | ARPACK / our operator | "
             "ARPACK / our float32 operator |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for size in sizes:
        X, w = kcase(size)
        n, d, h = KS[size]
        B = X[..., 0, 0].numel()
        (z, info), t_ours = measure(lambda: L.zeta(X, w, tol=1e-8, return_info=True), repeats, True)
        k = int(info.zeta.iters)
        wp = prepare(X, w)
        op = ZetaGram(stable_probs(X, wp).reshape(B, h, n, n), wp.wv, wp.wo, True)
        total = float(info.zeta.steps.sum())  # products over the inputs: deflation drops converged ones
        t_op, share = {}, total / (k * B)
        for dt in (torch.float64, torch.float32):
            o, v = op.to(dt), torch.randn(B, n * d, dtype=dt)

            def products(o=o, v=v):
                with torch.inference_mode():
                    for _ in range(k):
                        o.gram(v)
            t_op[dt] = measure(products, repeats, True)[1] * share  # a batch: the products its inputs took
        runs = []
        for _ in range(repeats + 1):  # the first is the warm-up
            calls = []
            t0 = time.perf_counter()
            za = arpack_zeta(X, w, calls=calls)
            n_rmv = sum(c[0] == "rmv" for c in calls)  # a Gram product: matvec + rmatvec (svds adds a matvec)
            runs.append((time.perf_counter() - t0, n_rmv, sum(c[1] for c in calls)))
        runs = sorted(runs[1:])
        t_a, k_a, t_aop = runs[len(runs) // 2]
        ms = lambda t: f"{1e3 * t:.3g}"
        label = f"n={n} d={d} h={h}" + (f", {B} inputs" if X.dim() > 2 else "")
        lines.append(f"| {label} | {ms(t_ours)} | {k} | {ms(t_op[torch.float64])} | {ms(t_op[torch.float32])} | "
                     f"{ms(t_a)} | {k_a / B:.0f} per input | {ms(t_aop)} | "
                     f"{ms(total * zeta_flops(n, d) / (rate * 1e9))} | "
                     f"{t_a / t_op[torch.float64]:.1f}x | {t_a / t_op[torch.float32]:.1f}x |")
        print(lines[-1], file=sys.stderr, flush=True)
        if not float(((z - za).abs() / za).max()) <= 1e-6:
            raise RuntimeError(f"zeta at {size}: ours and ARPACK disagree beyond 1e-6 (ours {z.flatten()[:3]}, "
                               f"ARPACK {za.flatten()[:3]})")
    return "\n".join(lines)
