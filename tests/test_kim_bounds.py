"""Kim / Specformer bound (JaSMin Thm 1): an upper bound wherever our validity condition holds."""
import math

import pytest
import torch

from harness.bounds import castin, jasmin, kim
from harness.kernels.attention import AttentionWeights

DT = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("causal", [False, True])
def test_kim_bound_ge_true_and_ge_jasmin(causal):
    for seed, scale in [(0, 0.3), (1, 1.0), (2, 4.0)]:
        for bias in (False, True):
            g = _gen(seed)
            w = AttentionWeights.random(4, 2, scale=scale, generator=g, bias=bias)
            X = torch.randn(3, 5, 4, generator=g, dtype=DT) * (0.5 + seed)
            assert bool(kim.guaranteed(X, augmented=bias).all())
            b = kim.bound(X, w, causal=causal)
            assert b.shape == (3, 2)
            assert bool((b >= castin.head_lipschitz_dense(X, w, causal)).all())
            assert bool((b >= jasmin.bound(X, w, use_g1=True, causal=causal)).all())  # proof of `guaranteed`


def test_kim_bound_on_a_ball_of_radius_r():
    g = _gen(3)
    w = AttentionWeights.random(4, 2, scale=2.0, generator=g)
    X = torch.randn(5, 4, generator=g, dtype=DT) * 0.3
    r = 0.7
    b = kim.bound(X, w, r)
    U = torch.randn(16, 5, 4, generator=g, dtype=DT)
    U = U / U.flatten(1).norm(dim=-1)[:, None, None] * r * torch.rand(16, 1, 1, generator=g, dtype=DT)
    assert bool((castin.head_lipschitz_dense(X + U, w) <= b).all())
    assert torch.allclose(kim.bound(X, w, torch.tensor(r, dtype=DT)), b)
    # monotone in r
    assert bool((kim.bound(X, w, 2 * r) > b).all())


def test_kim_bound_fails_as_stated_near_zero():
    """Documented finding: with r = 0 the stated bound vanishes at X -> 0 while ||J|| -> ||VO|| ||P|| > 0."""
    g = _gen(4)
    w = AttentionWeights.random(4, 1, scale=1.0, generator=g)
    X = torch.randn(5, 4, generator=g, dtype=DT) * 1e-3
    assert not bool(kim.guaranteed(X))
    assert float(kim.bound(X, w)[0]) < float(castin.head_lipschitz_dense(X, w)[0])
    vo = torch.linalg.matrix_norm(w.VO()[0], ord=2)
    assert abs(float(castin.head_lipschitz_dense(torch.zeros(5, 4, dtype=DT), w)[0] / vo) - 1) < 1e-9


def test_formula_and_batching():
    g = _gen(5)
    w = AttentionWeights.random(6, 3, scale=1.0, generator=g)
    X = torch.randn(2, 4, 6, generator=g, dtype=DT)
    b = kim.bound(X, w, 0.5)
    n = 4
    for l in range(3):
        v = torch.linalg.matrix_norm(w.VO()[l], ord=2)
        q, k = torch.linalg.matrix_norm(w.wq[l], ord=2), torch.linalg.matrix_norm(w.wk[l], ord=2)
        ref = n * (n + 1) * (X[1].norm() + 0.5) ** 2 * (v * q * k + v)
        assert float(b[1, l]) == pytest.approx(float(ref), rel=1e-12)
    assert torch.allclose(b, torch.stack([kim.bound(x, w, 0.5) for x in X]))
    assert torch.allclose(kim.bound(X.float(), w.to(torch.float32), 0.5).double(), b, rtol=1e-5)


def test_bad_inputs():
    w = AttentionWeights.random(4, 2, generator=_gen(0))
    with pytest.raises(ValueError, match="r \\(ball radius\\)"):
        kim.bound(torch.zeros(3, 4, dtype=DT), w, -1.0)
    with pytest.raises(ValueError, match="r \\(ball radius\\)"):
        kim.bound(torch.zeros(3, 4, dtype=DT), w, float("nan"))
    with pytest.raises(ValueError, match="feature dimension"):
        kim.bound(torch.zeros(3, 5, dtype=DT), w)
    with pytest.raises(ValueError, match="empty"):
        kim.bound(torch.zeros(0, 4, dtype=DT), w)
    with pytest.raises(ValueError, match="NaN"):
        kim.bound(torch.full((3, 4), math.inf, dtype=DT), w)
