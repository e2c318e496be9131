"""What `attnlip analyze` and `attnlip certify` write is whole or absent: a write that fails part-way (a full disk)
leaves every earlier output complete and no partial file, in an old folder or a new one; --no-progress silences
the model library's progress bars too (transformers' "Loading weights")."""
from __future__ import annotations

import errno

import pandas as pd
import pytest

from harness.analyze import cli

from tests.test_analyze_validation import TEXT, folders  # noqa: F401 - folders: a tiny saved BERT (fixture)

RUN = ["--text", TEXT, "--layers", "0", "--eps", "0", "--pgd-steps", "0", "--no-progress"]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """A tiny saved BERT sequence classifier with its tokenizer (for attnlip certify)."""
    import torch
    import transformers

    from tests.test_analyze import _bert_tokenizer

    d = tmp_path_factory.mktemp("classifier")
    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=16, max_position_embeddings=32, num_labels=2)
    transformers.BertForSequenceClassification(cfg).save_pretrained(d)
    _bert_tokenizer().save_pretrained(d)
    return str(d)


def _disk_fills_during(monkeypatch, name: str) -> None:
    """pandas' to_csv writes part of `name`, then the disk is full."""
    real = pd.DataFrame.to_csv

    def to_csv(self, path=None, *a, **kw):
        if path is not None and str(path).endswith(name):
            with open(path, "w") as fh:
                fh.write(real(self, None, *a, **kw)[:40])
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, path, *a, **kw)

    monkeypatch.setattr(pd.DataFrame, "to_csv", to_csv)


def _files(folder):
    return {f.name: f.read_bytes() for f in folder.rglob("*") if f.is_file()}


def test_a_failed_analyze_write_keeps_the_earlier_outputs_whole(folders, tmp_path, monkeypatch, capsys):  # noqa: F811
    out = tmp_path / "out"
    assert cli.main(["--model", folders["ok"], *RUN, "--out", str(out)]) == 0
    before = _files(out)
    assert {"table.csv", "table.parquet", "summary.md", "report.json", "heatmap.png"} <= set(before)
    capsys.readouterr()
    _disk_fills_during(monkeypatch, "table.csv")
    assert cli.main(["--model", folders["ok"], *RUN, "--seed", "1", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"writing {out} failed: OSError: [Errno {errno.ENOSPC}]" in err and "Traceback" not in err
    assert _files(out) == before  # the old set, complete; no temp folder or partial file left
    new = tmp_path / "new"
    assert cli.main(["--model", folders["ok"], *RUN, "--out", str(new)]) == 1
    assert _files(new) == {}


def test_a_failed_certify_write_keeps_the_earlier_outputs_whole(classifier, tmp_path, monkeypatch, capsys):
    from harness.certify import cli as certify_cli

    out = tmp_path / "cert"
    run = ["--model", classifier, "--text", TEXT, "--no-attack", "--no-network", "--no-progress", "--out", str(out)]
    assert certify_cli.main(run) == 0
    before = _files(out)
    assert {"table.csv", "summary.md", "radii.png"} <= set(before)
    capsys.readouterr()
    _disk_fills_during(monkeypatch, "table.csv")
    assert certify_cli.main(run + ["--text", "a different film"]) == 1
    err = "\n".join(ln for ln in capsys.readouterr().err.splitlines() if ": note: " not in ln)
    assert err.count("\n") == 0 and f"writing {out} failed: OSError: [Errno {errno.ENOSPC}]" in err, err
    assert _files(out) == before


def test_no_progress_silences_the_model_librarys_bars(folders, classifier, capsys):  # noqa: F811
    from transformers.utils import logging as tl

    from harness.certify import cli as certify_cli

    cli.main(["--model", folders["ok"], *RUN[:-1]])
    assert "Loading weights" in capsys.readouterr().err  # the control: loading a folder draws transformers' bar
    assert cli.main(["--model", folders["ok"], *RUN]) == 0
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err, err
    assert tl.is_progress_bar_enabled()  # switched back on for the rest of the process
    capsys.readouterr()
    assert certify_cli.main(["--model", classifier, "--text", TEXT, "--no-attack", "--no-network", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err, err
