"""Weight-only quantities of every bound: ||A_l||, ||VO_l|| (all 12 heads) and Prop. 3.4's choice, from the
rank-dh factors vs the explicit d x d matrices, at GPT-2 / BERT-base size (d = 768, h = 12, float64).

Timed: `pytest benchmarks/bench_norms.py --benchmark-only`. As plain tests (`--benchmark-disable`) each case runs
once at d = 16 and checks the two routes agree.
"""
from __future__ import annotations

import pytest
import torch

from harness.bounds.castin import prop34_choice
from harness.kernels.attention import AttentionWeights

SIZES = {"gpt2": (768, 12), "tiny": (16, 4)}  # (d, h)


def _weights(benchmark) -> AttentionWeights:
    d, h = SIZES["tiny" if benchmark.disabled else "gpt2"]
    g = torch.Generator().manual_seed(0)
    return AttentionWeights.random(d, h, scale=1.0, dtype=torch.float64, generator=g)


def _norms(w: AttentionWeights, route: str) -> torch.Tensor:
    if route == "factors":
        return torch.stack([w.A_norm(), w.VO_norm()])
    return torch.stack([torch.linalg.matrix_norm(w.A(), ord=2), torch.linalg.matrix_norm(w.VO(), ord=2)])


@pytest.mark.parametrize("route", ["factors", "dense"])
def test_bench_head_norms(benchmark, route):
    w = _weights(benchmark)
    out = benchmark.pedantic(lambda: _norms(w, route), rounds=1 if benchmark.disabled else 3, iterations=1)
    assert torch.allclose(out, _norms(w, "dense" if route == "factors" else "factors"), rtol=1e-10)


@pytest.mark.parametrize("route", ["factors", "dense"])
def test_bench_prop34_choice(benchmark, route):
    w = _weights(benchmark)
    out = benchmark.pedantic(lambda: prop34_choice(w, method=route), rounds=1, iterations=1)
    other = prop34_choice(w, method="dense" if route == "factors" else "factors")
    for a, b in zip(out, other):
        assert (a is None) == (b is None)
        if a is not None:
            assert abs(float(a["gamma"] - b["gamma"])) <= 1e-8 * max(1.0, abs(float(a["gamma"])))
