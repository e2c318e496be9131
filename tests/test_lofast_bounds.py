"""LoFAST bounds (harness.bounds.lofast) against dense float64 oracles and PGD lower bounds (docs/math.md §1)."""
import math

import pytest
import torch

from harness.bounds import lofast as L
from harness.bounds.lofast_ops import m_dense_matrix, m_gram, zeta_dense_matrix, zeta_gram
from harness.kernels.attention import AttentionWeights, attention, scores
from harness.kernels.power import NonConvergenceWarning, jacobian_norm

DT = torch.float64
RTOL = 1e-6




def make(seed, n=5, d=8, h=2, scale=1.0, xscale=1.0, batch=(), bias=False):
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, scale=scale, dtype=DT, generator=g, bias=bias)
    X = torch.randn(*batch, n, d, dtype=DT, generator=g) * xscale
    return X, w


def rel(a, b):
    return float(((a - b).abs() / b.abs().clamp_min(1e-300)).max())


# ---- dense oracles built from the paper's formulas (independent of the operators under test) -------------
def kron_eq12(X, w, residual):
    """H (x) I_d + sum_l P_l (x) VO_l^T (eq. 12 with the I_n -> I_d fix), row-major vec convention."""
    n, d = X.shape
    P = torch.softmax(scores(X, w), -1)
    VO = w.wv @ w.wo
    T = torch.zeros(n * d, n * d, dtype=X.dtype)
    for l in range(w.h):
        T += torch.kron(P[l], VO[l].T.contiguous())
    if residual:
        T += torch.kron(torch.eye(n, dtype=X.dtype), torch.eye(d, dtype=X.dtype))
    return T


def dense_eq20(X, B):
    """M(X) = I_n (x) [x_j^T W^K W^Q^T]_j + sum_i (e_i (x) I_n) (x) (x_i^T W^Q W^K^T), B = W^Q W^K^T (eq. 20)."""
    n, d = X.shape
    I = torch.eye(n, dtype=X.dtype)
    top = torch.cat([(X[j] @ B.T)[None] for j in range(n)])  # rows x_j^T B^T
    M = torch.kron(I, top)
    for i in range(n):
        M += torch.kron(torch.kron(I[:, i:i + 1], I), (X[i] @ B)[None])
    return M


def spec(M):
    return torch.linalg.matrix_norm(M, ord=2)


# ---- exact quantities --------------------------------------------------------------------------------------
@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("seed,scale", [(0, 1.0), (1, 3.0), (2, 0.3)])
def test_zeta_equals_kronecker_norm(seed, scale, residual):
    X, w = make(seed, scale=scale)
    K = kron_eq12(X, w, residual)
    assert rel(L.zeta(X, w, residual), spec(K)) <= RTOL
    # convention check: the Kronecker matrix is the Jacobian of G -> H G + sum_l P_l G VO_l (row-major vec)
    P = torch.softmax(scores(X, w), -1)
    lin = lambda G: (G if residual else 0) + (P @ G @ (w.wv @ w.wo)).sum(0)
    J = torch.func.jacrev(lin)(torch.zeros_like(X)).reshape(X.numel(), X.numel())
    assert torch.allclose(J, K, atol=1e-12)
    assert torch.allclose(zeta_dense_matrix(X, w, residual), K, atol=1e-12)


@pytest.mark.parametrize("seed,scale,xscale", [(0, 1.0, 1.0), (1, 4.0, 0.5), (2, 0.5, 3.0)])
def test_m_norms_equal_eq20(seed, scale, xscale):
    X, w = make(seed, n=4, d=6, h=3, scale=scale, xscale=xscale)
    B = w.wq @ w.wk.transpose(-1, -2)
    dense = torch.stack([spec(dense_eq20(X, B[l])) for l in range(w.h)])
    assert rel(L.m_norms(X, w), dense) <= RTOL
    # eq. 20 maps vec(Gamma) to beta_ij = Gamma_i^T B x_j + x_i^T B Gamma_j (Lemma 2), i.e. the scores' derivative
    G = torch.randn(4, 6, dtype=DT, generator=torch.Generator().manual_seed(seed))
    beta = G @ B[0] @ X.T + X @ B[0] @ G.T
    assert torch.allclose(dense_eq20(X, B[0]) @ G.reshape(-1), beta.reshape(-1), atol=1e-12)
    assert torch.allclose(m_dense_matrix(X, w, 0), dense_eq20(X, B[0]), atol=1e-12)
    Jsc = torch.func.jacrev(lambda Z: scores(Z, w) * math.sqrt(w.dh))(X)  # (h, n, n, n, d)
    assert rel(L.m_norms(X, w), spec(Jsc.reshape(w.h, 16, 24))) <= RTOL


