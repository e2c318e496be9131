"""Model adapters: extracted AttentionWeights + hooked inputs reproduce the HF models' self-attention exactly."""
import math

import pytest
import torch

from harness.kernels.attention import attention, probs

hf = pytest.importorskip("harness.models.hf")
from harness.models import text  # noqa: E402


TINY = {
    "bert-base-uncased": {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
                          "intermediate_size": 64},
    "gpt2": {"n_embd": 32, "n_head": 4, "n_layer": 2},
}


def load_text_model(name, pretrained=None, seed=0, overrides=None, with_tokenizer=True):
    tm = text.build(name, pretrained, seed, overrides, with_tokenizer)
    return tm.model, tm.tokenizer, tm.info


def _check_roundtrip(model, ids, layers, causal):
    model = model.double()
    X, Y, P = hf.attention_outputs(model, ids, layers)
    out = model(input_ids=ids, output_attentions=True)
    for l in layers:
        w = hf.attention_weights(model, l)
        assert w.has_bias and w.dtype == torch.float64
        F = attention(X[l], w, causal=causal)  # (B, n, d)
        rel = (F - Y[l]).norm() / Y[l].norm()
        assert rel < 1e-10, f"layer {l}: rel err {rel}"
        Pk = probs(X[l], w, causal=causal)  # (B, h, n, n)
        assert (Pk - P[l]).abs().max() < 1e-10
        assert (Pk - out.attentions[l].double()).abs().max() < 1e-10


@pytest.mark.parametrize("name", ["bert-base-uncased", "gpt2"])
def test_tiny_random_models_roundtrip(name):
    model, _, info = load_text_model(name, overrides=TINY[name], seed=1, with_tokenizer=False)
    assert not info["pretrained"] and info["d"] == 32 and info["n_heads"] == 4
    assert info["causal"] == (name == "gpt2") == hf.is_causal(model)
    ids = torch.randint(0, 500, (3, 9), generator=torch.Generator().manual_seed(0))
    _check_roundtrip(model, ids, [0, 1], info["causal"])


@pytest.mark.parametrize("name", ["bert-base-uncased", "gpt2"])
def test_weights_are_the_modules_projections_bit_for_bit(name):
    """hf.attention_weights (the adapters' extraction) holds exactly the modules' projections, sliced per head,
    with the score scaling folded into wq, bq (a factor 1 for the standard 1/sqrt(dh))."""
    model, _, _ = load_text_model(name, overrides=TINY[name], seed=2, with_tokenizer=False)
    for l in (0, 1):
        if name == "gpt2":
            at = model.h[l].attn
            W, b = at.c_attn.weight.detach().double(), at.c_attn.bias.detach().double()
            Wq, Wk, Wv, bq, bk, bv = (*W.chunk(3, dim=1), *b.chunk(3))
            Wo, bo = at.c_proj.weight.detach().double(), at.c_proj.bias.detach().double()
            c = getattr(at, "scaling", 8 ** -0.5) * math.sqrt(8)
        else:
            L = model.encoder.layer[l]
            sa, dense = L.attention.self, L.attention.output.dense
            Wq, Wk, Wv, Wo = (m.weight.detach().double().T for m in (sa.query, sa.key, sa.value, dense))
            bq, bk, bv, bo = (m.bias.detach().double() for m in (sa.query, sa.key, sa.value, dense))
            c = getattr(sa, "scaling", 8 ** -0.5) * math.sqrt(8)
        Wq, bq = Wq * c, bq * c
        w = hf.attention_weights(model, l)
        heads = lambda M: M.reshape(M.shape[0], 4, 8).permute(1, 0, 2)  # (d, h*dh) -> (h, d, dh)
        for got, want in ((w.wq, heads(Wq)), (w.wk, heads(Wk)), (w.wv, heads(Wv)), (w.wo, Wo.reshape(4, 8, 32)),
                          (w.bq, bq.reshape(4, 8)), (w.bk, bk.reshape(4, 8)), (w.bv, bv.reshape(4, 8)), (w.bo, bo)):
            assert got.shape == want.shape and torch.equal(got, want)


def test_random_init_is_seeded():
    a, _, _ = load_text_model("gpt2", overrides=TINY["gpt2"], seed=3, with_tokenizer=False)
    b, _, _ = load_text_model("gpt2", overrides=TINY["gpt2"], seed=3, with_tokenizer=False)
    wa, wb = hf.attention_weights(a, 1), hf.attention_weights(b, 1)
    assert torch.equal(wa.wq, wb.wq) and torch.equal(wa.bo, wb.bo)


