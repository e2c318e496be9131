"""What `attnlip analyze` and run_all.py are handed is checked, and what they print is whole: a damaged data file,
a text of invisible characters and a seed no generator takes are one error line and exit 2 (never a made-up input,
an analysis of special tokens alone or a traceback); --help ends its last line; --no-progress silences the model
library's progress bars too."""
from __future__ import annotations

import pytest

from harness import cli as run_cli
from harness.analyze import cli

TEXT = "The cat sat on the mat."


def without_notes(err: str) -> str:
    """stderr without the commands' notes (e.g. how many cores are free), which depend on the machine's load."""
    return "".join(ln for ln in err.splitlines(keepends=True) if ": note: " not in ln)


def _refused(capsys, argv, *parts, prog="attnlip analyze", main=cli.main):
    rc = main(argv)
    out, err = capsys.readouterr()
    err = without_notes(err)
    assert rc == 2, (rc, out, err)
    assert "Traceback" not in out + err and err.count("\n") == 1 and err.startswith(f"{prog}: error: "), err
    for p in parts:
        assert p in err, err
    return err


def test_a_truncated_mirror_file_is_an_error_not_an_input(tmp_path, monkeypatch, capsys):
    from tests._tiny_mirror import build

    root = build(tmp_path / "mirror")
    f = root / "ag_news" / "test.csv"
    whole = f.read_text(encoding="utf-8")
    f.write_text(whole[: whole.index("\n", 200) + 20], encoding="utf-8")  # cut 20 characters into a row
    monkeypatch.setenv("ATTNLIP_DATA", str(root))
    _refused(capsys, ["--model", "tiny-bert", "--dataset", "ag_news", "--samples", "3", "--no-progress"],
             f"{f}: line", "truncated or damaged", "copy ag_news/test.csv into the mirror again")


@pytest.mark.parametrize("text, shown", [("\u200b\u200b", "U+200B U+200B"), ("\u202e", "U+202E"),
                                         ("\ufeff \u2060", "U+FEFF U+2060"), ("\x00", "U+0000")])
def test_a_text_of_invisible_characters_is_empty(capsys, text, shown):
    _refused(capsys, ["--model", "tiny-bert", "--text", TEXT, "--text", text, "--no-progress"],
             "--text: text 2 is empty", f"invisible characters only: {shown}")


def test_a_text_the_tokenizer_drops_entirely_is_refused(capsys):
    """Combining accents alone are visible, but BERT's uncased tokenizer strips them: no token of the text's own."""
    _refused(capsys, ["--model", "tiny-bert", "--text", TEXT, "--text", "\u0301\u0301", "--layers", "0", "--eps",
                      "0", "--no-progress"], "text 2 holds no token beside the tokenizer's special tokens")


@pytest.mark.parametrize("seed", ["99999999999999999999999", "-1", str(2**63)])
def test_a_seed_no_generator_takes_is_a_usage_error(capsys, tmp_path, seed):
    _refused(capsys, ["--model", "tiny-bert", "--text", TEXT, "--seed", seed, "--no-progress"],
             f"--seed: {seed} is not a seed", "from 0 to")
    _refused(capsys, ["castin_gamma", "--scale", "test", "--seed", seed, "--results-dir", str(tmp_path), "--dry-run"],
             f"--seed {seed} is not a seed", prog="run_all.py", main=run_cli.main)


def test_certify_refuses_an_invisible_text(tmp_path, capsys):
    import torch
    import transformers

    from harness.certify import cli as certify_cli
    from tests.test_analyze import _bert_tokenizer

    torch.manual_seed(0)
    cfg = transformers.BertConfig(vocab_size=30522, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=16, max_position_embeddings=32, num_labels=2)
    transformers.BertForSequenceClassification(cfg).save_pretrained(tmp_path)
    _bert_tokenizer().save_pretrained(tmp_path)
    capsys.readouterr()  # transformers' "Writing model shards" bar
    rc = certify_cli.main(["--model", str(tmp_path), "--text", "\u200b\u202e", "--no-progress"])
    err = without_notes(capsys.readouterr().err)
    assert rc == 2 and err.count("\n") == 1 and "--text: text 1 is empty (invisible characters only" in err, err
