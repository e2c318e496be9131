"""LoFAST bounds with a causal mask (ours, beyond the paper): exact zeta vs a dense oracle, soundness vs truth/PGD."""
import pytest
import torch

from harness.bounds import lofast
from harness.kernels.attention import AttentionWeights, attention
from harness.kernels.pgd import pgd_maximize
from harness.kernels.power import dense_jacobian, jacobian_norm


def masked_probs_loop(X, w):
    """Causal P_l by an explicit per-row softmax over j <= i (independent of the kernels' masking)."""
    n = X.shape[0]
    P = torch.zeros(w.h, n, n, dtype=X.dtype)
    for l in range(w.h):
        S = (X @ w.wq[l]) @ (X @ w.wk[l]).T / w.dh ** 0.5
        for i in range(n):
            P[l, i, : i + 1] = torch.softmax(S[i, : i + 1], -1)
    return P


@pytest.mark.parametrize("residual", [True, False])
def test_causal_zeta_equals_dense_delta1_map(residual):
    g = torch.Generator().manual_seed(11)
    w = AttentionWeights.random(8, 2, scale=2.0, generator=g)
    X = torch.randn(6, 8, dtype=torch.float64, generator=g)
    P, VO = masked_probs_loop(X, w), w.VO()
    lin = lambda G: (G if residual else 0) + sum(P[l] @ G @ VO[l] for l in range(w.h))  # Delta_1 map (eq. 10)
    ref = torch.linalg.matrix_norm(dense_jacobian(lin, X), 2)
    torch.testing.assert_close(lofast.zeta(X, w, residual, causal=True), ref, rtol=1e-8, atol=0)


@pytest.mark.parametrize("scale", [0.5, 2.0, 5.0])
def test_causal_bounds_dominate_truth_and_pgd(scale):
    g = torch.Generator().manual_seed(int(10 * scale))
    w = AttentionWeights.random(8, 2, scale=scale, generator=g)
    X = torch.randn(3, 6, 8, dtype=torch.float64, generator=g)
    F = lambda Z: attention(Z, w, residual=True, causal=True)
    true = jacobian_norm(F, X)
    for fine in (True, False):
        for c in (1.0, 0.5):
            up = lofast.lipschitz_upper(X, w, fine=fine, softmax_lip=c, causal=True)
            assert torch.all(up >= true * (1 - 1e-9)), (fine, c)
    F0 = F(X)
    for eps in (0.05, 0.5):
        lb = pgd_maximize(lambda Z: (F(Z) - F0).flatten(-2).norm(dim=-1), X, eps, steps=30, restarts=2).value
        assert torch.all(lofast.delta(X, w, eps, causal=True, softmax_lip=0.5) >= lb * (1 - 1e-9))
    # the mask changes zeta: the unmasked value is not what is computed
    assert not torch.allclose(lofast.zeta(X, w, causal=True), lofast.zeta(X, w))
