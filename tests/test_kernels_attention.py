"""harness.kernels.attention against explicit per-head loops (float64)."""
import math

import pytest
import torch

from harness.kernels.attention import AttentionWeights, attention, augment_input, probs


def naive_attention(X, w, residual=False, causal=False):
    """Explicit loop over heads, docs/math.md §0 with biases."""
    n = X.shape[0]
    out = torch.zeros_like(X)
    for l in range(w.h):
        q = X @ w.wq[l] + (0 if w.bq is None else w.bq[l])
        k = X @ w.wk[l] + (0 if w.bk is None else w.bk[l])
        v = X @ w.wv[l] + (0 if w.bv is None else w.bv[l])
        S = q @ k.T / math.sqrt(w.dh)
        if causal:
            for i in range(n):
                for j in range(i + 1, n):
                    S[i, j] = -float("inf")
        P = torch.softmax(S, dim=-1)
        out = out + P @ v @ w.wo[l]
    if w.bo is not None:
        out = out + w.bo
    return out + X if residual else out


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_matches_loop(bias, residual, causal):
    g = torch.Generator().manual_seed(1)
    w = AttentionWeights.random(12, 3, scale=2.0, generator=g, bias=bias)
    X = torch.randn(4, 6, 12, dtype=torch.float64, generator=g)
    Y = attention(X, w, residual=residual, causal=causal)
    for b in range(4):
        torch.testing.assert_close(Y[b], naive_attention(X[b], w, residual, causal), rtol=1e-12, atol=1e-12)


def test_probs_rows_and_mask():
    g = torch.Generator().manual_seed(2)
    w = AttentionWeights.random(8, 2, generator=g)
    X = torch.randn(5, 8, dtype=torch.float64, generator=g)
    P = probs(X, w, causal=True)
    assert P.shape == (2, 5, 5)
    torch.testing.assert_close(P.sum(-1), torch.ones(2, 5, dtype=torch.float64))
    assert torch.all(P.triu(1) == 0)


def test_from_dense_matches_split():
    g = torch.Generator().manual_seed(3)
    d, h = 8, 2
    Wq, Wk, Wv, Wo = (torch.randn(d, d, dtype=torch.float64, generator=g) for _ in range(4))
    w = AttentionWeights.from_dense(Wq, Wk, Wv, Wo, heads=h)
    X = torch.randn(5, d, dtype=torch.float64, generator=g)
    # reference: standard multi-head attention with concatenated heads
    q, k, v = (X @ W for W in (Wq, Wk, Wv))
    outs = []
    for l in range(h):
        sl = slice(l * d // h, (l + 1) * d // h)
        P = torch.softmax(q[:, sl] @ k[:, sl].T / math.sqrt(d // h), -1)
        outs.append(P @ v[:, sl])
    ref = torch.cat(outs, -1) @ Wo
    torch.testing.assert_close(attention(X, w), ref)


def test_augmented_equals_biased():
    g = torch.Generator().manual_seed(4)
    w = AttentionWeights.random(6, 2, generator=g, bias=True)
    w = AttentionWeights(w.wq, w.wk, w.wv, w.wo, w.bq, w.bk, w.bv, None)
    X = torch.randn(5, 6, dtype=torch.float64, generator=g)
    Ya = attention(augment_input(X), w.augmented())
    torch.testing.assert_close(Ya[:, :6], attention(X, w))
    assert torch.all(Ya[:, 6] == 0)


def test_follows_dtype():
    w = AttentionWeights.random(4, 2, dtype=torch.float32)
    X = torch.randn(3, 4)
    assert attention(X, w).dtype == torch.float32


def test_bad_inputs():
    w = AttentionWeights.random(8, 2)
    with pytest.raises(ValueError, match="feature dimension"):
        attention(torch.randn(3, 7, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="NaN or inf"):
        attention(torch.tensor([[float("nan")] * 8], dtype=torch.float64), w)
    with pytest.raises(ValueError, match="empty"):
        attention(torch.zeros(0, 8, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="shape"):
        attention(torch.zeros(8, dtype=torch.float64), w)
    with pytest.raises(ValueError, match="not divisible"):
        AttentionWeights.random(7, 2)
    with pytest.raises(ValueError, match="not divisible"):
        AttentionWeights.from_dense(*(torch.randn(6, 6) for _ in range(4)), heads=4)
    with pytest.raises(ValueError, match="wk has shape"):
        AttentionWeights(torch.randn(2, 4, 2), torch.randn(2, 4, 3), torch.randn(2, 4, 2), torch.randn(2, 2, 4))
    with pytest.raises(ValueError, match="wo has shape"):
        AttentionWeights(torch.randn(2, 4, 2), torch.randn(2, 4, 2), torch.randn(2, 4, 2), torch.randn(2, 4, 2))
    with pytest.raises(ValueError, match="bq has shape"):
        AttentionWeights(*(torch.randn(2, 4, 2) for _ in range(3)), torch.randn(2, 2, 4), bq=torch.randn(4))
    with pytest.raises(ValueError, match="NaN or inf"):
        AttentionWeights(torch.full((1, 2, 2), float("inf")), *(torch.randn(1, 2, 2) for _ in range(3)))
    with pytest.raises(ValueError, match="biases"):
        AttentionWeights.random(4, 2, bias=True).require_no_bias("this bound")


@pytest.mark.parametrize("d,h,bias", [(12, 3, False), (12, 3, True), (4, 1, False), (6, 6, True)])
def test_factored_norms_match_dense_svd(d, h, bias):
    """A_norm / B_norm / VO_norm (QR of the rank-dh factors) equal the SVD of the explicit d x d products,
    also for the augmented (d+1)-feature weights and for dh = d and dh = 1."""
    g = torch.Generator().manual_seed(d + h)
    w = AttentionWeights.random(d, h, scale=0.7, dtype=torch.float64, generator=g, bias=bias)
    for ww in (w, w.augmented()):
        for got, M in ((ww.A_norm(), ww.A()), (ww.B_norm(), ww.B()), (ww.VO_norm(), ww.VO())):
            ref = torch.linalg.matrix_norm(M, ord=2)  # (h,)
            assert got.shape == ref.shape == (h,)
            assert torch.allclose(got, ref, rtol=1e-12, atol=0)
