"""Property-based fuzzing (hypothesis) of the files users hand us besides command lines: model folders (config.json
values, safetensors bytes) given to `attnlip analyze`, and damaged data mirror files read by the loaders. Whatever
the file: an exit status and one line (never a traceback), and never a number computed from a file that was
damaged. Bounded and derandomized, as tests/test_fuzz.py."""
from __future__ import annotations

import json
import math
import shutil
import struct
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings, strategies as st  # noqa: E402

from tests.test_analyze_validation import TEXT, folders  # noqa: E402,F401 - the tiny saved model folders
from tests.test_fuzz import _call  # noqa: E402

FUZZ = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# ---- config.json ----------------------------------------------------------------------------------------------------
SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
         "max_position_embeddings", "type_vocab_size", "layer_norm_eps")
VALUES = st.one_of(st.sampled_from([0, 1, -1, 3, 2**40, 10**30, 1.5, float("nan"), float("inf"), "x", "", None,
                                    True, False, [], {}, [32], 1e-300, -1e-12]),
                   st.integers(-5, 100))


def _analyze(folder):
    from harness.analyze import cli

    return _call(cli.main, ["--model", str(folder), "--text", TEXT, "--layers", "0", "--eps", "0",
                            "--pgd-steps", "0", "--methods", "castin", "--no-progress"])


def _one_line_refusal(rc, text):
    assert rc in (1, 2), (rc, text)
    assert "Traceback" not in text, text
    assert any(ln.startswith("attnlip analyze: error:") for ln in text.splitlines()), text


@FUZZ
@given(edits=st.dictionaries(st.sampled_from(SIZES), VALUES, min_size=1, max_size=2))
@example(edits={"hidden_size": 0})
@example(edits={"num_attention_heads": 0})
@example(edits={"num_hidden_layers": 0})
@example(edits={"hidden_size": 30})
@example(edits={"max_position_embeddings": 1})
@example(edits={"vocab_size": 2**40})
@example(edits={"layer_norm_eps": float("nan")})
def test_model_configs(folders, tmp_path_factory, edits):  # noqa: F811
    """Any config value: the model analyses (only if the folder is still a consistent model) or one line says
    which field is wrong. A config that disagrees with its weights never loads with fresh random weights."""
    folder = tmp_path_factory.mktemp("cfg")
    shutil.copytree(folders["ok"], folder, dirs_exist_ok=True)
    cfg = json.loads((folder / "config.json").read_text())
    original = dict(cfg)
    cfg.update(edits)
    (folder / "config.json").write_text(json.dumps(cfg))  # NaN / Infinity as Python writes them
    rc, text = _analyze(folder)
    assert "Traceback" not in text, (edits, text)
    if any(_must_refuse(k, v, original, cfg) for k, v in edits.items()):
        _one_line_refusal(rc, text)
    else:
        assert rc in (0, 1, 2), (edits, rc, text)


def _must_refuse(key, value, original, cfg) -> bool:
    """Whether a config value makes the folder a model that cannot be what its weights are: a value of the wrong
    type or out of range, or a size its weights' shapes contradict (a missing layer would otherwise load with
    fresh random weights). A head count that divides the width, or another positive layer_norm_eps, is another
    valid model on the same weights."""
    if key == "layer_norm_eps":
        return isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value < math.inf)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return True
    if key == "num_attention_heads":
        width = cfg.get("hidden_size")
        return not isinstance(width, int) or isinstance(width, bool) or width <= 0 or width % value != 0
    return value != original[key]


# ---- model.safetensors ----------------------------------------------------------------------------------------------
@FUZZ
@given(kind=st.sampled_from(["truncate", "header_length", "header_bytes", "flip"]),
       at=st.floats(0.0, 1.0), value=st.integers(0, 2**64 - 1), junk=st.binary(min_size=1, max_size=16))
@example(kind="header_length", at=0.0, value=2**62, junk=b"x")
@example(kind="truncate", at=0.5, value=0, junk=b"x")
@example(kind="header_bytes", at=0.5, value=0, junk=b"\xff\xfe")
def test_safetensors_bytes(folders, tmp_path_factory, kind, at, value, junk):  # noqa: F811
    """Damaged weights: a truncated file, any header length, bytes inside the header replaced. One line, or (a
    flipped byte in the tensor data, which no format check can see) a normal run; never a traceback."""
    folder = tmp_path_factory.mktemp("st")
    shutil.copytree(folders["ok"], folder, dirs_exist_ok=True)
    path = folder / "model.safetensors"
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if kind == "truncate":
        data = data[:int(at * (len(data) - 1))]
    elif kind == "header_length":
        if value == n:
            value += 1
        data[:8] = struct.pack("<Q", value)
    elif kind == "header_bytes":
        i = 8 + int(at * (n - 1))
        data[i:i + len(junk)] = junk
    else:
        i = 8 + n + int(at * (len(data) - 9 - n))
        data[i] ^= 0x01
    path.write_bytes(bytes(data))
    rc, text = _analyze(folder)
    assert "Traceback" not in text, (kind, text)
    if kind in ("truncate", "header_length"):
        _one_line_refusal(rc, text)
    else:
        assert rc in (0, 1, 2), (kind, rc, text)


# ---- data mirror files ----------------------------------------------------------------------------------------------
MIRROR_FILES = {"alice": "nltk_data/corpora/gutenberg/carroll-alice.txt", "brown": "nltk_data/corpora/brown.zip",
                "ag_news": "ag_news/test.csv", "sst2": "sst2/train.tsv"}


@pytest.fixture(scope="module")
def tiny_mirror(tmp_path_factory):
    from tests._tiny_mirror import build

    return build(tmp_path_factory.mktemp("mirror"))


@FUZZ
@given(name=st.sampled_from(sorted(MIRROR_FILES)), kind=st.sampled_from(["truncate", "empty", "bytes", "shuffle"]),
       at=st.floats(0.0, 1.0), junk=st.binary(min_size=1, max_size=12))
@example(name="ag_news", kind="truncate", at=0.5, junk=b"x")
@example(name="brown", kind="truncate", at=0.5, junk=b"x")
@example(name="alice", kind="empty", at=0.0, junk=b"x")
def test_damaged_mirror_files(tiny_mirror, tmp_path_factory, monkeypatch, name, kind, at, junk):
    """A mirror file cut off, emptied, with bytes replaced or its lines shuffled: the loader returns texts (what a
    shuffled or line-boundary file still is) or raises MissingData naming the file (a cell skipped as missing data,
    one line in analyze); never another exception, never an empty corpus."""
    from harness.data import text
    from harness.errors import MissingData

    root = tmp_path_factory.mktemp("m")
    shutil.copytree(tiny_mirror, root, dirs_exist_ok=True)
    path = root / MIRROR_FILES[name]
    data = path.read_bytes()
    if kind == "truncate":
        data = data[:int(at * (len(data) - 1))]
    elif kind == "empty":
        data = b""
    elif kind == "bytes":
        i = int(at * (len(data) - 1))
        data = data[:i] + junk + data[i + len(junk):]
    else:
        lines = data.splitlines(keepends=True)
        head, body = (lines[:1], lines[1:]) if name in ("ag_news", "sst2") else ([], lines)
        data = b"".join(head + body[::-1])
    path.write_bytes(data)
    monkeypatch.setenv("ATTNLIP_DATA", str(root))
    monkeypatch.setenv("NLTK_DATA", str(root / "nltk_data"))
    try:
        texts = text.load_corpus(name)
    except MissingData as e:
        assert str(path) in str(e) and e.fix, str(e)
        return
    assert texts and all(isinstance(t, str) for t in texts), (name, kind)
