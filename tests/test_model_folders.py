"""A model folder a user hands to `attnlip analyze --model` or `attnlip certify --model` is checked before any
library reads it: a config with absurd sizes or damaged safetensors weights gives one line naming the file and what
is wrong (exit status 2), never a traceback, a huge allocation or a number computed from a wrong model."""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from harness.analyze.cli import main as analyze_main  # noqa: E402
from harness.certify.cli import main as certify_main  # noqa: E402
from harness.models import checkpoint  # noqa: E402

WORDS = "[PAD] [UNK] [CLS] [SEP] [MASK] the cat sat on mat a dog".split()
TEXT = "the cat sat on the mat the dog sat on a mat"  # 12 words, 14 tokens with [CLS] and [SEP]
COMMANDS = {"analyze": (analyze_main, ["--eps", "0", "--pgd-steps", "0"]), "certify": (certify_main, ["--no-attack"])}


def _save(folder: Path, positions: int = 32) -> Path:
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=len(WORDS), hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=32, max_position_embeddings=positions, num_labels=2)
    transformers.BertForSequenceClassification(cfg).save_pretrained(folder)
    (folder / "vocab.txt").write_text("\n".join(WORDS) + "\n")
    transformers.BertTokenizer(str(folder / "vocab.txt")).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return _save(tmp_path_factory.mktemp("good"))


