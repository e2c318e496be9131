"""Castin benchmarks: ||J_F(X)|| of one multi-head layer for 10 sequences, batched vs one by one, analytic
operator vs torch.func jvp/vjp, Lanczos vs power iteration, warm vs cold starts across neighbouring n.

Timed: `pytest benchmarks/bench_castin.py --benchmark-only` (MiniLM-size layer d = 384, h = 12, n = 32,
10 sequences, float32, tol 1e-4). As plain tests (`--benchmark-disable`) every case runs once at a tiny size.
`python -m benchmarks.bench_castin` prints iterations-to-converge on real MiniLM inputs (needs shared data).
"""
from __future__ import annotations

import time

import pytest
import torch

from harness.kernels import layer as L
from harness.kernels.attention import AttentionWeights
from harness.kernels.power import jacobian_norm

SIZES = {"minilm": (10, 32, 384, 12), "tiny": (3, 6, 8, 2)}  # (B, n, d, h)


def _case(benchmark, dtype=torch.float32, seed=0):
    scale = "tiny" if benchmark.disabled else "minilm"
    B, n, d, h = SIZES[scale]
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, scale=3.0, dtype=dtype, generator=g, bias=True)
    X = torch.randn(B, n, d, dtype=dtype, generator=g) * 0.5
    return X, w


def batched(X, w, method="lanczos"):
    return L.lipschitz(X, w, tol=1e-4, method=method, iters=3000)


def one_by_one(X, w):
    return torch.stack([L.lipschitz(X[i:i + 1], w, tol=1e-4).value[0] for i in range(X.shape[0])])


def torch_func(X, w):
    return jacobian_norm(L.layer_map(w), X, tol=1e-4, iters=3000, on_nonconvergence="ignore")


@pytest.mark.parametrize("variant", ["batched", "one_by_one", "torch_func", "batched_power"])
def test_bench_castin_layer_norm(benchmark, variant):
    X, w = _case(benchmark)
    fn = {"batched": lambda: batched(X, w).value, "one_by_one": lambda: one_by_one(X, w),
          "torch_func": lambda: torch_func(X, w), "batched_power": lambda: batched(X, w, "power").value}[variant]
    out = benchmark.pedantic(fn, rounds=1 if benchmark.disabled else 2, iterations=1)
    res = batched(X, w, "power" if variant == "batched_power" else "lanczos")
    benchmark.extra_info.update(iters=res.iters)
    assert torch.allclose(out, res.value, rtol=1e-3)


def iterations_report(ns=range(2, 65, 2), count=10, layer=-1):
    """Markdown: J^T J products to converge (tol 1e-4, float32) on real MiniLM inputs, cold vs warm start,
    Lanczos vs power; and CPU seconds batched vs one by one at the largest n."""
    torch.set_num_threads(1)
    from harness.models import text

    cold_l = warm_l = cold_p = 0
    prev = None
    for n in ns:
        lay = text.layer_inputs("minilm", "alice", [layer], n, count, chunk_seed=n, dtype=torch.float32)[layer]
        X, w = lay.X, lay.w
        r_c = L.lipschitz(X, w, tol=1e-4)
        r_w = L.lipschitz(X, w, tol=1e-4, v0=L.warm_start(prev, X.shape, seed=n, dtype=torch.float32))
        r_p = L.lipschitz(X, w, tol=1e-4, method="power", iters=3000)
        prev = r_c.vector
        cold_l, warm_l, cold_p = cold_l + r_c.iters, warm_l + r_w.iters, cold_p + r_p.iters
    t = time.process_time()
    L.lipschitz(X, w, tol=1e-4)
    tb = time.process_time() - t
    t = time.process_time()
    one_by_one(X, w)
    tl = time.process_time() - t
    return (f"| MiniLM layer {layer}, n = {min(ns)}..{max(ns)}, {count} Alice sequences per n | total J^T J products |\n"
            f"|---|---|\n| Lanczos, cold start | {cold_l} |\n| Lanczos, warm start from the previous n | {warm_l} |\n"
            f"| power iteration, cold | {cold_p} |\n\nAt n = {max(ns)}: batched {tb:.2f} CPU s vs one by one "
            f"{tl:.2f} CPU s for {count} sequences.")


if __name__ == "__main__":
    print(iterations_report())
