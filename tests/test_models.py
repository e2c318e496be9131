"""Model adapters: extracted AttentionWeights + hooked inputs reproduce the HF models' self-attention exactly."""
import pytest
import torch

from harness.kernels.attention import attention, probs

hf = pytest.importorskip("harness.models.hf")

TINY = {
    "bert-base-uncased": {"hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
                          "intermediate_size": 64},
    "gpt2": {"n_embd": 32, "n_head": 4, "n_layer": 2},
}


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
    model, _, info = hf.load_text_model(name, overrides=TINY[name], seed=1, with_tokenizer=False)
    assert not info["pretrained"] and info["d"] == 32 and info["n_heads"] == 4
    assert info["causal"] == (name == "gpt2") == hf.is_causal(model)
    ids = torch.randint(0, 500, (3, 9), generator=torch.Generator().manual_seed(0))
    _check_roundtrip(model, ids, [0, 1], info["causal"])


def test_random_init_is_seeded():
    a, _, _ = hf.load_text_model("gpt2", overrides=TINY["gpt2"], seed=3, with_tokenizer=False)
    b, _, _ = hf.load_text_model("gpt2", overrides=TINY["gpt2"], seed=3, with_tokenizer=False)
    wa, wb = hf.attention_weights(a, 1), hf.attention_weights(b, 1)
    assert torch.equal(wa.wq, wb.wq) and torch.equal(wa.bo, wb.bo)


def test_gpt2_heads_split_on_output_axis():
    """Head l's query uses columns [l*dh, (l+1)*dh) of the q block of c_attn (x W convention)."""
    model, _, _ = hf.load_text_model("gpt2", overrides=TINY["gpt2"], with_tokenizer=False)
    at = model.h[0].attn
    w = hf.attention_weights(model, 0, dtype=torch.float32)
    dh = 8
    Wc = at.c_attn.weight.detach()  # (d, 3d)
    assert torch.allclose(w.wk[2], Wc[:, 32 + 2 * dh: 32 + 3 * dh])
    assert torch.allclose(w.wv[1], Wc[:, 64 + dh: 64 + 2 * dh])


def test_negative_layer_and_errors():
    model, _, _ = hf.load_text_model("bert-base-uncased", overrides=TINY["bert-base-uncased"],
                                     with_tokenizer=False)
    ids = torch.arange(5)[None]
    X = hf.attention_inputs(model, ids, [-1])
    assert set(X) == {-1} and X[-1].shape == (1, 5, 32) and X[-1].dtype == torch.float64
    with pytest.raises(ValueError, match="out of range"):
        hf.attention_weights(model, 5)
    with pytest.raises(ValueError, match="layer"):
        hf.attention_inputs(model, ids, [])
    with pytest.raises(ValueError, match="pretrained"):
        hf.load_text_model("gpt2", pretrained=True, overrides={"n_layer": 1})


def test_minilm_roundtrip():
    try:
        model, tok, info = hf.load_text_model("minilm", pretrained=True)
    except FileNotFoundError as e:
        pytest.skip(f"MiniLM weights unavailable: {e}")
    assert info["pretrained"] and info["n_layers"] == 6 and info["n_heads"] == 12 and info["d"] == 384
    assert not info["causal"]
    ids = tok(["Alice was beginning to get very tired of sitting by her sister"], return_tensors="pt")["input_ids"]
    _check_roundtrip(model, ids, [0, 5], causal=False)
