"""Mixed-precision Krylov (harness.kernels.mixed): float32 iterations, float64 results. Every value is checked
against a dense float64 computation, on adversarial spectra too (clustered top singular values below float32's
resolution, near-one-hot attention), and every certified upper estimate against the dense truth."""
from __future__ import annotations

import pytest
import torch

from harness.analyze.options import AnalyzeOptions
from harness.analyze.state import AnalyzeState
from harness.analyze.validate import UsageError
from harness.bounds import castin
from harness.kernels import layer as L
from harness.kernels import mixed
from harness.kernels.attention import AttentionWeights, probs
from harness.kernels.krylov import CallableGram
from harness.kernels.power import dense_jacobian

DT = torch.float64
CERT = dict(steps=24, fail_prob=1e-6)


def _w(d=16, h=4, seed=0, scale=2.0, bias=True):
    return AttentionWeights.random(d, h, scale=scale, dtype=DT, generator=torch.Generator().manual_seed(seed), bias=bias)


def _X(B, n, d, seed=1, scale=1.0):
    return torch.randn(B, n, d, dtype=DT, generator=torch.Generator().manual_seed(seed)) * scale


def _dense_layer(X, w):
    return torch.stack([torch.linalg.matrix_norm(dense_jacobian(L.layer_map(w), X[b]), ord=2)
                        for b in range(X.shape[0])])


@pytest.mark.parametrize("x_scale", [1.0, 6.0])  # 6: near-one-hot attention rows (tiny softmax Jacobians)
def test_mixed_truth_equals_dense_float64(x_scale):
    w, X = _w(seed=3), _X(2, 6, 16, seed=4, scale=x_scale)
    top = probs(X, w).amax(-1)  # the largest weight of every attention row
    assert float(top.median()) > (0.95 if x_scale > 1 else 0.0)
    dense_layer, dense_heads = _dense_layer(X, w), castin.head_lipschitz_dense(X, w)
    for heads, dense in ((False, dense_layer), (True, dense_heads)):
        r = mixed.truth(X, w, heads=heads, tol=1e-10, certify=CERT)
        plain = L.truth(X, w, heads=heads, tol=1e-10, certify=CERT)
        assert r.value.dtype == DT and bool(r.converged.all())
        assert torch.allclose(r.value, dense, rtol=1e-12, atol=0)
        assert torch.allclose(r.value, plain.value, rtol=1e-12, atol=0)
        assert bool((r.upper >= dense).all())  # the padded float32 KW estimate is above the dense truth
        assert r.vector.dtype == DT and r.iters > 0


def test_mixed_truth_follows_the_plain_route_outside_float64():
    w, X = _w(seed=5), _X(2, 5, 16, seed=6)
    a = mixed.truth(X.float(), w.to(torch.float32), certify=CERT)
    b = L.truth(X.float(), w.to(torch.float32), certify=CERT)
    assert torch.equal(a.value, b.value) and torch.equal(a.upper, b.upper)
    assert mixed.applies(X) and not mixed.applies(X.float())
    with pytest.raises(ValueError, match="certify"):
        mixed.truth(X, w)


def _clustered(seed, gap, N=60, B=3):
    """B matrices N x N with singular values 1, 1 - gap, 1 - 2 gap (a cluster below float32's resolution when gap
    is 1e-9), then spread in (0, 0.9): (M, sigma_max)."""
    g = torch.Generator().manual_seed(seed)
    U = torch.linalg.qr(torch.randn(B, N, N, dtype=DT, generator=g)).Q
    V = torch.linalg.qr(torch.randn(B, N, N, dtype=DT, generator=g)).Q
    s = torch.cat([torch.tensor([1.0, 1 - gap, 1 - 2 * gap], dtype=DT), torch.rand(N - 3, dtype=DT, generator=g) * 0.9])
    return U @ torch.diag(s) @ V.transpose(-1, -2), torch.ones(B, dtype=DT)


def _op(M, x0):
    mv = lambda v: (M @ v[..., None])[..., 0]
    rmv = lambda u: (M.transpose(-1, -2) @ u[..., None])[..., 0]
    return CallableGram(mv, rmv, (M.shape[0],), (M.shape[-1],), x0)


@pytest.mark.parametrize("gap", [1e-9, 1e-3])
def test_lanczos_mixed_on_clustered_spectra(gap):
    M, top = _clustered(7, gap)
    x0 = torch.randn(M.shape[0], M.shape[-1], dtype=DT, generator=torch.Generator().manual_seed(8))
    r, products32 = mixed.lanczos_mixed(_op(M, x0), _op(M.float(), x0.float()), x0, fail_prob=1e-6, iters=500,
                                        tol=1e-10, krylov=30, min_steps=24)
    assert r.value.dtype == DT and bool(r.converged.all()) and products32 >= 24
    assert torch.allclose(r.value, top, rtol=2 * gap + 1e-13, atol=0)  # within the cluster, to float64 rounding
    assert bool((r.upper >= top).all())
    assert bool((r.steps >= 25).all())  # both phases counted


def test_analyze_state_mixed_reports_the_float64_truths():
    w, X = _w(seed=9), _X(3, 7, 16, seed=10)
    a, b = AnalyzeState(X, w, mixed=True), AnalyzeState(X, w, mixed=False)
    assert a.mixed and not b.mixed and not AnalyzeState(X.float(), w.to(dtype=torch.float32), mixed=True).mixed
    for q in ("truth_head", "truth_layer"):
        assert torch.allclose(getattr(a, q), getattr(b, q), rtol=1e-9, atol=0)
    for scope in ("head", "layer"):
        ref = getattr(b, "truth_" + scope)
        assert bool((a.upper[scope] >= ref).all())
    assert torch.equal(a.zeta, b.zeta) and torch.equal(a.m_fine, b.m_fine)  # float64 throughout (the state's rule)


def test_analyze_options_mixed_field():
    assert AnalyzeOptions().mixed is True and AnalyzeOptions(mixed=False).state_kw()["mixed"] is False
    with pytest.raises(UsageError, match="mixed"):
        AnalyzeOptions(mixed="yes")