def test_gpt2_heads_split_on_output_axis():
    """Head l's query uses columns [l*dh, (l+1)*dh) of the q block of c_attn (x W convention)."""
    model, _, _ = load_text_model("gpt2", overrides=TINY["gpt2"], with_tokenizer=False)
    at = model.h[0].attn
    w = hf.attention_weights(model, 0, dtype=torch.float32)
    dh = 8
    Wc = at.c_attn.weight.detach()  # (d, 3d)
    assert torch.allclose(w.wk[2], Wc[:, 32 + 2 * dh: 32 + 3 * dh])
    assert torch.allclose(w.wv[1], Wc[:, 64 + dh: 64 + 2 * dh])


def test_negative_layer_and_errors():
    model, _, _ = load_text_model("bert-base-uncased", overrides=TINY["bert-base-uncased"],
                                     with_tokenizer=False)
    ids = torch.arange(5)[None]
    X = hf.attention_inputs(model, ids, [-1])
    assert set(X) == {-1} and X[-1].shape == (1, 5, 32) and X[-1].dtype == torch.float64
    with pytest.raises(ValueError, match="out of range"):
        hf.attention_weights(model, 5)
    with pytest.raises(ValueError, match="layer"):
        hf.attention_inputs(model, ids, [])
    with pytest.raises(ValueError, match="pretrained"):
        load_text_model("gpt2", pretrained=True, overrides={"n_layer": 1})
    with pytest.raises(ValueError, match="no offline weights or config"):
        load_text_model("bert-large-uncased-not-cached", with_tokenizer=False)
    with pytest.raises(FileNotFoundError, match="not available offline"):
        load_text_model("gpt2", pretrained=True, with_tokenizer=False)


@pytest.mark.parametrize("name", ["bert-base-uncased", "gpt2"])
def test_adapter_capture_collects_probabilities_and_stops_early(name):
    """Adapter.capture(probs=True), which hf.capture runs, returns the model's own attention probabilities,
    stops after the deepest requested layer, and refuses a module that returns no per-head probabilities."""
    from harness.models.adapters import adapter_for

    model, _, _ = load_text_model(name, overrides=TINY[name], seed=4, with_tokenizer=False)
    model = model.double()
    ids = torch.randint(0, 500, (2, 7), generator=torch.Generator().manual_seed(1))
    ad = adapter_for(model)
    ran = []
    hook = ad.modules()[1].register_forward_hook(lambda *a: ran.append(1))
    try:
        got = ad.capture({"input_ids": ids}, [0], probs=True)
        assert not ran and set(got) == {"inputs", "outputs", "probs"} and got["outputs"] == {}
    finally:
        hook.remove()
    ref = model(input_ids=ids, output_attentions=True).attentions
    both = ad.capture({"input_ids": ids}, [-1, 0], outputs=True, probs=True)
    via_hf = hf.capture(model, ids, [-1, 0], outputs=True)
    for l in (-1, 0):
        assert torch.equal(both["probs"][l], ref[l]) and torch.equal(via_hf["probs"][l], ref[l])
        assert torch.equal(via_hf["outputs"][l], both["outputs"][l]) and torch.equal(got["probs"][0], ref[0])
    net = torch.nn.TransformerEncoderLayer(16, 4, batch_first=True).eval()  # calls its attention with
    with pytest.raises(ValueError, match="attention probabilities"):  # need_weights=False
        adapter_for(net).capture((torch.randn(1, 5, 16),), [0], probs=True)


def test_minilm_roundtrip():
    try:
        model, tok, info = load_text_model("minilm", pretrained=True)
    except FileNotFoundError as e:
        pytest.skip(f"MiniLM weights unavailable: {e}")
    assert info["pretrained"] and info["n_layers"] == 6 and info["n_heads"] == 12 and info["d"] == 384
    assert not info["causal"]
    ids = tok(["Alice was beginning to get very tired of sitting by her sister"], return_tensors="pt")["input_ids"]
    _check_roundtrip(model, ids, [0, 5], causal=False)


# ---- ViT, regularizers, training -----------------------------------------------------------------------------
from harness.data.images import load_images  # noqa: E402
from harness.kernels.softmax import g_k  # noqa: E402
from harness.models import regularizers as R  # noqa: E402
from harness.models.train import train_classifier  # noqa: E402
from harness.models.vit import ViT, attend, vit_for  # noqa: E402
from harness.catalog import Context  # noqa: E402


