"""JaSMin App. C's sharper bound (harness.bounds.jasmin_appc): >= the dense float64 truth on random cases (biases,
causal mask, several scales), <= Theorem 3, and within the paper's O(sqrt(N)) form."""
import math

import pytest
import torch

from harness.bounds import jasmin
from harness.bounds.jasmin_appc import jasmin_appc
from harness.kernels import layer as L
from harness.kernels.attention import AttentionWeights


def _case(t):
    g = torch.Generator().manual_seed(t)
    n, dh, h = 2 + t % 7, 1 + t % 3, 1 + t % 2
    d = dh * h
    w = AttentionWeights.random(d, h, scale=0.2 + (t % 5), generator=g)
    if t % 3 == 0:
        b = lambda: torch.randn(h, w.dh, generator=g, dtype=torch.float64)  # noqa: E731
        w = AttentionWeights(w.wq, w.wk, w.wv, w.wo, b(), b(), b(), None)
    X = torch.randn(3, n, d, generator=g, dtype=torch.float64) * (0.1 + (t % 4) * 1.5)
    return X, w, bool(t % 2)


@pytest.mark.parametrize("t", range(120))
def test_appc_is_sound_and_sharper_than_thm3(t):
    X, w, causal = _case(t)
    for l in range(w.h):
        wl = w.head(l)
        truth = L.lipschitz(X, wl, causal, dense_max=10 ** 6).value  # explicit Jacobian + SVD
        b = jasmin_appc(X, wl, causal)[..., 0]
        assert bool((truth <= b * (1 + 1e-9)).all()), (truth, b)
        assert bool((b <= jasmin.bound(X, wl, causal=causal)[..., 0] * (1 + 1e-9)).all())


def test_appc_within_sqrt_n_form():
    g = torch.Generator().manual_seed(1)
    w = AttentionWeights.random(8, 2, scale=1.0, generator=g)
    for n in (4, 16, 64):
        X = torch.randn(2, n, 8, generator=g, dtype=torch.float64)
        X = X / X.norm(dim=-1, keepdim=True) * 1.5  # ||x_i|| = R = 1.5
        b = jasmin_appc(X, w)
        form = w.VO_norm() * math.sqrt(n) * (1 + 2 * 1.5 ** 2 * w.A_norm())
        assert bool((b <= form * (1 + 1e-9)).all())
