"""harness.kernels.layer: the batched layer Jacobian operator vs dense float64 Jacobians, Lanczos vs power,
warm starts, the paper code's estimator, stacked single heads, dtype/device following the inputs."""
from __future__ import annotations

import pytest
import torch

from harness.kernels import layer as L
from harness.kernels.attention import AttentionWeights
from harness.kernels.power import dense_jacobian, paper_estimator

DT = torch.float64


def _w(d=8, h=2, seed=0, scale=2.0, bias=True):
    return AttentionWeights.random(d, h, scale=scale, dtype=DT, generator=torch.Generator().manual_seed(seed), bias=bias)


def _X(B, n, d, seed=1, scale=1.0):
    return scale * torch.randn(B, n, d, dtype=DT, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("causal", [False, True])
def test_layer_operator_matches_dense_jacobian(causal):
    w, X = _w(), _X(3, 5, 8)
    mv, rmv = L.layer_operator(X, w, causal)
    U = _X(3, 5, 8, seed=7)
    for b in range(3):
        J = dense_jacobian(L.layer_map(w, causal), X[b])  # (nd, nd)
        assert torch.allclose(mv(U)[b].flatten(), J @ U[b].flatten(), rtol=1e-10, atol=1e-12)
        assert torch.allclose(rmv(U)[b].flatten(), J.T @ U[b].flatten(), rtol=1e-10, atol=1e-12)
        exact = torch.linalg.matrix_norm(J, ord=2)
        got = L.lipschitz(X, w, causal, tol=1e-12).value[b]
        assert abs(float(got - exact)) <= 1e-6 * float(exact)


def test_batched_matches_one_by_one_and_power():
    w, X = _w(12, 3, seed=2), _X(4, 6, 12, seed=3)
    batched = L.lipschitz(X, w, tol=1e-12).value
    single = torch.stack([L.lipschitz(X[i:i + 1], w, tol=1e-12).value[0] for i in range(4)])
    power = L.lipschitz(X, w, tol=1e-14, method="power", iters=20000).value
    assert torch.allclose(batched, single, rtol=1e-6)
    assert torch.allclose(batched, power, rtol=1e-5)


def test_warm_start_gives_same_value():
    w = _w(8, 2, seed=4)
    X4, X6 = _X(3, 4, 8, seed=5), _X(3, 6, 8, seed=6)
    prev = L.lipschitz(X4, w, tol=1e-12).vector
    cold = L.lipschitz(X6, w, tol=1e-12).value
    warm = L.lipschitz(X6, w, tol=1e-12, v0=L.warm_start(prev, X6.shape, dtype=DT)).value
    assert torch.allclose(cold, warm, rtol=1e-6)
    with pytest.raises(ValueError, match="feature dimension"):
        L.warm_start(torch.ones(1, 2, 3, dtype=DT), (1, 2, 4))


def test_paper_value_equals_paper_estimator_and_is_not_the_norm():
    w, X = _w(8, 2, seed=8), _X(2, 5, 8, seed=9)
    for causal in (False, True):
        ours = L.paper_value(X, w, causal)
        ref = paper_estimator(L.layer_map(w, causal), X, iters=5)
        assert torch.allclose(ours, ref, rtol=1e-10)
    true = L.lipschitz(X, w).value
    assert not torch.allclose(ours, true, rtol=1e-2)  # the defect changes the number


def test_stacked_heads_operator_is_single_head():
    w = _w(8, 2, seed=10, bias=False)
    X = _X(2, 4, 8, seed=11)
    wh = L.stack_heads(w, [1, 0])
    vals = L.lipschitz(X, wh, tol=1e-12).value
    for b, l in enumerate([1, 0]):
        J = dense_jacobian(L.layer_map(w.head(l)), X[b])
        assert abs(float(vals[b] - torch.linalg.matrix_norm(J, ord=2))) <= 1e-6 * float(vals[b])


def test_float32_follows_inputs_and_agrees():
    w, X = _w(8, 2, seed=15), _X(3, 5, 8, seed=16)
    ref = L.lipschitz(X, w).value
    r32 = L.lipschitz(X.float(), w.to(torch.float32))
    assert r32.value.dtype == torch.float32 and bool(r32.converged.all())
    assert torch.allclose(r32.value.double(), ref, rtol=1e-4)
    v = L.warm_start(r32.vector, (3, 7, 8))
    assert v.dtype == torch.float32 and v.shape == (3, 7, 8)
    assert L.paper_value(X.float(), w.to(torch.float32)).dtype == torch.float32


def test_truth_is_one_function_and_matches_dense_jacobians():
    from harness.bounds import castin

    w, X = _w(16, 8, seed=20), _X(2, 6, 16, seed=21)  # d = 16 > 3 dh = 6: the reduced heads are smaller than X
    dense_heads = castin.head_lipschitz_dense(X, w)  # (2, 8), biases included
    dense_layer = torch.stack([torch.linalg.matrix_norm(dense_jacobian(L.layer_map(w), X[b]), ord=2) for b in range(2)])
    for certify in (None, dict(steps=24, fail_prob=1e-6)):
        h = L.truth(X, w, heads=True, certify=certify)
        f = L.truth(X, w, certify=certify)
        assert torch.allclose(h.value, dense_heads, rtol=1e-6) and torch.allclose(f.value, dense_layer, rtol=1e-6)
        if certify is not None:  # the KW estimate is above the truth
            assert bool((h.upper >= dense_heads * (1 - 1e-9)).all()) and bool((f.upper >= dense_layer).all())
    assert torch.equal(castin.head_lipschitz(X, w), L.truth(X, w, heads=True).value)


def test_one_tolerance_per_dtype_and_purpose():
    from experiments.castin import common
    from harness import settings as T
    from harness.bounds import registry
    from harness.kernels.power import default_tol

    for dt in (torch.float64, torch.float32, torch.bfloat16):
        assert common.tol(dt) == T.truth_tol(dt) and default_tol(dt) == T.norm_tol(dt)
    assert (T.truth_tol(torch.float64), T.truth_tol(torch.float32)) == (1e-6, 1e-5)
    # the soundness slack exceeds the truth's relative error (<= tol / 2 on sigma) in every dtype
    assert registry.SOUND_RTOL == T.SOUND_RTOL > T.truth_tol(torch.float32) / 2
    # the default tolerance of lipschitz is the truth's: a looser explicit one gives a different (cheaper) run
    w, X = _w(8, 2, seed=22), _X(1, 64, 8, seed=23)  # n d = 512 > DENSE_MAX: Lanczos
    assert L.lipschitz(X, w).iters == L.lipschitz(X, w, tol=T.truth_tol(DT)).iters != L.lipschitz(X, w, tol=1e-2).iters
