"""harness.kernels.streamed and kernels.route: the blockwise (memory-linear) layer Jacobian products against the
materialised route (kernels.layer.layer_operator) and dense float64 Jacobians, RoPE against torch.func on the exact
map, the route rule, the basis plan and the certified truth through both routes."""
from __future__ import annotations

import pytest
import torch

from harness.kernels import layer as L
from harness.kernels import route as R
from harness.kernels.attention import AttentionWeights, probs
from harness.kernels.power import dense_jacobian
from harness.kernels.streamed import StreamedLayer, rope_tables, streamed_operator
from harness.models.adapters_modern import AttentionMap, _expand_kv

DT = torch.float64
CERT = dict(steps=24, fail_prob=1e-9)


def _w(d=16, h=4, seed=0, scale=2.0, bias=True):
    g = torch.Generator().manual_seed(seed)
    return AttentionWeights.random(d, h, scale=scale, dtype=DT, generator=g, bias=bias)


def _X(*shape, seed=1):
    return torch.randn(*shape, dtype=DT, generator=torch.Generator().manual_seed(seed))


def _rel(a, b):
    return float((a - b).norm() / b.norm())


@pytest.mark.parametrize("n,block", [(37, (8, 5)), (64, (16, 64)), (50, (50, 50)), (33, (1, 7))])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_streamed_equals_materialised(n, block, causal, bias):
    w, X, U = _w(bias=bias), _X(2, n, 16), _X(2, n, 16, seed=5)
    mv, rmv = L.layer_operator(X, w, causal)
    smv, srmv = streamed_operator(X, w, causal, block=block)
    assert _rel(smv(U), mv(U)) < 1e-13
    assert _rel(srmv(U), rmv(U)) < 1e-13


