"""JaSMin (Yudin et al.): Theorem 3 per head >= the true local Lipschitz constant, Theorem 4 interlacing, regularizers."""

import pytest
import torch

from harness.bounds import castin, jasmin
from harness.kernels import softmax as ksm
from harness.kernels.attention import AttentionWeights, attention
from harness.kernels.pgd import pgd_maximize, random_search_maximize
from harness.kernels.power import dense_jacobian

DT = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _prob_rows(seed, n=7, count=40):
    """Random, peaked, tied, one-hot, uniform and zero-containing probability rows: (count', n)."""
    g = _gen(seed)
    rows = [torch.softmax(torch.randn(count, n, generator=g, dtype=DT) * s, -1) for s in (0.3, 1.0, 4.0, 30.0)]
    tied = torch.tensor([[0.3, 0.3, 0.2, 0.2] + [0.0] * (n - 4), [0.5, 0.5] + [0.0] * (n - 2)], dtype=DT)
    spread = torch.tensor([0.4, 0.4, 0.1, 0.1] + [0.0] * (n - 4), dtype=DT)
    special = torch.stack([torch.eye(n, dtype=DT)[0], torch.full((n,), 1.0 / n, dtype=DT), spread])
    return torch.cat(rows + [tied, special])


def test_g_k_is_the_kernel():
    assert jasmin.g_k is ksm.g_k
    p = torch.tensor([0.5, 0.3, 0.2], dtype=DT)
    assert float(jasmin.g_k(p, 1)) == pytest.approx(0.5 * (1 - 0.5 + 0.3))
    assert float(jasmin.g_k(p, 3)) == pytest.approx(0.2 * 0.8)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_jsm_norm_equals_dense_eigvalsh(seed):
    P = _prob_rows(seed)
    exact, dense = ksm.jsm_norm(P), ksm.jsm_norm_dense(P)
    assert torch.allclose(exact, dense, rtol=1e-6, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_theorem4_interlacing(seed):
    P = _prob_rows(seed, n=6 + seed)
    assert bool(jasmin.interlacing_holds(P).all())
    c = jasmin.interlacing_chain(P)
    assert c.shape == (P.shape[0], 3 * P.shape[1])
    # Cor. 1: ||J_sm|| <= g_1 <= 1/2, equality at (1/2, 1/2, 0, ...)
    assert bool((ksm.jsm_norm(P) <= ksm.g_k(P, 1) + 1e-12).all()) and bool((ksm.g_k(P, 1) <= 0.5 + 1e-15).all())
    half = torch.tensor([0.5, 0.5, 0.0], dtype=DT)
    assert float(ksm.g_k(half, 1)) == pytest.approx(0.5) and float(ksm.jsm_norm(half)) == pytest.approx(0.5)


def test_interlacing_detects_a_broken_chain():
    assert not bool(jasmin.interlacing_holds(torch.tensor([2.0, 0.0], dtype=DT)))  # not a probability vector


def _true_and_bounds(X, w, causal):
    true = castin.head_lipschitz_dense(X, w, causal)  # (B, h)
    return true, jasmin.bound(X, w, causal=causal), jasmin.bound(X, w, use_g1=True, causal=causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("bias", [False, True])
def test_theorem3_upper_bounds_true_local_lipschitz(causal, bias):
    worst = 0.0
    for seed, scale in [(0, 0.2), (1, 1.0), (2, 3.0), (3, 8.0)]:
        g = _gen(seed)
        w = AttentionWeights.random(6, 3, scale=scale, generator=g, bias=bias)
        X = torch.randn(4, 5, 6, generator=g, dtype=DT) * (0.5 + seed)
        true, b, b1 = _true_and_bounds(X, w, causal)
        assert bool((b >= true * (1 - 1e-10)).all()), (seed, scale, (true / b).max())
        assert bool((b1 >= b * (1 - 1e-12)).all())  # g_1 >= ||J_sm||
        worst = max(worst, float((true / b).max()))
    assert worst > 1e-3  # the check is not vacuous


def test_theorem3_ge_pgd_and_sampled_lower_bounds():
    g = _gen(7)
    w = AttentionWeights.random(4, 1, scale=2.0, generator=g)
    X = torch.randn(3, 4, 4, generator=g, dtype=DT)
    b = jasmin.bound(X, w)[..., 0]  # (3,)
    J = castin.dense_head_jacobians(X, w)[:, 0]  # (3, nd, nd) from jacrev

    def gain(U):  # ||J(X) U||_F for ||U||_F <= 1: an exact lower bound of ||J(X)||
        return (J @ U.flatten(1).unsqueeze(-1)).flatten(1).norm(dim=-1)

    zero = torch.zeros_like(X)
    pgd = pgd_maximize(gain, zero, 1.0, steps=30, restarts=2, seed=0).value
    rnd = random_search_maximize(gain, zero, 1.0, samples=64, seed=0)
    true = torch.linalg.matrix_norm(J, ord=2)
    assert bool((pgd <= true * (1 + 1e-9)).all()) and bool((pgd >= 0.9 * true).all())  # PGD is a good lower bound
    assert bool((b >= pgd).all()) and bool((b >= rnd).all())


@pytest.mark.parametrize("residual", [False, True])
def test_multihead_sum_bounds_full_layer(residual):
    g = _gen(11)
    w = AttentionWeights.random(6, 3, scale=1.5, generator=g, bias=True)
    for causal in (False, True):
        X = torch.randn(5, 6, generator=g, dtype=DT)
        J = dense_jacobian(lambda Z: attention(Z, w, residual=residual, causal=causal), X)
        true = torch.linalg.matrix_norm(J, ord=2)
        mh = jasmin.multihead(jasmin.bound(X, w, causal=causal), residual)
        assert float(mh) >= float(true)
        # the per-head truths also sum to an upper bound (triangle inequality), which the bound dominates
        assert float(jasmin.multihead(castin.head_lipschitz_dense(X, w, causal), residual)) >= float(true) - 1e-9


def test_bound_terms_and_batching_and_float32():
    g = _gen(3)
    w = AttentionWeights.random(4, 2, scale=1.0, generator=g)
    X = torch.randn(3, 5, 4, generator=g, dtype=DT)
    t = jasmin.bound_terms(X, w)
    assert set(t) == {"vo", "p", "x2", "a", "jsm", "g1"} and all(v.shape == (3, 2) for v in t.values())
    assert bool((t["jsm"] <= t["g1"] + 1e-15).all()) and bool((t["g1"] <= 0.5).all())
    b = jasmin.bound(X, w)
    assert torch.allclose(b, torch.stack([jasmin.bound(x, w) for x in X]), rtol=1e-12)
    b32 = jasmin.bound(X.float(), w.to(torch.float32))
    assert torch.allclose(b32.double(), b, rtol=1e-4)


def test_penalty_values_and_aggregation():
    g = _gen(5)
    P = torch.softmax(torch.randn(2, 3, 6, 6, generator=g, dtype=DT) * 2, -1)  # (L, h, n, n)
    lg1 = torch.log(ksm.g_k(P, 1) + 1e-12)
    assert float(jasmin.jasmin_penalty(P, 0, "mean")) == pytest.approx(float(lg1.mean(-1).sum()), rel=1e-12)
    assert float(jasmin.jasmin_penalty(P, 0, "max")) == pytest.approx(float(lg1.amax(-1).sum()), rel=1e-12)
    r = torch.log(ksm.g_k(P, 1) + 1e-12) - torch.log(ksm.g_k(P, 4) + 1e-12)
    assert float(jasmin.jasmin_penalty(P, 4, "max")) == pytest.approx(float(r.amax(-1).sum()), rel=1e-12)
    assert bool((r >= -1e-9).all())  # g_1 >= g_k (interlacing)
    # a list of per-layer maps is the sum; batch_dims averages
    assert float(jasmin.jasmin_penalty([P[0], P[1]], 0)) == pytest.approx(float(jasmin.jasmin_penalty(P, 0)))
    Pb = P.unsqueeze(0).expand(4, -1, -1, -1, -1)
    assert float(jasmin.jasmin_penalty(Pb, 0, batch_dims=1)) == pytest.approx(float(jasmin.jasmin_penalty(P, 0)))


@pytest.mark.parametrize("k", [0, 3])
@pytest.mark.parametrize("agg", ["mean", "max"])
def test_penalty_gradients_finite(k, agg):
    g = _gen(9)
    logits = (torch.randn(2, 5, 5, generator=g, dtype=DT) * 5).requires_grad_(True)
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)  # causal: the first row is one-hot (g_1 = 0)
    P = torch.softmax(logits.masked_fill(mask, float("-inf")), -1)
    val = jasmin.jasmin_penalty(P, k, agg)
    (grad,) = torch.autograd.grad(val, logits)
    assert torch.isfinite(val) and bool(torch.isfinite(grad).all()) and float(grad.abs().sum()) > 0


def test_bad_inputs():
    g = _gen(0)
    w = AttentionWeights.random(4, 2, generator=g)
    with pytest.raises(ValueError, match="feature dimension"):
        jasmin.bound(torch.randn(3, 5, dtype=DT), w)
    with pytest.raises(ValueError, match="NaN"):
        jasmin.bound(torch.full((3, 4), float("nan"), dtype=DT), w)
    with pytest.raises(ValueError, match="empty"):
        jasmin.bound(torch.zeros(0, 4, dtype=DT), w)
    with pytest.raises(ValueError, match="AttentionWeights"):
        jasmin.bound(torch.zeros(2, 4, dtype=DT), "w")
    P = torch.softmax(torch.randn(2, 4, 4, dtype=DT), -1)
    for kw, msg in [(dict(k=1), "k must be"), (dict(k=5), "exceeds"), (dict(k=0, agg="sum"), "agg")]:
        with pytest.raises(ValueError, match=msg):
            jasmin.jasmin_penalty(P, **kw)
    with pytest.raises(ValueError, match="NaN"):
        jasmin.jasmin_penalty(P * float("nan"), 0)
    with pytest.raises(ValueError, match="empty"):
        jasmin.jasmin_penalty([], 0)
    with pytest.raises(ValueError):
        jasmin.multihead(torch.tensor(1.0))


@pytest.mark.parametrize("bias", [False, True])
def test_an_analysis_terms_take_the_shared_p_norm(bias):
    # InputState hands its ||P_l|| (eigenvalues of P P^T) to bound_terms instead of a second SVD; the factors
    # equal the SVD-based ones to rounding, and a given P_norm is used as it is
    from harness.bounds.input_state import InputState

    g = _gen(9)
    w = AttentionWeights.random(8, 2, scale=2.0, generator=g, bias=bias)
    X = torch.randn(2, 40, 8, generator=g, dtype=DT)
    s = InputState(X, w)
    shared, alone = s.jasmin_terms, jasmin.bound_terms(X, w)
    assert shared["p"] is s.P_norm
    for k in alone:
        torch.testing.assert_close(shared[k], alone[k], rtol=1e-13, atol=0)
    marked = jasmin.bound_terms(X, w, P_norm=torch.full((2, 2), 7.0, dtype=DT))
    assert bool((marked["p"] == 7.0).all())
