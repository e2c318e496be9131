"""The per-ball softmax constant c_l(eps) (harness.bounds.lofast_refined): the row lemma against explicit softmax
Jacobians, the softmax term and Theorem 1 against PGD on fuzzed inputs (near-one-hot rows, huge scores, eps from
1e-3 to 1), and the refined certificate beside the paper's."""
import math

import pytest
import torch

from harness.bounds import lofast, lofast_refined
from harness.bounds.lofast_pgd import pgd_delta21, pgd_sensitivity
from harness.kernels.attention import AttentionWeights

D64 = torch.float64


def _jsm_norm(p):  # exact ||diag(p) - p p^T||, (..., n) -> (...,)
    J = torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)
    return torch.linalg.matrix_norm(J, ord=2)


def _row_constant(s, rho):  # the lemma's c for one score row s (..., n) and a change of norm <= rho
    logp = torch.log_softmax(s, -1)
    p = logp.exp()
    dist = (torch.eye(s.shape[-1], dtype=s.dtype) - p.unsqueeze(-2)).norm(dim=-1)  # ||e_k - p||
    return torch.exp((logp + rho.unsqueeze(-1) * dist).amax(-1).clamp(max=math.log(0.5)))


def test_row_lemma_along_the_segment_on_10000_rows():
    """max over the segment s + t D of ||J_sm|| <= c(rho) for ||D|| <= rho: random and adversarial directions,
    scores from 1e-2 to 1e3 in scale (near-one-hot rows), rho from 1e-3 to 10."""
    g = torch.Generator().manual_seed(0)
    N, n = 10_000, 5
    scale = 10 ** (torch.rand(N, 1, generator=g, dtype=D64) * 5 - 2)
    s = torch.randn(N, n, generator=g, dtype=D64) * scale
    rho = 10 ** (torch.rand(N, generator=g, dtype=D64) * 4 - 3)
    p = torch.softmax(s, -1)
    k = torch.randint(0, n, (N,), generator=g)
    adversarial = torch.nn.functional.one_hot(k, n).to(D64) - p  # grows p_k fastest
    random = torch.randn(N, n, generator=g, dtype=D64)
    c = _row_constant(s, rho)
    assert (c <= 0.5).all() and (c > 0).all()
    worst = torch.zeros(N, dtype=D64)
    for direction in (adversarial, random):
        D = direction / direction.norm(dim=-1, keepdim=True).clamp_min(1e-300) * rho.unsqueeze(-1)
        for t in torch.linspace(0, 1, 41, dtype=D64):
            worst = torch.maximum(worst, _jsm_norm(torch.softmax(s + t * D, -1)))
    assert (worst <= c * (1 + 1e-12) + 1e-15).all(), float((worst - c).max())
    assert (c < 0.5).float().mean() > 0.3  # the lemma is not vacuous on this sample


def _fuzz_cases(N, seed):
    """N small layers: n in {2, 3, 4}, d = 4, h = 2, weights scaled so scores reach ~1e3 (near-one-hot rows)."""
    g = torch.Generator().manual_seed(seed)
    for n in (2, 3, 4):
        w = AttentionWeights.random(d=4, h=2, generator=g)
        big = 10 ** (torch.rand(N, 1, 1, generator=g, dtype=D64) * 2.5)  # token scale 1 .. ~300
        X = torch.randn(N, n, 4, generator=g, dtype=D64) * big.sqrt()
        eps = 10 ** (torch.rand(N, generator=g, dtype=D64) * 3 - 3)  # 1e-3 .. 1
        yield X, w, eps


def test_softmax_term_above_pgd_on_fuzzed_cases():
    """||P_l(X') - P_l(X)||_F <= c_l(eps)/sqrt(dh) (||M_l|| + ||B_l|| eps) eps per head: 3 x 3,400 cases x 2 heads,
    0 violations, and c_l(eps) < 1/2 somewhere (the refinement is used, not only the cap)."""
    used = 0
    for X, w, eps in _fuzz_cases(3400, seed=1):
        c = lofast_refined.softmax_constant(lofast_refined.row_terms(X, w), eps)  # (N, h)
        m = lofast.m_norms(X, w)
        bound = c * eps[:, None] / math.sqrt(w.dh) * (m + w.B_norm() * eps[:, None])
        lower = pgd_delta21(X, w, eps, steps=30, restarts=2)
        assert (lower <= bound * (1 + 1e-6) + 1e-12).all(), float((lower - bound).max())
        used += int((c < 0.45).sum())
    assert used > 100


def test_theorem1_refined_above_pgd_and_below_sharp():
    for X, w, eps in _fuzz_cases(400, seed=2):
        for residual in (True, False):
            ref = lofast_refined.delta(X, w, eps, residual=residual)
            sharp = lofast.delta(X, w, eps, residual=residual, softmax_lip=0.5)
            lower = pgd_sensitivity(X, w, eps, residual=residual, steps=30, restarts=2)
            assert (lower <= ref * (1 + 1e-6)).all()
            assert (ref <= sharp * (1 + 1e-12)).all()