@pytest.mark.parametrize("side", ["domain", "codomain"])
def test_gram_operators_apply_the_dense_eq12_and_eq20_matrices(side):
    """The one operator set (harness.kernels.operators via lofast_ops) is eqs. 12 and 20: scale * matvec and
    scale * rmatvec equal the dense float64 matrices and their transposes, for a batch of inputs."""
    X, w = make(3, n=4, d=6, h=2, scale=2.0, batch=(3,))
    g = torch.Generator().manual_seed(0)
    G, S = torch.randn(3, 4, 6, dtype=DT, generator=g), torch.randn(3, 4, 4, dtype=DT, generator=g)
    for residual in (True, False):
        T, P = zeta_gram(X, w, residual)
        assert torch.allclose(P, torch.softmax(scores(X, w), -1))
        K = torch.stack([kron_eq12(x, w, residual) for x in X])  # (3, nd, nd)
        assert torch.allclose(T.scale[:, None, None] * T.matvec(G), (K @ G.reshape(3, -1, 1)).reshape(G.shape),
                              atol=1e-12)
        assert torch.allclose(T.scale[:, None, None] * T.rmatvec(G),
                              (K.mT @ G.reshape(3, -1, 1)).reshape(G.shape), atol=1e-12)
    op, U = m_gram(X, w, side)  # flat batch (3 h): input b, head l at row b h + l
    B = w.wq @ w.wk.transpose(-1, -2)
    out = op.scale[:, None, None] * op.matvec((G[:, None] @ U).flatten(0, 1))  # M_l(G) = R(G U_l): (3 h, n, n)
    back = (op.scale[:, None, None] * op.rmatvec(S.repeat_interleave(w.h, 0))).unflatten(0, (3, w.h)) @ U.mT
    for b in range(3):  # back: M_l^T(S) = R^T(S) U_l^T
        for l in range(w.h):
            M = dense_eq20(X[b], B[l])  # (n^2, nd)
            assert torch.allclose(out[b * w.h + l].reshape(-1), M @ G[b].reshape(-1), atol=1e-12)
            assert torch.allclose(back[b, l].reshape(-1), M.T @ S[b].reshape(-1), atol=1e-12)


def test_pgd_delta1_equals_pgd_on_the_dense_eq12_matrix():
    """pgd_delta1 runs on the Gram operator; the same PGD on the explicit eq. 12 matrix gives the same value."""
    from harness.kernels.pgd import pgd_maximize

    X, w = make(4, n=4, d=6, h=2, scale=3.0, batch=(2,))
    e = torch.tensor([0.1, 0.7], dtype=DT)
    for residual in (True, False):
        K = torch.stack([kron_eq12(x, w, residual) for x in X])
        obj = lambda Z: (K @ (Z - X).reshape(2, -1, 1)).flatten(-2).norm(dim=-1)
        dense = pgd_maximize(obj, X, e, steps=20, restarts=2, batch_dims=1, seed=0).value
        ours = L.pgd_delta1(X, w, e, residual, steps=20, restarts=2, seed=0)
        assert rel(ours, dense) <= 1e-10
        assert (ours <= L.zeta(X, w, residual, tol=1e-12) * e * (1 + 1e-9)).all()


