"""`attnlip analyze` refuses every user mistake before computing: exit status 2 (1 is kept for an unsound bound),
one message on stderr naming the option and its fix, no traceback, and never a silently different analysis
(wrapped layer indices, a tokenizer that maps every word to [UNK], an ignored --max-tokens)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")

from harness.analyze import analyze, cli, validate  # noqa: E402

from tests.test_analyze import _bert_tokenizer  # noqa: E402 - one helper for both files

REPO = Path(__file__).resolve().parents[1]
POSITIONS = 64
TEXT = "The cat sat on the mat."
LONG = " ".join(["the cat sat on the mat and looked at the dog"] * 12)  # about 130 word pieces


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """{"ok": BERT (2 layers, 64 positions) + its tokenizer, "notok": the same without a tokenizer,
    "small": the same with a 7-word tokenizer}."""
    tok = _bert_tokenizer()
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                  intermediate_size=64, max_position_embeddings=POSITIONS)
    model = transformers.BertModel(cfg)
    out = {}
    for kind in ("ok", "notok", "small"):
        d = tmp_path_factory.mktemp(kind)
        model.save_pretrained(d)
        out[kind] = str(d)
    tok.save_pretrained(out["ok"])
    vocab = Path(out["small"]) / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"]) + "\n")
    transformers.BertTokenizer(str(vocab)).save_pretrained(out["small"])
    return out


def _run(capsys, args):
    rc = cli.main(args + ["--no-progress"])
    out, err = capsys.readouterr()
    return rc, out, err


def _refused(capsys, args, option, *fix):
    rc, out, err = _run(capsys, args)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in err and "Traceback" not in out
    line = [ln for ln in err.splitlines() if ln.startswith("attnlip analyze: error:")]
    assert len(line) == 1, err
    assert option in line[0], line[0]
    for f in fix:
        assert f in line[0], line[0]
    assert "ratio = bound" not in out  # nothing was computed
    return line[0]


# ---- options alone --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, option, fix", [
    (["--layers", "99"], "--layers", ["layer 99 does not exist", "from 0 to 1"]),
    (["--layers", "-3"], "--layers", ["layer -3 does not exist", "-2 to -1"]),
    (["--layers", "0,a"], "--layers", ["'a' is not a layer index", "--layers 0,5"]),
    (["--layers", ","], "--layers", ["names no layer"]),
    (["--max-tokens", "0"], "--max-tokens", ["N >= 2"]),
    (["--max-tokens", "1"], "--max-tokens", ["N >= 2"]),
    (["--max-tokens", "-5"], "--max-tokens", ["N >= 2"]),
    (["--max-tokens", "2"], "--max-tokens", ["special token", "--max-tokens 3 or more"]),
    (["--max-tokens", "100"], "--max-tokens", [f"{POSITIONS} positions", f"--max-tokens {POSITIONS} or less"]),
    (["--samples", "0"], "--samples", ["K >= 1"]),
    (["--eps", "-1"], "--eps", ["in [0, 1e+06]", "--eps 0 to skip"]),
    (["--eps", "nan"], "--eps", ["in [0, 1e+06]"]),
    (["--eps", "1e308"], "--eps", ["in [0, 1e+06]"]),  # no inf bound, no PGD lower bound of 0
    (["--pgd-steps", "-1"], "--pgd-steps", ["--pgd-steps 0 to skip"]),
    (["--pgd-steps", "1000000000"], "--pgd-steps", ["would run for hours", "at most 10000"]),
    (["--threads", "999"], "--threads", ["available core(s) would only slow", "or less"]),
    (["--device", "gpu7"], "--device", ["--device cpu"]),
])
def test_bad_option_is_refused_with_its_fix(folders, capsys, extra, option, fix):
    _refused(capsys, ["--model", folders["ok"], "--text", TEXT] + extra, option, *fix)


def test_unavailable_device_is_refused(folders, capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _refused(capsys, ["--model", folders["ok"], "--text", TEXT, "--device", "cuda"], "--device",
             "not available", "--device cpu")


def test_empty_texts_are_refused(folders, capsys, tmp_path):
    _refused(capsys, ["--model", folders["ok"], "--text", ""], "--text", "text 1 is empty")
    _refused(capsys, ["--model", folders["ok"], "--text", TEXT, "--text", "   "], "--text", "text 2 is empty")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    _refused(capsys, ["--model", folders["ok"], "--text-file", str(empty)], "--text-file", "holds no text",
             "one per line")
    _refused(capsys, ["--model", folders["ok"], "--text-file", str(tmp_path / "absent.txt")], "--text-file",
             "is not a file")


def test_out_is_checked_before_computing(folders, capsys, tmp_path):
    """--out must be a writable folder outside run_all.py's results: refused before any model loads, one line."""
    from harness.store.codehash import REPO_ROOT

    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    _refused(capsys, ["--model", folders["ok"], "--text", TEXT, "--out", str(a_file)], "--out", "is a file",
             "name a folder")
    assert a_file.read_text() == "keep me"
    committed = REPO_ROOT / "results" / "quick" / "castin_gamma"
    before = {f: f.read_bytes() for f in committed.rglob("*") if f.is_file()} if committed.is_dir() else {}
    _refused(capsys, ["--model", folders["ok"], "--text", TEXT, "--out", str(committed)], "--out",
             "holds results of run_all.py", "outside results/")
    assert {f: f.read_bytes() for f in committed.rglob("*") if f.is_file()} == before
    run_output = tmp_path / "elsewhere"
    run_output.mkdir()
    (run_output / "manifest.json").write_text('{"experiment": "castin_gamma", "cells": []}')
    _refused(capsys, ["--model", folders["ok"], "--text", TEXT, "--out", str(run_output)], "--out",
             "holds results of run_all.py")
    _refused(capsys, ["--model", folders["ok"], "--text", TEXT, "--out", str(a_file / "sub")], "--out",
             "not writable", "a folder you can write to")


