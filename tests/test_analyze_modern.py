"""`attnlip analyze` on current attention: Llama (RoPE, GQA 4 query / 2 key-value heads), Qwen2 (RoPE, q/k/v
biases, multi-query), T5 encoder (relative position bias, no scaling) and DeBERTa-v2 (c2p / p2c), random-init
tiny models saved with save_pretrained beside a tokenizer (MiniLM's BERT vocabulary as a stand-in).

The truth is checked against a dense Jacobian (torch.func.jacrev, float64) of each model's own attention module
at its hooked input, per layer and per head (the module with every other head's output columns zeroed)."""
from __future__ import annotations

import pandas as pd
import pytest
import torch

transformers = pytest.importorskip("transformers")

from harness.analyze import cli, core  # noqa: E402
from harness.bounds import registry  # noqa: E402
from harness.models import text as text_models  # noqa: E402
from harness.models.adapters import adapter_for  # noqa: E402

TEXT = "the cat sat on the warm mat today"  # 10 tokens with [CLS] / [SEP]
ARCHS = ("llama", "qwen2", "t5", "deberta")
HEADS = 4


def _config(arch: str, vocab: int):
    T = transformers
    if arch == "llama":
        return T.LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=32)
    if arch == "qwen2":
        return T.Qwen2Config(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=HEADS, num_key_value_heads=1, max_position_embeddings=32)
    if arch == "t5":
        return T.T5Config(vocab_size=vocab, d_model=32, d_kv=8, d_ff=48, num_layers=2, num_heads=HEADS,
                          relative_attention_num_buckets=8, relative_attention_max_distance=16)
    return T.DebertaV2Config(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                             num_attention_heads=HEADS, max_position_embeddings=32, relative_attention=True,
                             pos_att_type=["p2c", "c2p"], position_buckets=8, max_relative_positions=16,
                             norm_rel_ebd="layer_norm", share_att_key=True)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    tok = transformers.AutoTokenizer.from_pretrained(text_models.minilm_path())
    out = {}
    for i, arch in enumerate(ARCHS):
        torch.manual_seed(i)
        cfg = _config(arch, tok.vocab_size + 8)  # spare rows: transformers gives a qwen2 folder an extra eos token
        cfg.pad_token_id, cfg.bos_token_id, cfg.eos_token_id = tok.pad_token_id, tok.cls_token_id, tok.sep_token_id
        model = transformers.T5EncoderModel(cfg) if arch == "t5" else transformers.AutoModel.from_config(cfg)
        with torch.no_grad():  # larger weights than the 0.02 init so that softmax is far from uniform
            for name, p in model.named_parameters():
                if p.dim() == 2 and "embed" not in name and "shared" not in name:
                    p.normal_(0.0, 0.35)
        d = tmp_path_factory.mktemp(arch)
        model.save_pretrained(d)
        tok.save_pretrained(d)
        out[arch] = str(d)
    return out


def _float64(folder: str, arch: str):
    """The saved model in float64, with SDPA for the decoders (their eager path runs softmax in float32)."""
    impl = "sdpa" if arch in ("llama", "qwen2") else "eager"
    cls = transformers.T5EncoderModel if arch == "t5" else transformers.AutoModel
    return cls.from_pretrained(folder, attn_implementation=impl).double().eval()