def _tiny_vit(**kw):
    torch.manual_seed(0)
    return ViT(image_size=8, patch=2, in_chans=1, n_classes=3, d=16, depth=2, heads=4, **kw).double()


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_vit_attention_is_the_kernel(qkv_bias):
    m = _tiny_vit(qkv_bias=qkv_bias)
    with torch.no_grad():
        for b in m.blocks:  # non-zero biases so they are exercised
            for p in (b.attn.bq, b.attn.bk, b.attn.bv, b.attn.bo):
                if p is not None:
                    p.normal_()
    x = torch.rand(2, 1, 8, 8, dtype=torch.float64)
    logits, Ps, Xs = m(x, return_attn=True)
    assert logits.shape == (2, 3) and len(Ps) == 2 and Ps[0].shape == (2, 4, 17, 17) and Xs[1].shape == (2, 17, 16)
    assert torch.equal(m(x), logits)
    for l, blk in enumerate(m.blocks):
        w = m.attention_weights(l)
        assert w.has_bias == True and (w.bq is not None) == qkv_bias  # noqa: E712
        assert torch.allclose(probs(Xs[l], w), Ps[l], atol=1e-14)
        assert torch.allclose(attention(Xs[l], w), blk.attn(Xs[l])[0], atol=1e-13)
        assert torch.allclose(attend(Xs[l], w, causal=True)[0], attention(Xs[l], w, causal=True), atol=1e-13)
    with torch.no_grad():
        assert torch.allclose(Xs[0], m.blocks[0].ln1(m.tokens(x)))
    assert m.attention_weights(-1).bo is not None and m.attention_weights(0, with_bo=False).bo is None
    w32 = m.attention_weights(1, dtype=torch.float32)
    assert w32.dtype == torch.float32 and not w32.wq.requires_grad and m.attention_weights(1).wq.requires_grad
    assert set(m.attention_inputs(x, [1], dtype=torch.float32)) == {1}
    with pytest.raises(ValueError, match="do not match"):
        m(torch.rand(2, 1, 9, 9, dtype=torch.float64))
    with pytest.raises(ValueError, match="out of range"):
        m.attention_weights(2)


def test_vit_for_shapes():
    assert vit_for((1, 28, 28), 10, d=16, depth=1, heads=2).n_tokens == 17
    assert vit_for((3, 32, 32), 10, d=16, depth=1, heads=2).n_tokens == 17


def test_specformer_sigma_matches_svd_and_grad():
    m = _tiny_vit()
    reg = R.Specformer(1.0, 0.0, 0.5, iters=500)
    s = reg.sigmas(m)
    for l, blk in enumerate(m.blocks):
        for name in ("Wq", "Wk", "Wv"):
            M = R.head_matrices(getattr(blk.attn, name), 4)  # (h, d, dh)
            ref = torch.linalg.matrix_norm(M, ord=2)
            assert torch.allclose(s[name][l], ref, rtol=1e-6) and (s[name][l] <= ref * (1 + 1e-12)).all()
            assert torch.allclose(M[1], getattr(blk.attn, name)[:, 4:8])  # heads on the output axis
    val = reg(m)
    ref = sum(torch.linalg.matrix_norm(R.head_matrices(b.attn.Wq, 4), ord=2).square().sum()
              + 0.5 * torch.linalg.matrix_norm(R.head_matrices(b.attn.Wv, 4), ord=2).square().sum() for b in m.blocks)
    assert torch.allclose(val, ref, rtol=1e-6)
    val.backward()
    assert m.blocks[0].attn.Wq.grad is not None and m.blocks[0].attn.Wk.grad is None
    assert R.Specformer.variant("k", 1e-2).recipe["lam_k"] == 1e-2 and R.Specformer.variant("k", 1e-2).recipe["lam_q"] == 0
    with pytest.raises(ValueError):
        R.Specformer.variant("qk", 1.0)