@pytest.mark.parametrize("causal", [False, True])
def test_streamed_matches_dense_jacobian(causal):
    w, X = _w(d=8, h=2), _X(2, 5, 8)
    smv, srmv = streamed_operator(X, w, causal, block=(2, 3))
    U = _X(2, 5, 8, seed=7)
    for b in range(2):
        J = dense_jacobian(L.layer_map(w, causal), X[b])
        assert torch.allclose(smv(U)[b].flatten(), J @ U[b].flatten(), rtol=1e-12, atol=1e-13)
        assert torch.allclose(srmv(U)[b].flatten(), J.T @ U[b].flatten(), rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("kv", [4, 2, 1])  # MHA, GQA, MQA
def test_rope_gqa_against_torch_func(kv):
    """Llama's map (RoPE, causal, key/value heads shared): streamed and materialised products equal the jvp / vjp
    of harness.models.adapters_modern.AttentionMap.layer."""
    n, d, h, dh = 19, 16, 4, 4
    g = torch.Generator().manual_seed(3)
    Wq, Wk, Wv = (torch.randn(d, c, dtype=DT, generator=g) / 4 for c in (h * dh, kv * dh, kv * dh))
    Wo = torch.randn(h * dh, d, dtype=DT, generator=g) / 4
    Wk, _ = _expand_kv(Wk, None, h, kv, dh)
    Wv, _ = _expand_kv(Wv, None, h, kv, dh)
    w = AttentionWeights.from_dense(Wq, Wk, Wv, Wo, h)
    cos, sin = rope_tables(n, dh, 1e4)
    amap = AttentionMap(w, causal=True, cos=cos, sin=sin)
    X, U = _X(n, d), _X(n, d, seed=2)
    jv = torch.func.jvp(amap.layer, (X,), (U,))[1]
    vj = torch.func.vjp(amap.layer, X)[1](U)[0]
    for mv, rmv in (streamed_operator(X, w, True, (cos, sin), block=(4, 6)), L.layer_operator(X, w, True, (cos, sin))):
        assert _rel(mv(U), jv) < 1e-13 and _rel(rmv(U), vj) < 1e-13


def test_online_forward_and_p_products():
    """The online-softmax setup gives F(X) and the attention maps' products of the materialised route."""
    w, X = _w(bias=True), _X(3, 41, 16)
    s = StreamedLayer(X, w, causal=True, block=(8, 6))
    P = probs(X, w, causal=True)
    Y = _X(3, 4, 41, 5, seed=9)
    assert _rel(s.p_apply(Y), P @ Y) < 1e-13
    assert _rel(s.p_apply(Y, transpose=True), P.transpose(-1, -2) @ Y) < 1e-13
    assert _rel(s.O, P @ s.v) < 1e-13


def test_route_rule_and_forcing():
    assert R.products_route(1, 32, 8192, 8, available=16 * 2**30) == "streamed"  # 17 GB of maps x 4
    assert R.products_route(1, 12, 512, 8, available=16 * 2**30) == "materialised"
    assert R.products_route(1, 12, 512, 8, "streamed") == "streamed"
    with pytest.raises(ValueError, match="route must be"):
        R.products_route(1, 1, 1, 8, "flash")


def test_basis_plan():
    """BASIS_MEMORY_FRACTION (0.8) of what the operator leaves: the usual float64 basis, a smaller one, float32."""
    GiB = 2**30
    N = 8192 * 4096  # 0.25 GiB per float64 vector
    assert R.basis_plan(1, N, 24, available=64 * GiB) == R.BasisPlan("float64", 30, 0, N * 8)
    p = R.basis_plan(1, N, 24, available=9 * GiB)  # 28 vectors fit, 26 needed
    assert p.storage == "float64" and p.krylov == 27
    p = R.basis_plan(1, N, 24, available=6 * GiB)  # float32 storage
    assert p.storage == "float32" and p.krylov32 == 30 and p.krylov == 18
    p = R.basis_plan(1, N, 24, available=9 * GiB, reserved=(2 * GiB, GiB))  # the operator's state comes first
    assert p.storage == "float32"
    with pytest.raises(ValueError, match="basis needs"):
        R.basis_plan(1, N, 24, available=4 * GiB)
    with pytest.raises(ValueError, match="basis needs"):
        R.basis_plan(1, N, 24, available=6 * GiB, mixed_ok=False)
    assert R.basis_vectors(N * 8, 26, 30, available=4 * GiB) == 26  # never below the certificate's cycle
    assert R.basis_vectors(N * 8, 2, 30, available=2 * GiB) == 5


@pytest.mark.parametrize("kw", [dict(), dict(causal=True), dict(residual=True), dict(heads=True)])
def test_truth_same_through_both_routes(kw):
    w, X = _w(d=32, h=4), _X(2, 48, 32)
    a = L.truth(X, w, certify=CERT, route="materialised", **kw)
    b = L.truth(X, w, certify=CERT, route="streamed", **kw)
    assert a.info["route"] == "materialised" and b.info["route"] == "streamed"
    assert torch.allclose(a.value, b.value, rtol=1e-12, atol=0)
    assert torch.allclose(a.upper, b.upper, rtol=1e-12, atol=0)


def test_truth_with_rope_against_dense():
    n, d = 12, 16
    w, X = _w(d=d, h=4), _X(n, d)
    cos, sin = rope_tables(n, w.dh, 1e4)
    amap = AttentionMap(w, causal=True, cos=cos, sin=sin)
    J = dense_jacobian(amap.layer, X)
    exact = torch.linalg.matrix_norm(J, 2)
    r = L.truth(X, w, causal=True, certify=CERT, route="streamed", rope=(cos, sin))
    assert abs(float(r.value) / float(exact) - 1) < 1e-6 and float(r.upper) >= float(exact) * (1 - 1e-12)


def test_truth_float32_basis_keeps_the_certificate(monkeypatch):
    """Where only a float32 basis fits, the truth takes the mixed route: float64 value, certificate >= exact."""
    w, X = _w(d=16, h=2), _X(70, 16)  # n d = 1120 > CERT_DENSE_MAX: Lanczos, not the dense route
    exact = torch.linalg.matrix_norm(dense_jacobian(L.layer_map(w), X), 2)
    plan = R.BasisPlan("float32", 6, 26, 70 * 16 * 8)
    monkeypatch.setattr(L, "basis_plan", lambda *a, **k: plan)
    r = L.truth(X, w, certify=CERT, route="streamed")
    assert "float32" in r.info["basis"]
    assert abs(float(r.value) / float(exact) - 1) < 1e-6
    assert float(r.upper) >= float(exact)


@pytest.mark.parametrize("residual,causal", [(True, False), (False, True)])
def test_streamed_zeta_gram_equals_materialised(residual, causal):
    from harness.bounds.lofast_ops import zeta_gram
    from harness.kernels.krylov import lanczos
    from harness.kernels.streamed import StreamedZetaGram
    w, X = _w(d=16, h=4, bias=False), _X(3, 29, 16)
    ref, _ = zeta_gram(X, w, residual, causal)
    op = StreamedZetaGram(StreamedLayer(X, w, causal, block=(8, 6)), w.wv, w.wo, residual)
    assert torch.allclose(op.scale, ref.scale, rtol=1e-13, atol=0)
    V = _X(3, 29 * 16, seed=4)
    assert _rel(op.gram(V), ref.gram(V)) < 1e-13
    a, b = lanczos(ref, V, tol=1e-10), lanczos(op, V, tol=1e-10)
    assert torch.allclose(a.value, b.value, rtol=1e-12, atol=0)


def test_m_operator_holds_nothing_n_by_n_at_long_n():
    from harness.kernels.operators import MGram
    K = _X(1, 4096, 8)
    assert MGram(K, K).side == "domain" and not hasattr(MGram(K, K), "P")


def test_mixed_truth_streams_where_the_maps_do_not_fit():
    """analyze's mixed-route truth takes kernels.route's rule too: under a cap no map fits, so it streams, and the
    value and certificate equal the materialised run's to rounding."""
    from harness.kernels import mixed

    w, X = _w(d=32, h=4), _X(2, 40, 32)
    a = mixed.truth(X, w, certify=CERT)
    calls = []
    real = L.streamed_operator
    try:
        L.streamed_operator = lambda *args, **kw: calls.append(1) or real(*args, **kw)
        R.set_memory_cap(1)
        b = mixed.truth(X, w, certify=CERT)
    finally:
        R.set_memory_cap(None)
        L.streamed_operator = real
    assert calls and torch.allclose(a.value, b.value, rtol=1e-12, atol=0)
    assert torch.allclose(a.upper, b.upper, rtol=1e-6, atol=0)


def test_truth_unchanged_where_memory_is_ample():
    """The materialised truth with ample memory is certified_norm's usual run, bit for bit (route and basis rules
    change nothing there)."""
    w, X = _w(d=32, h=4), _X(2, 48, 32)
    mv, rmv = L.layer_operator(X, w, True)
    ref = L.certified_norm(mv, rmv, X, None, 2000, 0, x0=L.truth_start(X, w, 0, True), **CERT)
    r = L.truth(X, w, causal=True, certify=CERT)
    assert r.info["route"] == "materialised" and r.info["basis"] == "float64 basis of 30 vectors"
    assert torch.equal(r.value, ref.value) and torch.equal(r.upper, ref.upper) and r.iters == ref.iters


def test_float32_input_truth_is_one_float32_solve():
    """A float32 input's basis is plain float32 storage (no mixed phases), certified as before."""
    w, X = _w(d=32, h=4).to(dtype=torch.float32), _X(2, 48, 32).float()
    r = L.truth(X, w, certify=CERT)
    assert r.info["basis"] == "float32 basis of 30 vectors" and "products32" not in r.info