def test_near_one_hot_two_tokens_large_scores():
    """Two tokens, A = 50 I, eps = 0.86: a float product p_k * exp(...) would give c = 0 (0 * inf) here; in log
    space the constant keeps the top probability and the bound stays above PGD's sqrt(2)-sized change."""
    d = 2
    eye = torch.eye(d, dtype=D64)
    w = AttentionWeights.from_dense(eye * math.sqrt(50.0), eye * math.sqrt(50.0), eye, eye, heads=1)
    X = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=D64) * 3.0  # scores 450 vs 0: one-hot rows
    eps = 0.86 * 3
    c = lofast_refined.softmax_constant(lofast_refined.row_terms(X, w), eps)
    assert torch.isfinite(c).all() and float(c.min()) > 0
    lower = pgd_delta21(X, w, eps, steps=100, restarts=4)
    m = lofast.m_norms(X, w)
    bound = c * eps / math.sqrt(w.dh) * (m + w.B_norm() * eps)
    assert (lower <= bound).all()
    # at eps = 0 a one-hot row's constant is 2 (1 - p_k*) = 2 exp(-450 / sqrt(2)) summed from the other entry, not
    # the cap 1/2 of max_k p_k and not a rounded 0; with onehot=False, the cap
    at0 = float(lofast_refined.softmax_constant(lofast_refined.row_terms(X, w), 0.0).min())
    assert at0 == pytest.approx(2 * math.exp(-450 / math.sqrt(2)), rel=1e-9) and at0 > 0
    assert float(lofast_refined.softmax_constant(lofast_refined.row_terms(X, w), 0.0, onehot=False).min()) == 0.5


def test_causal_and_bias_against_pgd():
    g = torch.Generator().manual_seed(3)
    w = AttentionWeights.random(d=6, h=3, generator=g)
    w = AttentionWeights(w.wq, w.wk, w.wv, w.wo, bq=torch.randn(3, 2, generator=g, dtype=D64),
                         bk=torch.randn(3, 2, generator=g, dtype=D64))
    X = torch.randn(64, 5, 6, generator=g, dtype=D64) * 2
    for eps in (1e-3, 0.1, 1.0):
        c = lofast_refined.softmax_constant(lofast_refined.row_terms(X, w, causal=True), eps)
        assert (c <= 0.5).all()
        ref = lofast_refined.delta(X, w, eps, residual=False, causal=True)
        assert (pgd_sensitivity(X, w, eps, residual=False, steps=30, restarts=2) <= ref * (1 + 1e-6)).all()


def test_limit_is_a_local_lipschitz_bound():
    from harness.kernels.power import jacobian_norm
    from harness.kernels.attention import attention

    g = torch.Generator().manual_seed(4)
    w = AttentionWeights.random(d=8, h=2, generator=g)
    X = torch.randn(16, 6, 8, generator=g, dtype=D64) * 3
    up = lofast_refined.lipschitz_upper(X, w, residual=False)
    true = jacobian_norm(lambda Y: attention(Y, w), X)
    assert (true <= up * (1 + 1e-6)).all()
    assert (up <= lofast.lipschitz_upper(X, w, residual=False, softmax_lip=0.5) * (1 + 1e-12)).all()


def test_eps_validation():
    w = AttentionWeights.random(d=4, h=2, generator=torch.Generator().manual_seed(0))
    t = lofast_refined.row_terms(torch.randn(1, 3, 4, dtype=D64), w)
    with pytest.raises(ValueError, match="eps"):
        lofast_refined.softmax_constant(t, -1.0)


def test_registry_entry_equals_the_module_and_is_sound():
    """The registered eps -> 0 bound (leaderboard, analyze) equals lofast_refined.lipschitz_upper, the value the
    certificate's 'refined' bound tends to, and is >= the truth; at most LoFAST's sharpened bound."""
    from harness.bounds import registry

    g = torch.Generator().manual_seed(5)
    w = AttentionWeights.random(d=8, h=2, generator=g)
    X = torch.randn(6, 5, 8, generator=g, dtype=D64) * 2
    ev = registry.evaluate(X, w, names=["lofast_refined", "lofast_sharp"])
    ref = ev.values[("lofast_refined", "layer")]
    assert torch.allclose(ref, lofast_refined.lipschitz_upper(X, w, residual=False), rtol=1e-9)
    assert (ref <= ev.values[("lofast_sharp", "layer")] * (1 + 1e-12)).all()
    rows = [r for r in ev.rows() if r["method"] == "lofast_refined"]
    assert rows and all(r["sound"] for r in rows)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("scale", [0.5, 3.0, 40.0])  # spread rows, peaked rows, near-one-hot rows (c = 1/2)
def test_constant_at_zero_is_the_per_ball_constant_at_eps_zero(causal, scale):
    """constant_at_zero(P), which the registry's eps -> 0 entry reads off the shared state, is softmax_constant at
    eps = 0 (derived there, not a second formula)."""
    from harness.kernels.attention import probs

    g = torch.Generator().manual_seed(11)
    w = AttentionWeights.random(d=9, h=3, generator=g)
    X = torch.randn(4, 7, 9, generator=g, dtype=D64) * scale
    want = lofast_refined.softmax_constant(lofast_refined.row_terms(X, w, causal), 0.0)
    got = lofast_refined.constant_at_zero(probs(X, w, causal))
    assert got.shape == want.shape == (4, 3)
    assert torch.allclose(got, want, rtol=1e-12, atol=0)  # sums of probabilities against exp(logsumexp(log p))
    assert (got <= 0.5).all() and (got > 0).all()


@pytest.mark.parametrize("bias", [False, True])
def test_key_side_is_the_dense_norm(bias):
    # ||wq_l K_l^T|| from the factors' R against the dense (d x n) product's SVD, biases (Remark 2) included
    g = torch.Generator().manual_seed(11)
    w = AttentionWeights.random(16, 4, scale=1.0, generator=g, dtype=D64, bias=bias)
    X = torch.randn(2, 9, 16, generator=g, dtype=D64)
    t = lofast_refined.row_terms(X, w)
    wp = lofast_refined.prepare(X, w)
    K = lofast_refined.query_key(X, wp)[1]
    dense = torch.linalg.matrix_norm(wp.wq @ K.transpose(-1, -2), ord=2)
    assert t.key_side.shape == (2, 4)
    torch.testing.assert_close(t.key_side, dense, rtol=1e-13, atol=0)
