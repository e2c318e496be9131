"""The tiny synthetic data mirror the suite builds when $ATTNLIP_DATA is unset (tests/_tiny_mirror.py): every
dataset the mirror layout covers resolves through it and loads with the toolkit's loaders and NLTK's readers, its
GPT-2 tokenizer loads through harness.models.text, it is deterministic and fast, and its files have the real
mirror's shape (checked against the real mirror when one is set)."""
from __future__ import annotations

import csv
import json
import time
import zipfile

import pytest

from harness.data import resolve, sources, text
from tests import _tiny_mirror as T


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    t = time.perf_counter()
    root = T.build(tmp_path_factory.mktemp("tiny"))
    return root, time.perf_counter() - t


@pytest.fixture
def on_tiny(tiny, tmp_path, monkeypatch):
    """The tiny mirror as the only data source: no NLTK folder, an empty hub cache, downloads off."""
    root, _ = tiny
    monkeypatch.setenv("ATTNLIP_DATA", str(root))
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "no-nltk"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    monkeypatch.setenv("ATTNLIP_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return root


def _polarity_reader(root):
    """NLTK's own reader for sentence_polarity (as nltk.corpus.sentence_polarity builds it) over the mirror."""
    from nltk.corpus.reader import CategorizedSentencesCorpusReader

    return resolve.nltk_reader(root / "nltk_data", "sentence_polarity", CategorizedSentencesCorpusReader,
                               r"rt-polarity\.(neg|pos)", cat_pattern=r"rt-polarity\.(neg|pos)", encoding="utf-8")


def test_every_mirror_dataset_resolves_through_the_tiny_mirror(on_tiny):
    with_mirror = [n for n, d in sources.DATASETS.items() if d.mirror]
    assert set(T.LEFT_OUT) <= set(with_mirror)
    for name in with_mirror:
        d = sources.DATASETS[name]
        if name in T.LEFT_OUT:
            assert not any((on_tiny / f).exists() for f in d.mirror), name
            continue
        r = resolve.locate(name)
        assert (r.kind, r.path, r.source) == ("mirror", on_tiny, f"mirror:{name}"), name
        assert all(f.split("/")[0] in sources.MIRROR_LAYOUT for f in d.mirror)


def test_tiny_mirror_loads_with_the_toolkit_and_nltk(on_tiny):
    alice = text.load_corpus("alice")
    assert alice[0].startswith("[Alice's Adventures") and len(" ".join(alice).split()) > 10000
    brown = text.load_corpus("brown")
    assert len(brown) >= 30 and all(p and "/" not in p for p in brown)
    t, y = text.load_labeled("sst2", "train")
    assert len(t) >= 1000 and set(y) == {0, 1}
    pos = set(T.POSITIVE)  # the label is carried by a sentiment word, so classifiers can learn it
    assert all((set(s.split()) & pos != set()) == bool(lab) for s, lab in zip(t, y))
    assert set(text.load_labeled("sst2", "dev")[1]) == {0, 1}
    ag, lab = text.load_labeled("ag_news")
    assert len(ag) >= 300 and set(lab) == {0, 1, 2, 3} and any("," in a for a in ag)
    pol = _polarity_reader(on_tiny)
    assert pol.categories() == ["neg", "pos"] and len(pol.sents(categories="pos")) == 100


def test_tiny_gpt2_tokenizer_loads_through_the_toolkit(on_tiny):
    from harness.models import text as models_text

    models_text.gpt2_tokenizer.cache_clear()
    try:
        tok = models_text.gpt2_tokenizer()
        assert tok.name_or_path == str(on_tiny / "gpt2_tokenizer")
        assert tok.eos_token == tok.bos_token == tok.unk_token == T.EOT and tok.eos_token_id == len(tok) - 1
        assert text.special_affixes(tok) == ([], [])  # like GPT-2: no bos/eos added around a sequence
        s = "Alice was beginning to get very tired, caf\u00e9!"
        ids = tok(s)["input_ids"]
        assert tok.decode(ids) == s and len(ids) < len(s.split()) * 4  # byte-level BPE with learned merges
        assert tok(" Alice")["input_ids"] != tok("Alice")["input_ids"]  # no prefix space added
        chunks = text.token_chunks(tok, text.load_corpus("alice"), 64, 16)  # the quick scale's windows fit
        assert chunks.shape == (16, 64) and int(chunks.max()) < len(tok)
    finally:
        models_text.gpt2_tokenizer.cache_clear()


def test_tiny_analyze_datasets(on_tiny):
    from harness.analyze import inputs

    sst = inputs.load_dataset_texts("sst2:validation", 5)
    assert len(sst) == 5 and all(isinstance(s, str) and s for s in sst)
    assert len(inputs.load_dataset_texts("ag_news", 3)) == 3


def test_build_is_deterministic_and_fast(tiny, tmp_path):
    root, seconds = tiny
    assert seconds < 5, f"building the tiny mirror took {seconds:.1f} s"
    again = T.build(tmp_path / "again")
    files = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert all((root / f).read_bytes() == (again / f).read_bytes() for f in files)
    assert len(files) == 9


def _shape(root):
    """What the loaders rely on in a mirror: its files, headers, zip members' folders and tokenizer settings."""
    out = {"files": sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()
                           and p.parts[len(root.parts)] in ("nltk_data", "sst2", "ag_news", "gpt2_tokenizer"))}
    for f in ("sst2/train.tsv", "sst2/dev.tsv", "ag_news/test.csv"):
        with open(root / f, encoding="utf-8") as fh:
            out[f] = fh.readline().rstrip("\n")
    with open(root / "ag_news" / "test.csv", newline="", encoding="utf-8") as fh:
        out["ag_labels"] = sorted({r["label"] for r in csv.DictReader(fh)})
    for z in ("brown", "sentence_polarity"):
        with zipfile.ZipFile(root / "nltk_data" / "corpora" / f"{z}.zip") as zf:
            names = zf.namelist()
        out[z] = (names[0], set(names))  # NLTK's package shape: a top folder entry first, then its files
    cfg = json.loads((root / "gpt2_tokenizer" / "tokenizer_config.json").read_text())
    out["tokenizer"] = {k: cfg.get(k) for k in ("tokenizer_class", "bos_token", "eos_token", "unk_token",
                                                "add_prefix_space", "pad_token")}
    return out


def test_tiny_mirror_has_the_real_mirrors_shape(tiny, real_mirror):
    got, want = _shape(tiny[0]), _shape(real_mirror)
    assert got["files"] == [f for f in want["files"] if f in got["files"]]  # each tiny file exists in the real one
    assert {f.split("/")[0] for f in got["files"]} == {f.split("/")[0] for f in want["files"]}
    for z in ("brown", "sentence_polarity"):  # the same top folder; every tiny member has a real namesake
        assert got[z][0] == want[z][0] and got[z][1] <= want[z][1], (z, got[z][1] - want[z][1])
    for k in ("sst2/train.tsv", "sst2/dev.tsv", "ag_news/test.csv", "ag_labels", "tokenizer"):
        assert got[k] == want[k], k


def test_real_gpt2_tokenizer(real_mirror):
    """The real mirror's GPT-2 tokenizer (or a cached hub copy): GPT-2's 50,257 tokens, <|endoftext|> last."""
    from harness.models import text as models_text

    tok = models_text.gpt2_tokenizer()
    assert len(tok) == 50257 and tok.eos_token == T.EOT and tok.eos_token_id == 50256
