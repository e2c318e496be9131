"""Many small problems in one call: LoFAST's exact norms on a batch of inputs equal the dense float64 computation
input by input, whichever reorthogonalization the batch's basis size selects, and their certified upper estimates
stay above the dense truth."""
import pytest
import torch

import harness.kernels.krylov as K
from harness.bounds import lofast as L
from harness.bounds.lofast_ops import m_dense_matrix, zeta_dense_matrix
from harness.kernels.attention import AttentionWeights

B, N_TOK, D, H = 7, 6, 8, 2


def _batch(seed=0):
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(D, H, scale=1.0, dtype=torch.float64, generator=g)
    X = torch.randn(B, N_TOK, D, dtype=torch.float64, generator=g)
    return X / X.norm(dim=-1, keepdim=True), w


def _dense(X, w):
    m = torch.stack([torch.stack([torch.linalg.matrix_norm(m_dense_matrix(x, w, l), ord=2) for l in range(H)])
                     for x in X])
    z = torch.stack([torch.linalg.matrix_norm(zeta_dense_matrix(x, w, True), ord=2) for x in X])
    return m, z


@pytest.mark.parametrize("lean", [False, True])
def test_batched_norms_equal_dense_per_input(monkeypatch, lean):
    """lean=True forces the large-batch path (partial reorthogonalization, one pass after a restart) by lowering
    the basis-size threshold to 0; a small Krylov basis makes both runs restart."""
    if lean:
        monkeypatch.setattr(K, "PARTIAL_MIN_BYTES", 0)
    X, w = _batch()
    m_ref, z_ref = _dense(X, w)
    for krylov in (None, 6):
        kw = {} if krylov is None else dict(krylov=krylov)
        m, mi = L.m_norms(X, w, tol=1e-12, return_info=True, **kw)
        z, zi = L.zeta(X, w, tol=1e-12, return_info=True, **kw)
        assert bool(mi.converged.all()) and bool(zi.converged.all())
        torch.testing.assert_close(m, m_ref, rtol=1e-10, atol=0)
        torch.testing.assert_close(z, z_ref, rtol=1e-10, atol=0)
        assert bool((mi.m.upper >= m_ref * (1 - 1e-12)).all()) and bool((zi.zeta.upper >= z_ref * (1 - 1e-12)).all())


def test_large_batch_selects_partial_reorthogonalization(monkeypatch):
    """The auto rule: a batch whose basis exceeds PARTIAL_MIN_BYTES reads it less often (fewer full passes) and
    gives the same values as full reorthogonalization to rounding."""
    X, w = _batch(1)
    X = X.repeat(40, 1, 1)  # 280 inputs
    from harness.kernels.operators import ZetaGram
    from harness.bounds.lofast_ops import prepare, stable_probs

    wp = prepare(X, w)
    op = ZetaGram(stable_probs(X, wp, False), wp.wv, wp.wo, True)
    x0 = torch.randn(X.shape[0], N_TOK * D, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    full = K.lanczos(op, x0, tol=1e-12, krylov=20, reorth="full", fail_prob=1e-9)
    monkeypatch.setattr(K, "PARTIAL_MIN_BYTES", 0)
    auto = K.lanczos(op, x0, tol=1e-12, krylov=20, reorth="auto", fail_prob=1e-9)
    assert auto.passes < full.passes
    torch.testing.assert_close(auto.value, full.value, rtol=1e-11, atol=0)
    assert bool(auto.converged.all())