def test_theorem1_limit_is_theorem1_over_eps_at_zero():
    """theorem1_limit is theorem1(eps)/eps as eps -> 0, and equals the hand-written limit
    d1 + sum_l c_l/sqrt(dh) m_l ||X VO_l|| (per head: d1_l + c_l/sqrt(dh) m_l ||X VO_l||) exactly."""
    g = torch.Generator().manual_seed(2)
    d1, m, xvo = torch.rand(5, generator=g, dtype=DT), torch.rand(5, 3, generator=g, dtype=DT), \
        torch.rand(5, 3, generator=g, dtype=DT)
    b, vo, dh = torch.rand(3, generator=g, dtype=DT), torch.rand(3, generator=g, dtype=DT), 4
    for c in (1.0, 0.5, 0.5 * torch.rand(5, 3, generator=g, dtype=DT)):
        lim = L.theorem1_limit(d1, m, xvo, dh, c)
        assert torch.equal(lim, d1 + (c / math.sqrt(dh) * m * xvo).sum(-1))
        assert torch.equal(L.theorem1_limit(d1[:, None] * vo, m, xvo, dh, c, heads=True),
                           d1[:, None] * vo + c / math.sqrt(dh) * m * xvo)
        for eps in (1e-6, 1e-9):
            e = torch.tensor(eps, dtype=DT)
            assert rel(L.theorem1(d1, m, b, xvo, vo, dh, e, c) / eps, lim) <= 10 * eps
        assert (L.theorem1(d1, m, b, xvo, vo, dh, torch.tensor(0.1, dtype=DT), c) / 0.1 > lim).all()
    X, w = make(6, batch=(3,), scale=2.0)  # lipschitz_upper is the limit of delta; the written-out formula
    for fine, c in ((True, 1.0), (False, 0.5)):
        m = L.m_norms(X, w) if fine else L.xi(X, w)
        vn = torch.linalg.matrix_norm(X.unsqueeze(-3) @ w.VO(), ord=2)
        ref = L.zeta(X, w) + c / math.sqrt(w.dh) * (m * vn).sum(-1)
        assert rel(L.lipschitz_upper(X, w, fine=fine, softmax_lip=c), ref) <= 1e-13


def test_xi_dominates_m_and_matches_dense():
    for seed in range(6):
        X, w = make(seed, scale=1.0 + seed, xscale=0.5 + seed / 2)
        m, x = L.m_norms(X, w), L.xi(X, w)
        assert (x >= m * (1 - 1e-9)).all()
        B = w.B()
        assert rel(x, spec(B @ X.T) + spec(X @ B)) <= RTOL


# ---- upper bounds >= PGD lower bounds -----------------------------------------------------------------------
EPS = torch.tensor([1e-3, 0.03, 0.1, 0.3, 1.0, 2.0], dtype=DT)


@pytest.mark.parametrize("residual", [True, False])
@pytest.mark.parametrize("seed,scale", [(0, 0.5), (1, 1.0), (2, 3.0), (3, 8.0)])
def test_theorem1_and_subbounds_dominate_pgd(seed, scale, residual):
    X, w = make(seed, n=4, d=6, h=2, scale=scale, batch=(6,))
    X = X * torch.tensor([0.2, 0.5, 1.0, 1.0, 2.0, 0.7], dtype=DT)[:, None, None]
    kw = dict(steps=30, restarts=3, seed=seed)
    sens = L.pgd_sensitivity(X, w, EPS, residual, **kw)
    p21, p2 = L.pgd_delta21(X, w, EPS, **kw), L.pgd_delta2(X, w, EPS, **kw)
    for fine in (True, False):
        for c in (1.0, 0.5):
            assert (L.delta(X, w, EPS, residual, fine, c) >= sens).all()
            assert (L.delta21(X, w, EPS, fine, c) >= p21).all()
            assert (L.delta2(X, w, EPS, fine, c) >= p2).all()
    d1 = L.delta1(X, w, EPS, residual)
    p1 = L.pgd_delta1(X, w, EPS, residual, **kw)
    assert (p1 <= d1 * (1 + 1e-9)).all() and (p1 >= 0.8 * d1).all()  # Lemma 1 is exact; PGD gets close
    assert (L.naive_delta1(X, w, EPS, residual) >= d1 * (1 - 1e-9)).all()
    d22 = L.delta22(X, w, EPS)
    assert (d22 >= L.pgd_delta22(X, w, EPS, **kw) * (1 - 1e-9)).all()
    assert (L.naive_delta22(X, w, EPS) >= d22 * (1 - 1e-9)).all()
    assert (L.delta(X, w, EPS, residual, fine=True) <= L.delta(X, w, EPS, residual, fine=False) * (1 + 1e-9)).all()


