"""Castin et al. (docs/math.md §3): Jacobian formula, Thm 3.3/3.5 upper bounds, Prop. 3.4/3.6 lower bounds,
Thm 3.7, weighted self-attention (Def. C.4) and mass splitting."""
import math

import pytest
import torch

from harness.bounds import castin, jasmin
from harness.kernels.attention import AttentionWeights, attention
from harness.kernels.pgd import pgd_maximize

DT = torch.float64


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


@pytest.mark.parametrize("causal", [False, True])
def test_head_maps_sum_to_the_layer(causal):
    g = _gen(0)
    w = AttentionWeights.random(6, 3, generator=g, bias=True)
    X = torch.randn(2, 5, 6, generator=g, dtype=DT)
    Xr = X.unsqueeze(-3).expand(2, 3, 5, 6)
    out = castin.head_attention(Xr, w, causal).sum(-3) + w.bo
    assert torch.allclose(out, attention(X, w, causal=causal), atol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
def test_lemma_c2_d1_formula_equals_jacrev(causal):
    g = _gen(1)
    w = AttentionWeights.random(4, 2, scale=3.0, generator=g)
    X = torch.randn(2, 5, 4, generator=g, dtype=DT)
    dense = castin.dense_head_jacobians(X, w, causal)  # (2, h, nd, nd) by jacrev
    for b in range(2):
        for l in range(2):
            assert _rel(castin.attention_jacobian(X[b], w, l, causal), dense[b, l]) <= 1e-10
    # batched matrix-free form of the formula
    D = torch.randn(2, 5, 4, generator=g, dtype=DT)
    jd = castin.jacobian_formula(X, w.A()[0], w.VO()[0], D, causal=causal)
    ref = (dense[:, 0] @ D.flatten(1).unsqueeze(-1)).reshape(2, 5, 4)
    assert _rel(jd, ref) <= 1e-10


def test_lemma_c6_weighted_formula_and_norm_equal_dense():
    g = _gen(2)
    d, n = 3, 4
    A = torch.randn(d, d, generator=g, dtype=DT)
    V = torch.randn(d, d, generator=g, dtype=DT)
    X = torch.randn(n, d, generator=g, dtype=DT)
    m = torch.rand(n, generator=g, dtype=DT) + 0.05
    m = m / m.sum()
    J = torch.func.jacrev(lambda Z: castin.weighted_attention(Z, m, A, V))(X).reshape(n * d, n * d)
    assert _rel(castin.dense_jacobian_formula(X, A, V, masses=m), J) <= 1e-10
    dense = torch.linalg.matrix_norm(castin.weighted_dense_jacobian(X, m, A, V), ord=2)
    val = castin.weighted_jacobian_norm(X, m, A, V)
    assert abs(float(val / dense) - 1) <= 1e-6
    # uniform masses: Euclidean Jacobian norm; masses are scale-free
    Ju = torch.func.jacrev(lambda Z: torch.softmax(Z @ A @ Z.T, -1) @ Z @ V)(X).reshape(n * d, n * d)
    assert abs(float(castin.weighted_jacobian_norm(X, None, A, V) / torch.linalg.matrix_norm(Ju, ord=2)) - 1) <= 1e-6
    assert abs(float(castin.weighted_jacobian_norm(X, 7 * m, A, V) / val) - 1) <= 1e-8


@pytest.mark.parametrize("causal", [False, True])
def test_theorem33_bounds_local_lipschitz_over_the_ball(causal):
    worst = 0.0
    for seed, scale in [(0, 0.2), (1, 1.0), (2, 4.0)]:
        for bias in (False, True):
            g = _gen(10 + seed)
            w = AttentionWeights.random(4, 2, scale=scale, generator=g, bias=bias)
            X = torch.randn(3, 5, 4, generator=g, dtype=DT) * (1 + seed)
            b = castin.bound(X, w, causal)  # (3, h)
            true = castin.head_lipschitz_dense(X, w, causal)
            assert bool((b >= true).all())
            worst = max(worst, float((true / b).max()))
            # Thm 3.3 covers every X' in B_R^n, R = max token norm of X: sample such points
            R = X.norm(dim=-1).amax(-1)  # (3,)
            Y = torch.randn(3, 5, 4, generator=g, dtype=DT)
            Y = Y / Y.norm(dim=-1, keepdim=True) * R[:, None, None] * torch.rand(3, 5, 1, generator=g, dtype=DT)
            assert bool((b >= castin.head_lipschitz_dense(Y, w, causal)).all())
    assert worst > 1e-3


def test_theorem33_ge_pgd_lower_bound_on_the_ball():
    """PGD on ||Df(X')||_2-proxy ||J(X') u|| over X' near X (tokens kept in B_R) never beats Thm 3.3."""
    g = _gen(4)
    w = AttentionWeights.random(3, 1, scale=3.0, generator=g)
    X = torch.randn(2, 4, 3, generator=g, dtype=DT)
    R = X.norm(dim=-1).amax(-1)
    b = castin.bound(X, w)[:, 0]
    u = torch.randn(2, 4, 3, generator=g, dtype=DT)
    u = u / u.flatten(1).norm(dim=-1)[:, None, None]
    Xr = lambda Z: Z.unsqueeze(1)  # noqa: E731 (h = 1)

    def obj(Z):  # ||J(Z') u|| with Z' projected token-wise onto B_R: a lower bound of Lip on B_R^n
        Zp = Z * torch.clamp(R[:, None, None] / Z.norm(dim=-1, keepdim=True), max=1.0)
        f = lambda Y: castin.head_attention(Xr(Y), w)  # noqa: E731
        return torch.func.jvp(f, (Zp,), (u,))[1].flatten(1).norm(dim=-1)

    res = pgd_maximize(obj, X, 1.0, steps=15, restarts=1, seed=0)
    assert bool((res.value <= b).all()) and bool((res.value > 0).all())


def test_meanfield_bound_dominates_weighted_and_euclidean():
    g = _gen(5)
    w = AttentionWeights.random(3, 1, scale=1.5, generator=g)
    A, V = w.A()[0], w.VO()[0]
    for R in (0.5, 1.0, 2.0):
        mf = castin.meanfield_bound(w, R)[0]
        X = torch.randn(4, 6, 3, generator=g, dtype=DT)
        X = X / X.norm(dim=-1, keepdim=True) * R * torch.rand(4, 6, 1, generator=g, dtype=DT)
        m = torch.rand(4, 6, generator=g, dtype=DT) + 0.01
        assert bool((castin.weighted_jacobian_norm(X, m, A, V) <= mf).all())
        assert bool((castin.head_lipschitz_dense(X, w)[:, 0] <= mf).all())
    assert castin.meanfield_bound(w, torch.tensor([1.0, 2.0], dtype=DT)).shape == (2, 1)


def test_prop34_lower_bound_at_adversarial_input():
    for seed in range(2):
        g = _gen(20 + seed)
        w = AttentionWeights.random(3, 1, scale=2.0, generator=g)  # d = 3: A_c has a real eigenvalue
        w2 = AttentionWeights.random(6, 2, scale=2.0, generator=g)  # d = 6, dh = 3
        for ww in (w, w2):
            for n in (2, 5, 9):
                for R in (0.5, 2.0):
                    lb = castin.lower_bound(ww, n, R)  # (h,)
                    for l in range(ww.h):
                        Xa = castin.adversarial_input(ww, l, n, R)
                        assert Xa.shape == (n, ww.d)
                        assert float(Xa.norm(dim=-1).max()) == pytest.approx(R)
                        true = float(castin.head_lipschitz_dense(Xa, ww.head(l))[0])
                        assert lb[l] <= true * (1 + 1e-9)
                        assert true <= 10 * lb[l]  # fairly tight (measured ratio 1.1 - 5)
                        assert true <= float(castin.bound(Xa, ww)[l])
                        assert true <= float(jasmin.bound(Xa, ww)[l]) * (1 + 1e-9)  # stress input for JaSMin too


def test_gamma_matches_eigenvalues_and_complex_case():
    # A = wq wk^T / sqrt(dh) with dh = d = 2: build wq, wk so that A_c = A^T has eigenvalues {3, -1}
    Ac = torch.tensor([[3.0, 1.0], [0.0, -1.0]], dtype=DT)
    A = Ac.T * math.sqrt(2)
    wq, wk = A.clone(), torch.eye(2, dtype=DT)
    z = torch.eye(2, dtype=DT)
    w = AttentionWeights(wq[None], wk[None], z[None], z[None])
    assert float(castin.gamma(w)[0]) == pytest.approx(2.0)  # max(3/4, -2 * -1)
    c = castin.prop34_choice(w)[0]
    assert c["case"] == "min" and float(c["lam"]) == pytest.approx(-1.0)
    assert torch.allclose(Ac @ c["u"], -c["u"], atol=1e-12)  # eigenvector of A_c, not of A
    # a rotation has no real eigenvalue: gamma is NaN and the construction refuses
    rot = torch.tensor([[0.0, -1.0], [1.0, 0.0]], dtype=DT)
    wr = AttentionWeights(rot[None], z[None], z[None], z[None])
    assert math.isnan(float(castin.gamma(wr)[0])) and math.isnan(float(castin.lower_bound(wr, 4, 1.0)[0]))
    with pytest.raises(ValueError, match="no real eigenvalue"):
        castin.adversarial_input(wr, 0, 4, 1.0)


def test_prop36_edge_regime_asymptotics():
    z = torch.eye(1, dtype=DT)
    for a in (-0.5, 0.5):  # case "min" then case "max"
        w = AttentionWeights(torch.tensor([[[a]]], dtype=DT), z[None], z[None], z[None])
        ratios = []
        for R in ((1.0, 2.0, 3.0, 4.0) if a < 0 else (2.0, 4.0, 6.0)):
            X, m = castin.edge_regime_input(w, 0, R)
            val = castin.weighted_jacobian_norm(X, m, w.A()[0], w.VO()[0])
            ratios.append(float(val / castin.edge_regime_lower_bound(w, R)[0]))
            assert val <= castin.meanfield_bound(w, R)[0]
        assert all(r1 > r2 >= 1 for r1, r2 in zip(ratios, ratios[1:]))  # decreasing to 1
        assert ratios[-1] < 1.6


def test_theorem37_large_radius_limit():
    g = _gen(6)
    w = AttentionWeights.random(4, 2, scale=1.0, generator=g)
    X = torch.randn(6, 4, generator=g, dtype=DT)
    lim = castin.large_radius_limit(X, w)
    assert bool((lim <= torch.linalg.matrix_norm(w.VO(), ord=2) * math.sqrt(6) + 1e-12).all())
    for causal in (False, True):
        lim = castin.large_radius_limit(X, w, causal)
        true = castin.head_lipschitz_dense(40 * X, w, causal)
        assert _rel(true, lim) <= 1e-3


def test_mass_splitting_example_both_routes():
    X = torch.tensor([[-3.0], [-0.3]], dtype=DT)
    A, V = torch.tensor([[-2.0]], dtype=DT), torch.tensor([[1.0]], dtype=DT)
    t = castin.split_terms(X, None, A, V)
    assert round(float(t["unsplit"]), 3) == 1.382 and round(float(t["split"]), 3) == 2.011
    dup = castin.duplicated_lipschitz(X, None, A, V, copies=2)  # n = 4, Euclidean norm at the duplicated input
    Xd, md = castin.duplicate_tokens(X, None, 2)
    Jd = torch.func.jacrev(lambda Z: torch.softmax(Z @ A @ Z.T, -1) @ Z @ V)(Xd).reshape(4, 4)
    assert round(float(dup), 3) == 2.011 and round(float(torch.linalg.matrix_norm(Jd, ord=2)), 3) == 2.011
    assert abs(float(dup - t["split"])) <= 1e-8
    mp = castin.mass_splitting_map(-3.0, -0.3, 0.5, A=-2.0, V=1.0)
    assert abs(float(mp["unsplit"] - t["unsplit"])) <= 1e-10 and abs(float(mp["split"] - t["split"])) <= 1e-10
    assert bool(mp["splits"])


def test_split_criterion_equals_explicit_duplication():
    g = _gen(7)
    for trial in range(4):
        d, n = 2, 3
        A = torch.randn(d, d, generator=g, dtype=DT) * 2
        V = torch.randn(d, d, generator=g, dtype=DT)
        X = torch.randn(n, d, generator=g, dtype=DT) * 1.5
        m = torch.rand(n, generator=g, dtype=DT) + 0.1
        split = castin.split_lipschitz(X, m, A, V)
        for copies in (2, 3):
            assert abs(float(castin.duplicated_lipschitz(X, m, A, V, copies=copies) / split) - 1) <= 1e-6


def test_mass_splitting_phase_map():
    x1 = torch.linspace(-3, 3, 13, dtype=DT)
    x2 = torch.linspace(-3, 3, 11, dtype=DT)
    mp = castin.mass_splitting_map(x1[:, None], x2[None, :], 0.5, A=-2.0, V=1.0)
    assert mp["splits"].shape == (13, 11)
    assert 0 < int(mp["splits"].sum()) < 13 * 11  # splitting pays in some regions, not everywhere
    assert bool((mp["gain"] >= 1).all())
    # grid points agree with explicit duplication (4 tokens, Euclidean)
    A, V = torch.tensor([[-2.0]], dtype=DT), torch.tensor([[1.0]], dtype=DT)
    for i, j in [(0, 5), (3, 8), (10, 2)]:
        X = torch.stack([x1[i], x2[j]]).reshape(2, 1)
        if float((x1[i] - x2[j]).abs()) < 1e-12:
            continue
        dup = castin.duplicated_lipschitz(X, None, A, V)
        assert abs(float(dup / mp["split"][i, j]) - 1) <= 1e-6
    pm = castin.mass_splitting_map(-3.0, -0.3, torch.tensor([0.1, 0.5, 0.9], dtype=DT))
    assert pm["split"].shape == (3,)


def test_batched_equals_per_sample_and_float32():
    g = _gen(8)
    w = AttentionWeights.random(4, 2, scale=1.0, generator=g)
    X = torch.randn(3, 5, 4, generator=g, dtype=DT)
    b = castin.bound(X, w)
    assert torch.allclose(b, torch.stack([castin.bound(x, w) for x in X]))
    assert torch.allclose(castin.bound(X.float(), w.to(torch.float32)).double(), b, rtol=1e-5)
    hl = castin.head_lipschitz(X, w)
    assert torch.allclose(hl, castin.head_lipschitz_dense(X, w), rtol=1e-6)


def test_bad_inputs():
    g = _gen(0)
    w = AttentionWeights.random(4, 2, generator=g)
    A, V = torch.eye(2, dtype=DT), torch.eye(2, dtype=DT)
    X = torch.randn(3, 2, dtype=DT)
    with pytest.raises(ValueError, match="feature dimension"):
        castin.bound(torch.randn(3, 5, dtype=DT), w)
    with pytest.raises(ValueError, match="NaN"):
        castin.bound(torch.full((3, 4), float("nan"), dtype=DT), w)
    with pytest.raises(ValueError, match="empty"):
        castin.bound(torch.zeros(0, 4, dtype=DT), w)
    with pytest.raises(ValueError, match=">= 0"):
        castin.meanfield_bound(w, -1.0)
    with pytest.raises(ValueError, match=">= 0"):
        castin.lower_bound(w, 4, -1.0)
    with pytest.raises(ValueError, match=">= 0"):
        castin.adversarial_input(w, 0, 4, -1.0)
    with pytest.raises(ValueError, match="head index"):
        castin.adversarial_input(w, 5, 4, 1.0)
    with pytest.raises(ValueError, match="integer"):
        castin.lower_bound(w, 0, 1.0)
    with pytest.raises(ValueError, match="positive"):
        castin.weighted_jacobian_norm(X, torch.tensor([0.5, 0.5, 0.0], dtype=DT), A, V)
    with pytest.raises(ValueError, match="masses must have shape"):
        castin.weighted_attention(X, torch.ones(2, dtype=DT), A, V)
    with pytest.raises(ValueError, match="A must have shape"):
        castin.weighted_attention(X, None, torch.eye(3, dtype=DT), V)
    with pytest.raises(ValueError, match="strictly inside"):
        castin.mass_splitting_map(0.0, 1.0, 1.0)
    wb = AttentionWeights.random(4, 2, generator=g, bias=True)
    with pytest.raises(ValueError, match="bias"):
        castin.lower_bound(wb, 4, 1.0)


def test_appendix_c7_quadratic_growth():
    g = _gen(9)
    w = AttentionWeights.random(4, 2, scale=1.0, generator=g)
    vals = []
    for R in (2.0, 4.0, 8.0):
        X = castin.quadratic_example_input(w, 0, 7, R)
        assert float(X[0].abs().max()) == 0 and float(X.norm(dim=-1).max()) == pytest.approx(R)
        lb = castin.first_token_lower_bound(X, w)  # (h,)
        true = castin.head_lipschitz_dense(X, w)
        assert bool((lb <= true * (1 + 1e-9)).all())
        vals.append(float(lb[0]))
    assert 3.5 < vals[2] / vals[1] < 4.5  # ~ R^2
    with pytest.raises(ValueError, match="x_1 = 0"):
        castin.first_token_lower_bound(torch.ones(3, 4, dtype=DT), w)