def _variant(good: Path, tmp_path: Path, **config) -> Path:
    out = tmp_path / "model"
    shutil.copytree(good, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(config)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def _weights(folder: Path, data: bytes) -> Path:
    (folder / "model.safetensors").write_bytes(data)
    return folder


def _header(st: bytes):
    n = struct.unpack("<Q", st[:8])[0]
    return n, json.loads(st[8:8 + n])


def _refused(capsys, command: str, folder: Path, *needles: str, args=()) -> str:
    main, extra = COMMANDS[command]
    rc = main(["--model", str(folder), "--text", TEXT, "--no-progress", "--threads", "1", *extra, *args])
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err + out
    lines = [ln for ln in err.splitlines() if ln.startswith(f"attnlip {command}:") and "note:" not in ln]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert "median certified radius" not in out and "ratio = bound" not in out  # nothing was computed
    return lines[0]


CONFIGS = [
    ({"hidden_size": 0}, "hidden_size must be a positive integer"),
    ({"num_attention_heads": 0}, "num_attention_heads must be a positive integer"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
    ({"intermediate_size": 0}, "intermediate_size must be a positive integer"),
    ({"vocab_size": 0}, "vocab_size must be a positive integer"),
    ({"num_hidden_layers": -1}, "num_hidden_layers must be a positive integer, got -1"),
    ({"num_attention_heads": "2"}, "got '2'"),
    ({"num_attention_heads": True}, "got True"),
    ({"hidden_size": None}, "got None"),
    ({"num_hidden_layers": 2.5}, "got 2.5"),
    ({"hidden_size": 15}, "hidden_size 15 is not a multiple of num_attention_heads 2"),
    ({"layer_norm_eps": 0}, "layer_norm_eps must be a positive finite number"),
    ({"layer_norm_eps": -1e-12}, "layer_norm_eps must be a positive finite number"),
    ({"layer_norm_eps": float("nan")}, "got nan"),
    ({"hidden_size": 2 ** 20, "intermediate_size": 2 ** 22, "num_hidden_layers": 1000}, "parameters"),
]


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("config, needle", CONFIGS, ids=[str(c) for c, _ in CONFIGS])
def test_absurd_config_values_are_refused_naming_the_file(good, tmp_path, capsys, command, config, needle):
    folder = _variant(good, tmp_path, **config)
    _refused(capsys, command, folder, str(folder / "config.json"), needle)


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("config, needle", [
    ({"intermediate_size": 24}, "has shape [32, 16], but config.json makes it [24, 16]"),
    ({"max_position_embeddings": 1}, "config.json makes it [1, 16]"),
    ({"num_hidden_layers": 4}, "encoder.layer.2."),  # two layers would be random
])
def test_config_that_disagrees_with_the_weights_is_refused(good, tmp_path, capsys, command, config, needle):
    folder = _variant(good, tmp_path, **config)
    _refused(capsys, command, folder, str(folder), needle)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_huge_config_beside_pickled_weights_is_refused_before_loading(good, tmp_path, capsys, command):
    folder = _variant(good, tmp_path, hidden_size=2 ** 16, num_hidden_layers=10 ** 4)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(b"\0" * 4096)  # never opened: refused from its size
    _refused(capsys, command, folder, str(folder / "config.json"), "parameters", "at most 2.05e+03")


def _damaged(st: bytes):
    n, header = _header(st)
    ints = {k: dict(v, dtype="I32") if k != "__metadata__" and v["dtype"] == "F32" else v for k, v in header.items()}
    raw = json.dumps(ints, separators=(",", ":")).encode()
    return {
        "truncated": (st[:len(st) // 2], "truncated"),
        "huge header length": (struct.pack("<Q", 2 ** 62) + st[8:], "beyond the 100 MiB"),
        "header past the end": (struct.pack("<Q", len(st)) + st[8:], "truncated or not a safetensors file"),
        "header not JSON": (st[:8] + b"x" * n + st[8 + n:], "its header is not JSON"),
        "integer weights": (st[:8] + raw + b" " * (n - len(raw)) + st[8 + n:], "stored as I32, not a float dtype"),
        "three bytes": (b"abc", "too short"),
    }


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("kind", list(_damaged(struct.pack("<Q", 2) + b"{}")))
def test_damaged_safetensors_are_refused_naming_the_file(good, tmp_path, capsys, command, kind):
    folder = _variant(good, tmp_path)
    data, needle = _damaged((good / "model.safetensors").read_bytes())[kind]
    _weights(folder, data)
    _refused(capsys, command, folder, str(folder / "model.safetensors"), needle)


def test_safetensors_byte_ranges_must_match_shapes_and_tile_the_data(good, tmp_path):
    st = (good / "model.safetensors").read_bytes()
    got = checkpoint.check_safetensors(good / "model.safetensors")
    assert got["classifier.weight"] == ("F32", [2, 16])
    n, header = _header(st)
    key = "classifier.weight"
    for edit, needle in [({"shape": [3, 16]}, "needs"), ({"data_offsets": [0, 128]}, "overlap or leave a gap"),
                         ({"dtype": "Q9"}, "no valid dtype")]:
        h = dict(header)
        h[key] = dict(h[key], **edit)
        if "data_offsets" in edit:
            h[key]["shape"] = [2, 16]
        raw = json.dumps(h).encode()
        f = tmp_path / "w.safetensors"
        f.write_bytes(struct.pack("<Q", len(raw)) + raw + st[8 + n:])
        with pytest.raises(checkpoint.BadCheckpoint, match=needle):
            checkpoint.check_safetensors(f)


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_model_with_one_position_refuses_texts(tmp_path, capsys, command):
    folder = _save(tmp_path / "one", positions=1)
    _refused(capsys, command, folder, "--model", "1 position(s)", "max_position_embeddings")


def test_certify_caps_texts_at_the_models_positions_and_says_so(tmp_path, capsys):
    folder = _save(tmp_path / "short", positions=8)
    rc = certify_main(["--model", str(folder), "--text", TEXT, "--no-progress", "--threads", "1", "--no-attack"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    assert "truncated to 8 tokens" in err and "median certified radius" in out
    assert certify_main(["--model", str(folder), "--text", TEXT, "--no-progress", "--max-tokens", "20"]) == 2
    assert "exceeds the 8 positions" in capsys.readouterr().err


def test_the_checks_accept_the_models_they_should(good):
    checkpoint.check_folder(good)
    checkpoint.check_folder(good, classifier=True)
    base = good.parent / "base"
    transformers.BertModel.from_pretrained(good).save_pretrained(base)  # no classifier: certify says so itself
    checkpoint.check_folder(base, classifier=True)