def test_lipschitz_upper_dominates_jacobian_norm_and_is_the_limit():
    for seed, scale in [(0, 1.0), (1, 3.0), (2, 6.0)]:
        X, w = make(seed, n=5, d=8, h=2, scale=scale, batch=(4,))
        for residual in (True, False):
            J = jacobian_norm(lambda Z: attention(Z, w, residual=residual), X)
            for fine in (True, False):
                for c in (1.0, 0.5):
                    assert (L.lipschitz_upper(X, w, residual, fine, c) >= J * (1 - 1e-9)).all()
            up = L.lipschitz_upper(X, w, residual)
            assert rel(L.delta(X, w, 1e-9, residual) / 1e-9, up) <= 1e-6
            # PGD on eq. 5 at small eps recovers ||J|| (sanity of the lower bound machinery)
            s = L.pgd_sensitivity(X, w, 1e-4, residual, steps=30, restarts=2) / 1e-4
            assert (s >= 0.9 * J).all() and (s <= up).all()


def test_biases_zeta_exact_and_bounds_valid():
    X, w = make(5, n=4, d=6, h=2, scale=2.0, bias=True, batch=(3,))
    for residual in (True, False):
        z = L.zeta(X, w, residual)
        assert rel(z, torch.stack([spec(kron_eq12(x, w, residual)) for x in X])) <= RTOL
    # biased Lemma 2: exact norm of the scores' derivative (bq, bk enter through Q, K)
    Jsc = torch.func.jacrev(lambda Z: scores(Z, w) * math.sqrt(w.dh))(X[0])
    assert rel(L.m_norms(X[0], w), spec(Jsc.reshape(w.h, 16, 24))) <= RTOL
    eps = torch.tensor([0.05, 0.5, 1.5], dtype=DT)
    kw = dict(steps=30, restarts=3)
    assert (L.delta(X, w, eps) >= L.pgd_sensitivity(X, w, eps, **kw)).all()
    assert (L.delta(X, w, eps, fine=False, softmax_lip=0.5) >= L.pgd_sensitivity(X, w, eps, **kw)).all()
    assert (L.delta2(X, w, eps) >= L.pgd_delta2(X, w, eps, **kw)).all()
    assert (L.naive_delta22(X, w, eps) >= L.pgd_delta22(X, w, eps, **kw)).all()
    assert (L.lipschitz_upper(X, w) >= jacobian_norm(lambda Z: attention(Z, w, residual=True), X)).all()


# ---- batching, dtypes, devices, diagnostics -------------------------------------------------------------
def test_batched_equals_per_sample():
    X, w = make(7, batch=(2, 3), scale=2.0)
    for f in (lambda Z: L.zeta(Z, w), lambda Z: L.zeta(Z, w, False), lambda Z: L.m_norms(Z, w),
              lambda Z: L.xi(Z, w), lambda Z: L.delta(Z, w, 0.2), lambda Z: L.lipschitz_upper(Z, w),
              lambda Z: L.naive_delta1(Z, w, 0.2), lambda Z: L.naive_delta22(Z, w, 0.2)):
        out = f(X)
        per = torch.stack([torch.stack([f(X[i, j]) for j in range(3)]) for i in range(2)])
        assert out.shape == per.shape
        assert rel(out, per) <= 1e-8