@pytest.mark.parametrize("k,agg", [(0, "mean"), (0, "max"), (5, "mean"), (5, "max")])
def test_jasmin_regularizer_matches_formula(k, agg):
    m = _tiny_vit()
    _, Ps, _ = m(torch.rand(3, 1, 8, 8, dtype=torch.float64), return_attn=True)
    reg = R.JaSMin(k, 0.1, agg)
    ref = 0.0
    for P in Ps:  # (B, h, n, n): sum over heads, agg over queries, mean over batch
        t = torch.log(g_k(P, 1) + 1e-12) - (torch.log(g_k(P, k) + 1e-12) if k else 0)
        ref = ref + (t.amax(-1) if agg == "max" else t.mean(-1)).mean(0).sum()
    assert torch.allclose(reg(m, Ps), 0.1 * ref, rtol=1e-10)
    assert R.from_recipe(reg.recipe).recipe == reg.recipe
    with pytest.raises(ValueError):
        R.JaSMin(1, 0.1)


def _synthetic_data():
    tr = load_images("synthetic", split="train", size=8, n_classes=3, n_synthetic=256)
    te = load_images("synthetic", split="test", size=8, n_classes=3, n_synthetic=64)
    return (tr[0], tr[1]), (te[0], te[1])


class DictStore:
    """A cached_artifact-like store in memory (train.py imports no store; callers pass one in)."""

    def __init__(self):
        self.blobs, self.calls = {}, []

    def __call__(self, kind, recipe, build, root=None, code=()):
        import json

        self.calls.append((kind, [m.__name__ for m in code]))
        key = (kind, json.dumps(recipe, sort_keys=True, default=str))
        if key not in self.blobs:
            self.blobs[key] = build()
        return self.blobs[key]


def test_training_decreases_loss_and_cache_hits(tmp_path):
    ctx = Context(cache_dir=tmp_path, progress=False)
    recipe = {"dataset": "synthetic", "model": {"d": 16, "depth": 1, "heads": 2}, "epochs": 3, "batch_size": 32,
           "lr": 3e-3, "seed": 1}
    data = _synthetic_data()
    store = DictStore()
    m1 = train_classifier(recipe, ctx, regularizer=R.JaSMin(0, 1e-3), data=data, store=store)
    mt = m1.train_metrics
    curve = mt["loss_curve"]
    assert not m1.cached and mt["steps"] == 24 and mt["step_time_mean_s"] > 0
    assert sum(curve[-4:]) / 4 < sum(curve[:4]) / 4 - 0.1, curve
    assert mt["test_acc"] > 0.5
    assert store.calls[0] == ("classifier", ["harness.models.train", "harness.models.vit", "harness.models.vit_import",
                                           "harness.models.regularizers"])
    m2 = train_classifier(recipe, ctx, regularizer=R.JaSMin(0, 1e-3), data=data, store=store)
    assert m2.cached and m2.train_metrics == mt
    for a, b in zip(m1.state_dict().values(), m2.state_dict().values()):
        assert torch.equal(a, b)
    m3 = train_classifier(recipe, ctx, regularizer=R.JaSMin(0, 1e-2), data=data, store=store)  # other regularizer: new key
    assert not m3.cached
    m4 = train_classifier(recipe, ctx, regularizer=R.JaSMin(0, 1e-3), data=data, force=True, store=store)  # deterministic
    assert not m4.cached
    for a, b in zip(m1.state_dict().values(), m4.state_dict().values()):
        assert torch.equal(a, b)
    m5 = train_classifier(recipe, ctx, regularizer=R.JaSMin(0, 1e-3), data=data)  # no store: trains, same weights
    assert not m5.cached and all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m5.state_dict().values()))
    with pytest.raises(ValueError, match="unknown training recipe"):
        train_classifier({"epoch": 1}, ctx, data=data)


def test_fit_cosine_schedule_logit_scale_and_inputs():
    """fit's LoFAST options: cosine decay, tau-scaled logits, an inputs() hook; accuracy() uses the same hook."""
    from harness.models.train import accuracy, fit

    (Xtr, ytr), _ = _synthetic_data()
    torch.manual_seed(0)
    model = vit_for((1, 8, 8), 3, d=16, depth=1, heads=2)
    seen = []

    def inputs(m, xb):
        seen.append(xb.dtype)
        return xb

    m = fit(model, Xtr, ytr, epochs=1, batch_size=64, lr=1e-2, seed=0, schedule="cosine", logit_scale=2.0,
            inputs=inputs)
    assert m["steps"] == 4 and seen == [torch.float32] * 4
    assert 0.0 <= accuracy(model, Xtr, ytr, inputs=inputs) <= 1.0
    with pytest.raises(ValueError, match="schedule"):
        fit(model, Xtr, ytr, epochs=1, batch_size=64, lr=1e-2, seed=0, schedule="step")
