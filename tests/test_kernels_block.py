"""The post-LN block map (kernels.block) and the attention.self map of castin_sqrt_n_adversarial, against the
Hugging Face modules and a dense float64 Jacobian."""
import copy

import pytest
import torch

from harness.errors import UnsupportedContext
from harness.kernels import block as B
from harness.kernels import layer as L
from harness.models import blocks, hf, text


@pytest.fixture(scope="module")
def tiny():
    lay = text.layer_inputs("tiny-bert", "synthetic", [0], 6, 3, chunk_seed=1)[0]
    lnw, lnb, eps = blocks.post_ln("tiny-bert", 0)
    mod = copy.deepcopy(hf._layer(text.load("tiny-bert").model, 0).attention).double().eval()
    return lay, B.block_map(lay.w, lnw, lnb, eps), mod


def _dense_norms(F, X):
    n, d = X.shape[-2:]
    out = []
    for x in X:
        J = torch.func.jacrev(lambda z: F(z[None])[0])(x).reshape(n * d, n * d)
        out.append(torch.linalg.matrix_norm(J, 2))
    return torch.stack(out)


def test_block_map_is_bert_attention(tiny):
    lay, F, mod = tiny
    with torch.no_grad():
        ref = mod(lay.X)[0]
    assert torch.allclose(F(lay.X), ref, atol=1e-12, rtol=0)


def test_block_lipschitz_matches_dense(tiny):
    lay, F, _ = tiny
    res = B.block_lipschitz(F, lay.X, lay.w.d, tol=1e-10)
    dense = _dense_norms(F, lay.X)
    assert bool(res.converged.all())
    torch.testing.assert_close(res.value, dense, rtol=1e-6, atol=0)


def test_block_paper_value_is_sqrt_norm_of_jt_fx(tiny):
    lay, _, _ = tiny
    n, d = lay.X.shape[-2:]
    g = torch.Generator().manual_seed(0)
    lnw, lnb = 1 + torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    F = B.block_map(lay.w, lnw, lnb, 1e-12)  # trained-like LayerNorm (random init has weight 1, bias 0)
    want = []
    for x in lay.X:
        J = torch.func.jacrev(lambda z: F(z[None])[0])(x).reshape(n * d, n * d)
        want.append((J.T @ F(x[None])[0].reshape(-1)).norm().sqrt())
    torch.testing.assert_close(B.block_paper_value(F, lay.X), torch.stack(want), rtol=1e-8, atol=0)


def test_block_paper_value_vanishes_under_identity_layernorm(tiny):
    """LN with weight 1 and bias 0 (random init) outputs a fixed-norm vector per token, so J^T F(X) = 0: the
    authors' estimator is rounding noise there (castin_sqrt_n_block's summary says so for random weights)."""
    lay, F, _ = tiny
    lip = B.block_lipschitz(F, lay.X, lay.w.d).value
    assert bool((B.block_paper_value(F, lay.X) < 1e-4 * lip).all())


def test_post_ln_refuses_gpt2(monkeypatch):
    from harness.models import text

    # the block map needs no tokenizer; GPT-2's may be absent offline (no hub cache, no mirror)
    monkeypatch.setattr(text, "tokenizer_for", lambda *a, **k: None)
    text._cached.cache_clear()
    with pytest.raises(UnsupportedContext, match="post-LN"):
        blocks.post_ln("tiny-gpt2", 0)
    text._cached.cache_clear()


def test_self_map_is_hf_attention_self(tiny):
    from experiments.castin.sqrt_n_adversarial import self_map

    lay, _, mod = tiny
    with torch.no_grad():
        ref = mod.self(lay.X)[0]  # BertSelfAttention: heads concatenated, no W^O
    got = L.layer_map(self_map(lay.w))(lay.X)
    assert torch.allclose(got, ref, atol=1e-12, rtol=0)