def _copy(folder, dst):
    import shutil

    shutil.copytree(folder, dst)
    return dst


def test_a_model_folder_that_would_run_code_is_refused(folders, capsys, tmp_path, monkeypatch):
    """auto_map, an unknown model_type or pickle-only weights: refused before transformers opens the folder, so
    its custom-code prompt never appears and a piped `y` runs nothing."""
    import json

    marker = tmp_path / "ran"
    planted = f"open({str(marker)!r}, 'w').write('code ran')\n"
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("y\ny\ny\n"))  # a user answering yes
    remote = _copy(folders["ok"], tmp_path / "remote")
    (remote / "evil.py").write_text(planted + "from transformers import BertConfig as EvilConfig\n"
                                    "from transformers import BertModel as EvilModel\n")
    cfg = json.loads((remote / "config.json").read_text())
    cfg.update(model_type="evil-net", auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"})
    (remote / "config.json").write_text(json.dumps(cfg))
    _refused(capsys, ["--model", str(remote), "--text", TEXT], "--model", "auto_map", "never runs code")
    del cfg["auto_map"]
    (remote / "config.json").write_text(json.dumps(cfg))
    _refused(capsys, ["--model", str(remote), "--text", TEXT], "--model", "model_type 'evil-net'")
    tok = _copy(folders["ok"], tmp_path / "tok")
    tcfg = json.loads((tok / "tokenizer_config.json").read_text())
    tcfg["auto_map"] = {"AutoTokenizer": ["evil.EvilTokenizer", None]}
    (tok / "tokenizer_config.json").write_text(json.dumps(tcfg))
    _refused(capsys, ["--model", str(tok), "--text", TEXT], "--model", "tokenizer_config.json", "auto_map")
    pickled = _copy(folders["ok"], tmp_path / "pickled")  # a pickle that would run code when unpickled
    for f in pickled.glob("*.safetensors"):
        f.unlink()
    import pickle as _pickle
    import torch as _torch

    class Planted:
        def __reduce__(self):
            return (exec, (planted,))

    _torch.save({"weight": Planted()}, pickled / "pytorch_model.bin", pickle_module=_pickle)
    rc, out, err = _run(capsys, ["--model", str(pickled), "--text", TEXT])
    assert rc == 2 and "Traceback" not in err and not marker.exists(), err
    (remote / "config.json").write_text("{not json")
    _refused(capsys, ["--model", str(remote), "--text", TEXT], "--model", "not readable JSON")
    assert not marker.exists()


def test_the_loader_itself_never_runs_a_folders_code(folders, tmp_path, monkeypatch):
    """Second line of defence behind the folder check: inputs.load_model passes trust_remote_code=False, so a
    folder with custom code is an error even when a caller skips the check and stdin answers `y`."""
    import json

    from harness.analyze import inputs

    marker = tmp_path / "ran"
    monkeypatch.setattr("sys.stdin", __import__("io").StringIO("y\ny\ny\n"))
    remote = _copy(folders["ok"], tmp_path / "remote")
    (remote / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('code ran')\n"
                                    "from transformers import BertConfig as EvilConfig\n"
                                    "from transformers import BertModel as EvilModel\n")
    cfg = json.loads((remote / "config.json").read_text())
    cfg.update(model_type="evil-net", auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"})
    (remote / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError):
        inputs.load_model(str(remote))
    assert not marker.exists()


def test_without_out_it_says_nothing_was_written(folders, capsys):
    assert cli.main(["--model", folders["ok"], "--text", TEXT, "--layers", "0", "--eps", "0", "--pgd-steps", "0",
                     "--no-progress"]) in (0, 1)
    assert "nothing written (--out FOLDER keeps" in capsys.readouterr().err


# ---- the model and its tokenizer ------------------------------------------------------------------------------
def test_missing_model_names_the_real_fix(capsys, tmp_path):
    msg = _refused(capsys, ["--model", str(tmp_path / "no_such_model"), "--text", TEXT], "--model",
                   "no such folder", "save_pretrained")
    assert "pretrained='auto'" not in msg
    msg = _refused(capsys, ["--model", str(tmp_path), "--text", TEXT], "--model", "without config.json",
                   "save_pretrained")


def test_folder_without_tokenizer_is_refused(folders, capsys):
    _refused(capsys, ["--model", folders["notok"], "--text", TEXT], "--model", "tokenizer",
             "tokenizer.save_pretrained")


def test_tokenizer_of_another_vocabulary_is_refused(folders, capsys):
    _refused(capsys, ["--model", folders["small"], "--text", TEXT], "--model",
             "the tokenizer knows 7 tokens but the model embeds 30522", ".save_pretrained(DIR)")


def test_texts_the_tokenizer_cannot_read_are_refused(folders, capsys):
    _refused(capsys, ["--model", folders["ok"], "--text", "\U0001F600 \U0001F431 \U0001F436"], "--model",
             "100% of the 3 text tokens", "[UNK]")


# ---- valid edge cases still run ---------------------------------------------------------------------------------
def test_negative_layer_counts_from_the_last(folders, capsys, tmp_path):
    rc, out, err = _run(capsys, ["--model", folders["ok"], "--text", TEXT, "--layers", "-1", "--eps", "0",
                                 "--out", str(tmp_path / "o")])
    assert rc == 0, err
    import pandas as pd

    assert set(pd.read_csv(tmp_path / "o" / "table.csv")["layer"]) == {1}


def test_default_max_tokens_is_capped_at_the_models_positions_with_a_notice(folders, capsys, tmp_path):
    rc, out, err = _run(capsys, ["--model", folders["ok"], "--text", LONG, "--layers", "0", "--eps", "0",
                                 "--out", str(tmp_path / "o")])
    assert rc == 0, err
    assert f"note: --max-tokens defaults to 128, but the model has {POSITIONS} positions" in err
    import pandas as pd

    assert set(pd.read_csv(tmp_path / "o" / "table.csv")["n_tokens"]) == {POSITIONS}
    rc, out, err = _run(capsys, ["--model", folders["ok"], "--text", LONG, "--layers", "0", "--eps", "0",
                                 "--max-tokens", "10"])
    assert rc == 0 and "--max-tokens defaults" not in err  # no cap notice (a thread-count note may appear)
    assert out.splitlines()[2].split()[:2] == ["0", "10"]
    assert "1 of 1 text(s) are longer than 10 tokens" in err and f"--max-tokens up to {POSITIONS}" in err
    rc, out, err = _run(capsys, ["--model", folders["ok"], "--text", TEXT, "--layers", "0", "--eps", "0",
                                 "--max-tokens", "10"])
    assert rc == 0 and "truncated" not in err  # a text that fits is not reported


def test_python_api_refuses_the_same_mistakes(folders):
    with pytest.raises(validate.UsageError, match="layer 2 does not exist"):
        analyze(folders["ok"], TEXT, layers=[2])
    with pytest.raises(validate.UsageError, match="--eps"):
        analyze(folders["ok"], TEXT, eps=-0.5)
    with pytest.raises(validate.UsageError, match="--max-tokens: 65 exceeds"):
        analyze(folders["ok"], TEXT, max_tokens=65)
    with pytest.raises(validate.UsageError, match="text 1 is empty"):
        analyze(folders["ok"], [""])


def test_position_limit_counts_roberta_padding_offset():
    cfg = transformers.RobertaConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=16, max_position_embeddings=70, pad_token_id=1)
    assert validate.position_limit(transformers.RobertaModel(cfg)) == 68
    assert validate.position_limit(torch.nn.MultiheadAttention(8, 2)) is None


def test_command_line_prints_no_traceback(folders):
    """The installed entry point's code path, in a fresh interpreter: a usage error is one line, status 2."""
    r = subprocess.run([sys.executable, "-m", "harness.analyze.cli", "--model", folders["ok"], "--text", TEXT,
                        "--layers", "7", "--no-progress"], capture_output=True, text=True, cwd=REPO,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr and "--layers: layer 7 does not exist" in r.stderr


# ---- figures read on the table's axis -------------------------------------------------------------------------
def _figures(monkeypatch, draw, df, tmp_path):
    """The matplotlib figure `draw(df, path)` saves (captured at savefig)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    got = []
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: got.append(self))
    draw(df, tmp_path / "fig.png")
    assert len(got) == 1
    return got[0]


def _table(ratios):
    """A minimal analyze table: per (method, scope) a ratio for 2 layers x 2 heads, truth 2 everywhere."""
    import pandas as pd

    rows = []
    for (m, scope, kind), r in ratios.items():
        for layer in (0, 1):
            for head in ((0, 1) if scope == "head" else (-1,)):
                v = r * (1 + layer + max(head, 0))
                rows.append(dict(input=0, n_tokens=5, layer=layer, head=head, scope=scope, method=m, kind=kind,
                                 value=2 * v, truth=2.0, ratio=v, sound=True))
    return pd.DataFrame(rows)


def test_heatmap_gives_each_bound_its_own_log_colour_scale(monkeypatch, tmp_path):
    from harness.analyze import report

    df = _table({("jasmin", "head", "upper"): 10.0, ("kim", "head", "upper"): 1e9})
    fig = _figures(monkeypatch, report.heatmap, df, tmp_path)
    norms = {ax.get_title().split(":")[0]: ax.images[0].norm for ax in fig.axes if ax.images}
    assert set(norms) == {"JaSMin", "Kim"}
    assert (norms["JaSMin"].vmin, norms["JaSMin"].vmax) == (10.0, 30.0)  # its own range, not Kim's
    assert (norms["Kim"].vmin, norms["Kim"].vmax) == (1e9, 3e9)
    assert all(type(n).__name__ == "LogNorm" for n in norms.values())


def test_layer_plot_shows_the_tables_ratios(monkeypatch, tmp_path):
    from harness.analyze import report

    df = _table({("truth", "layer", "exact"): 1.0, ("lofast_sharp", "layer", "upper"): 40.0,
                 ("pgd", "layer", "lower"): 0.9})
    fig = _figures(monkeypatch, report.layer_plot, df, tmp_path)
    lines = {ln.get_label(): list(ln.get_ydata()) for ln in fig.axes[0].lines}
    assert lines["LoF-sharp"] == [40.0, 80.0] and lines["PGD"] == [0.9, 1.8]
    assert lines["truth (= 1)"] == [1.0, 1.0] and fig.axes[0].get_yscale() == "log"


def test_forward_pass_runs_where_the_model_is(monkeypatch):
    """A module handed to analyze keeps its device: the inputs go to the model's device for the forward pass, the
    bounds to options.device (a CUDA-resident bound computation of a CPU model used to fail in the embedding)."""
    import transformers

    from harness.analyze import core

    torch.manual_seed(0)
    cfg = transformers.BertConfig(hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                  vocab_size=50)
    model = transformers.BertModel(cfg).eval()
    seen = []
    real = core.model_inputs
    monkeypatch.setattr(core, "model_inputs", lambda *a: (seen.append(a[-1]), real(*a))[1])
    df = analyze(model, {"input_ids": torch.tensor([[1, 7, 9, 2]])}, methods=["kim"], eps=0.0, entry_points=False)
    assert seen == [torch.device("cpu")] == [core.forward_device(model)] and df["sound"].all()
    assert core.forward_device(torch.nn.ReLU()) == torch.device("cpu")  # no parameters: the CPU