@pytest.mark.parametrize("causal", [False, True])
def test_zeta_reads_a_precomputed_p_norm_with_identical_values(causal):
    """zeta's eq. 9 cap from a caller's ||P_l|| (InputState's cached one) gives the same value and certified
    upper as computing it inside; a non-finite P_norm is recomputed; the argument is really read."""
    from harness.bounds.input_state import InputState

    X, w = make(11, batch=(2, 3), scale=2.0)
    s = InputState(X, w, causal)
    a, ia = L.zeta(X, w, False, causal=causal, return_info=True)
    b, ib = L.zeta(X, w, False, causal=causal, return_info=True, P_norm=s.P_norm)
    assert torch.equal(a, b) and torch.equal(s.zeta, a)
    assert torch.allclose(ia.zeta.upper, ib.zeta.upper, rtol=1e-12, atol=0)
    nan = L.zeta(X, w, False, causal=causal, return_info=True, P_norm=torch.full_like(s.P_norm, float("nan")))[1]
    assert torch.equal(nan.zeta.upper, ia.zeta.upper)
    zero = L.zeta(X, w, False, causal=causal, return_info=True, P_norm=torch.zeros_like(s.P_norm))[1]
    assert bool((zero.zeta.upper == 0).all())  # min(KW estimate, eq. 9 with ||P_l|| = 0)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("residual", [False, True])
def test_eq9_cap_skipped_only_where_it_cannot_bind(causal, residual):
    """zeta's eq. 9 cap, skipped where the certified estimate lies below its lower bound H + sum ||VO_l||_F / sqrt(dh):
    that lower bound is <= eq. 9 on random and near-one-hot inputs, and min(upper, cap) equals min(upper, eq. 9)
    for estimates below it, between it and eq. 9, above eq. 9, infinite (a caller's start) and NaN."""
    from harness.bounds.lofast_ops import spec, stable_probs

    for seed, xscale in ((0, 1.0), (1, 30.0), (2, 0.01)):  # 30: near one-hot attention, ||P_l|| up to sqrt(n)
        X, w = make(seed, n=7, d=8, h=2, batch=(3,), xscale=xscale)
        P = stable_probs(X, w, causal).reshape(3, w.h, 7, 7)
        exact = (1.0 if residual else 0.0) + (spec(P) * w.VO_norm()).sum(-1)
        vo_fro = torch.linalg.matrix_norm(w.VO(), "fro")
        low = (1.0 if residual else 0.0) + (vo_fro / math.sqrt(w.wv.shape[-1])).sum()
        assert bool((low <= exact * (1 + 1e-12)).all())
        for upper in (0.5 * low.expand(3), (low + exact) / 2, 2 * exact, torch.full((3,), math.inf, dtype=DT),
                      torch.tensor([0.5 * float(low), math.nan, 2 * float(exact.max())], dtype=DT)):
            got = torch.minimum(upper, L._eq9_cap(P, w, residual, None, upper))
            torch.testing.assert_close(got, torch.minimum(upper, exact), rtol=0, atol=0, equal_nan=True)
        skipped = L._eq9_cap(P, w, residual, None, 0.5 * low.expand(3))
        assert bool(torch.isinf(skipped).all())  # really not computed there


def test_eq9_cap_keeps_its_value_under_rounding():
    """The skip test leaves room for rounding: where wv wo nearly cancels (||wv wo||_F = 4e-8 while the Gram form of
    it rounds to about 11) and, in float32, where eq. 9 is tight (identical tokens, VO = c x orthogonal: every
    singular value equal), an estimate just above eq. 9 is still capped by it."""
    from harness.bounds.lofast_ops import spec, stable_probs

    g = torch.Generator().manual_seed(1)
    wq, wk = (torch.randn(1, 4, 2, generator=g, dtype=DT) for _ in range(2))
    u, a, r = (torch.randn(4, generator=g, dtype=DT) for _ in range(3))
    wv = torch.stack([u, u], -1)[None]  # equal columns; rows a 1e8 and -a 1e8 + 1e-8 r: VO = u (1e-8 r)^T
    w = AttentionWeights(wq, wk, wv, torch.stack([a * 1e8, -a * 1e8 + 1e-8 * r])[None])
    gram = ((wv.transpose(-1, -2) @ wv) * (w.wo @ w.wo.transpose(-1, -2))).sum()
    assert float(gram.abs().sqrt()) > 1e3 * float(torch.linalg.matrix_norm(w.VO(), "fro"))  # the rounding is large
    X = torch.randn(3, 5, 4, generator=g, dtype=DT)
    P = stable_probs(X, w).reshape(3, 1, 5, 5)
    exact = 1 + (spec(P) * w.VO_norm()).sum(-1)
    for up in (exact * 1.2, exact * (1 + 1e-12)):
        assert torch.equal(torch.minimum(up, L._eq9_cap(P, w, True, None, up)), exact)
    for seed in range(60):
        g = torch.Generator().manual_seed(seed)
        Q1, Q2 = (torch.linalg.qr(torch.randn(8, 8, generator=g, dtype=DT)).Q for _ in range(2))
        w = AttentionWeights(torch.randn(1, 8, 8, generator=g), torch.randn(1, 8, 8, generator=g),
                             (3 * Q1).float()[None], Q2.float()[None])
        X = torch.randn(1, 8, generator=g).expand(5, 8)[None]  # P = ones / n: ||P|| = 1
        P = stable_probs(X, w).reshape(1, 1, 5, 5)
        exact = 1.0 + (spec(P) * w.VO_norm()).sum(-1)
        for up in (exact, torch.nextafter(exact, torch.full_like(exact, 9.0))):
            assert torch.equal(torch.minimum(up, L._eq9_cap(P, w, True, None, up)), torch.minimum(up, exact)), seed


