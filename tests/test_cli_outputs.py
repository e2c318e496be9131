"""What `attnlip analyze` and `attnlip certify` write is whole or absent: a write that fails part-way (a full disk)
leaves every earlier output complete and no partial file, in an old folder or a new one; --no-progress silences
the model library's progress bars too (transformers' "Loading weights")."""
from __future__ import annotations

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