def _module_calls(model, tok):
    """(adapter, {layer: (module, args, kwargs)}) of one forward pass on TEXT."""
    ad = adapter_for(model)
    calls = {}

    def hook(i):
        def pre(mod, a, k):
            calls.setdefault(i, (mod, a, k))
        return pre

    handles = [m.register_forward_pre_hook(hook(i), with_kwargs=True) for i, m in enumerate(ad.modules())]
    enc = tok([TEXT], return_tensors="pt")
    with torch.no_grad():
        ad.run({"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]})  # decoders: no kv cache
    for h in handles:
        h.remove()
    ad.capture({"input_ids": enc["input_ids"]}, range(ad.n_layers))  # the adapter reads its position terms
    return ad, calls


def _module_map(ad, mod, args, kwargs, head=None):
    """X -> the model's own F(X) (attention module + output projection), only `head`'s output columns if given."""
    out = ad.output_module(mod)
    proj = out if out is not mod else next(getattr(mod, n) for n in ("o_proj", "o") if hasattr(mod, n))
    W = proj.weight
    if head is not None:
        dh = W.shape[1] // HEADS
        keep = torch.zeros_like(W)
        keep[:, head * dh:(head + 1) * dh] = 1
        W = W * keep

    def f(x):
        if out is not mod:  # DeBERTa: output.dense after the self-attention module
            ctx = mod(x, *args[1:], **kwargs)[0]
            return torch.nn.functional.linear(ctx, W, proj.bias)[0]
        params = {n: p for n, p in mod.named_parameters()}
        params[[n for n, p in mod.named_parameters() if p is proj.weight][0]] = W
        a, k = ((x, *args[1:]), kwargs) if args else ((), dict(kwargs, hidden_states=x))
        return torch.func.functional_call(mod, params, a, k)[0][0]

    return f


def _double(t):
    if isinstance(t, (tuple, list)):
        return type(t)(_double(x) for x in t)
    if isinstance(t, dict):
        return {k: _double(v) for k, v in t.items()}
    return t.double() if torch.is_tensor(t) and t.is_floating_point() else t


def _dense_norm(f, X):
    J = torch.func.jacrev(f)(X)  # (1, n, d) -> (n, d): (n, d, 1, n, d)
    return float(torch.linalg.matrix_norm(J.reshape(X[0].numel(), X[0].numel()), ord=2))


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_map_equals_the_models_own_module(folders, arch):
    tok = transformers.AutoTokenizer.from_pretrained(folders[arch])
    model = _float64(folders[arch], arch)
    ad, calls = _module_calls(model, tok)
    for layer, (mod, args, kwargs) in calls.items():
        X = args[0] if args else kwargs["hidden_states"]
        amap = ad.attention_map(layer, X.shape[1])
        ref = _module_map(ad, mod, args, kwargs)(X)
        assert torch.allclose(amap.layer(X[0]), ref, rtol=0, atol=1e-12 * float(ref.abs().max()))
        assert amap.features == {"llama": ("rope",), "qwen2": ("rope",), "t5": ("score_bias",),
                                 "deberta": ("rel_pos",)}[arch]


@pytest.mark.parametrize("arch", ARCHS)
def test_truth_equals_dense_jacobian_and_bounds_hold(folders, arch):
    df = core.analyze(folders[arch], TEXT, eps=1e-4, entry_points=False)
    tok = transformers.AutoTokenizer.from_pretrained(folders[arch])
    cls = transformers.T5EncoderModel if arch == "t5" else transformers.AutoModel
    model = cls.from_pretrained(folders[arch], attn_implementation="eager").eval()  # as analyze loads it
    ad, calls = _module_calls(model, tok)  # the inputs analyze sees (float32 forward)
    model.double()  # the Jacobian in float64, through SDPA (the decoders' eager softmax runs in float32)
    model.config._attn_implementation = "sdpa" if arch in ("llama", "qwen2") else "eager"
    for layer, (mod, args, kwargs) in calls.items():
        args, kwargs = _double(args), _double({k: v for k, v in kwargs.items() if k != "hidden_states"})
        X = _double(calls[layer][1][0] if calls[layer][1] else calls[layer][2]["hidden_states"]).detach()
        args = (X, *args[1:]) if args else args
        d = df[(df["layer"] == layer) & (df["method"] == "truth")]
        want = _dense_norm(_module_map(ad, mod, args, kwargs), X)
        assert float(d[d["scope"] == "layer"]["value"].iloc[0]) == pytest.approx(want, rel=1e-6)
        for head in range(HEADS):
            want = _dense_norm(_module_map(ad, mod, args, kwargs, head), X)
            got = float(d[(d["scope"] == "head") & (d["head"] == head)]["value"].iloc[0])
            assert got == pytest.approx(want, rel=1e-6)
    valid = df[df["value"].notna()]
    up = valid[(valid["kind"] == "upper") & valid["guaranteed"]]
    assert set(up["method"]) >= {"lofast_fine", "lofast_sharp", "truth_upper"}
    assert (up["value"] >= up["truth"] * (1 - 1e-9)).all()
    pgd = valid[valid["method"] == "pgd"]
    assert len(pgd) == 2 and (pgd["value"] <= pgd["truth"] * (1 + 1e-3)).all() and (pgd["ratio"] > 0.5).all()
    assert df["sound"].all()


@pytest.mark.parametrize("arch", ARCHS)
def test_cli_reports_every_layer_and_head_with_na_reasons(folders, arch, tmp_path, capsys):
    out = tmp_path / "an"
    rc = cli.main(["analyze", "--model", folders[arch], "--text", TEXT, "--out", str(out), "--no-progress"])
    printed = capsys.readouterr().out
    assert rc == 0
    df = pd.read_csv(out / "table.csv", keep_default_na=True)
    truth = df[df["method"] == "truth"]
    assert set(truth[truth["scope"] == "layer"]["layer"]) == {0, 1}
    assert set(truth[truth["scope"] == "head"]["head"]) == set(range(HEADS))
    kim = df[df["method"] == "kim"]
    assert len(kim) and kim["value"].isna().all() and kim["note"].str.startswith("n/a").all()
    assert "n/a" in printed and "n/a Kim:" in printed
    assert df[df["method"] == "lofast_sharp"]["value"].notna().all()


def test_sdpa_loaded_module_gives_the_same_truth(folders):
    tok = transformers.AutoTokenizer.from_pretrained(folders["llama"])
    sdpa = transformers.AutoModel.from_pretrained(folders["llama"], attn_implementation="sdpa")
    a = core.analyze(sdpa, TEXT, tokenizer=tok, eps=0, entry_points=False, methods=["lofast_sharp"])
    b = core.analyze(folders["llama"], TEXT, eps=0, entry_points=False, methods=["lofast_sharp"])
    ta, tb = (x[x["method"] == "truth"]["value"].to_numpy() for x in (a, b))
    assert len(ta) == 2 * (HEADS + 1) and abs(ta - tb).max() <= 1e-5 * tb.max()


def test_gqa_heads_share_their_key_value_projection(folders):
    model = transformers.AutoModel.from_pretrained(folders["llama"])
    ad = adapter_for(model)
    w = ad.layer_weights(0)
    assert torch.equal(w.wk[0], w.wk[1]) and torch.equal(w.wv[2], w.wv[3])
    assert not torch.equal(w.wk[1], w.wk[2])


def test_registry_declares_what_each_bound_is_proven_for():
    for b in registry.bounds():
        assert set(b.proven_for) <= set(registry.FEATURES)
    assert registry.get("lofast_sharp", "layer").unproven(("rope", "score_bias", "rel_pos")) is None
    why = registry.get("kim", "head").unproven(("rope",))
    assert why and "rotary" in why
    assert registry.get("castin", "head").unproven(()) is None  # the standard map (and GQA) needs no feature


def test_sliding_window_shorter_than_the_text_is_refused(tmp_path):
    tok = transformers.AutoTokenizer.from_pretrained(text_models.minilm_path())
    cfg = transformers.MistralConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32,
                                     num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1,
                                     max_position_embeddings=32, sliding_window=4)
    model = transformers.AutoModel.from_config(cfg, attn_implementation="eager")
    with pytest.raises(ValueError, match="sliding window"):
        core.analyze(model, TEXT, tokenizer=tok, eps=0, entry_points=False)