def test_float32_agrees_with_float64():
    """Stated tolerance: float32 results within 1e-4 relative of float64 (Lanczos tol 1e-5 in float32)."""
    X, w = make(8, n=6, d=8, h=2, scale=1.5, batch=(3,))
    X32, w32 = X.float(), w.to(torch.float32)
    for f in (L.zeta, L.m_norms, L.xi, L.lipschitz_upper, lambda Z, v: L.delta(Z, v, 0.1)):
        a, b = f(X, w), f(X32, w32)
        assert b.dtype == torch.float32
        assert rel(b.double(), a) <= 1e-4
    with pytest.raises(ValueError, match="weights have dtype"):  # the one input rule: never cast silently
        L.zeta(X32, w)


def test_return_info_and_nonconvergence_reported():
    X, w = make(9, batch=(2,))
    v, info = L.delta(X, w, 0.1, return_info=True)
    assert torch.equal(v, L.delta(X, w, 0.1))
    assert info.converged.shape == (2,) and bool(info.converged.all())
    assert info.m.value.shape == (2, w.h) and info.zeta.value.shape == (2,)
    with pytest.warns(NonConvergenceWarning):
        _, info = L.m_norms(X, w, iters=1, return_info=True)
    assert not bool(info.converged.all())


def test_eps_zero_and_tensor_eps():
    X, w = make(10, batch=(3,))
    assert torch.equal(L.delta(X, w, 0.0), torch.zeros(3, dtype=DT))
    assert torch.equal(L.pgd_sensitivity(X, w, 0.0, steps=3, restarts=1), torch.zeros(3, dtype=DT))
    e = torch.tensor([0.1, 0.2, 0.3], dtype=DT)
    per = torch.stack([L.delta(X[i], w, float(e[i])) for i in range(3)])
    assert rel(L.delta(X, w, e), per) <= 1e-10


# ---- bad input -----------------------------------------------------------------------------------------------
def test_bad_inputs_raise_value_error():
    X, w = make(11)
    bad = [
        lambda: L.delta(X, w, -0.1),
        lambda: L.delta(X, w, float("nan")),
        lambda: L.delta(X, w, torch.tensor([0.1, 0.2], dtype=DT)),  # eps does not match the batch
        lambda: L.delta21(X, w, 0.1, softmax_lip=0.3),
        lambda: L.zeta(X[:, :5], w),  # d mismatch
        lambda: L.m_norms(torch.full_like(X, float("nan")), w),
        lambda: L.xi(X[:0], w),  # empty sequence
        lambda: L.zeta(X, "not weights"),
        lambda: L.pgd_sensitivity(X, w, -1.0),
        lambda: L.lipschitz_upper(X.long(), w),
    ]
    for f in bad:
        with pytest.raises(ValueError):
            f()
    with pytest.raises(ValueError, match="bias"):
        m_dense_matrix(X, make(0, bias=True)[1], 0)
