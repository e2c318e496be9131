"""Data enters a cell's key by content: an edited mirror file gives a new key and a recomputed cell, with the plan
saying why; a file only touched keeps its key; the file hashes are memoized by size and times."""
from __future__ import annotations

import json
import os

import pytest

from harness import catalog, cli
from harness import run as runner
from harness.data import identity
from tests._harness_fakes import registered_reader

ALICE = "nltk_data/corpora/gutenberg/carroll-alice.txt"

FAKE = '''
import hashlib

from harness.catalog import Experiment, experiment


@experiment
class FakeReadsAlice(Experiment):
    """Fake: the first paragraph of Alice, as a number."""

    name = "_fake_reads_alice"
    grid = {"corpus": ["alice"]}

    def run(self, cell, ctx):
        from harness.data import text

        first = text.load_corpus("alice")[0]
        return [{"first": int(hashlib.sha256(first.encode()).hexdigest()[:8], 16)}]
'''


@pytest.fixture
def alice(tmp_path, monkeypatch):
    """A mirror holding only Alice (three paragraphs), the only data source; the fake experiment registered."""
    mirror = tmp_path / "mirror"
    f = mirror / ALICE
    f.parent.mkdir(parents=True)
    f.write_text("First paragraph here.\n\nSecond one.\n\nThird and last.\n")
    for _ in registered_reader(tmp_path, monkeypatch, mirror, "fake_alice", FAKE, "_fake_reads_alice"):
        yield f


def _cfg(tmp_path):
    return runner.RunConfig(results_dir=tmp_path / "results", figures=False, progress=False)


def _run(tmp_path, lines=None):
    out = [] if lines is None else lines
    (r,) = runner.run(["_fake_reads_alice"], _cfg(tmp_path), echo=out.append)
    return r


def _value(tmp_path):
    import pandas as pd

    return int(pd.read_csv(tmp_path / "results" / "_fake_reads_alice" / "table.csv")["first"].iloc[0])


def _key(tmp_path):
    return runner.plan("_fake_reads_alice", _cfg(tmp_path)).tasks[0].key


def test_edited_data_file_gives_a_new_key_and_is_recomputed(alice, tmp_path):
    r = _run(tmp_path)
    assert (r.computed, r.cached) == (1, 0)
    before, key = _value(tmp_path), _key(tmp_path)
    alice.write_text("Third and last.\n\nSecond one.\n\nFirst paragraph here.\n")  # the same lines, shuffled
    assert _key(tmp_path) != key
    dry = []
    cli.main(["_fake_reads_alice", "--dry-run", "--results-dir", str(tmp_path / "results")], out=dry.append)
    assert any("missing" in s and "data changed: alice (sha256 " in s for s in dry), dry
    lines = []
    r = _run(tmp_path, lines)
    assert (r.computed, r.cached) == (1, 0), lines
    assert any("computing 1 cell(s) again: data changed: alice" in s for s in lines), lines
    assert _value(tmp_path) != before  # the shuffled file's first paragraph, not the cached one
    man = json.loads((tmp_path / "results" / "_fake_reads_alice" / "manifest.json").read_text())
    assert set(man["cells"][0]["data_identity"]) == {"alice"}


def test_touched_data_file_keeps_its_key(alice, tmp_path):
    r = _run(tmp_path)
    key = _key(tmp_path)
    st = alice.stat()
    os.utime(alice, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # mtime only, same bytes
    assert _key(tmp_path) == key
    r = _run(tmp_path)
    assert (r.computed, r.cached) == (0, 1)


def test_file_hashes_are_memoized_by_size_and_times(alice, tmp_path, monkeypatch):
    memo = tmp_path / "memo"
    first = identity.digest("alice", memo)
    assert first and (memo / identity.MEMO_FILE).is_file()
    identity._MEMO.clear()  # a new process: the memo file answers, nothing is read again
    monkeypatch.setattr(identity, "_sha256_file", lambda p: pytest.fail(f"{p} hashed again"))
    assert identity.digest("alice", memo) == first
    monkeypatch.undo()
    alice.write_text(alice.read_text().upper())
    assert identity.digest("alice", memo) != first


def test_hub_and_synthetic_data_add_nothing_to_the_key(alice, tmp_path):
    exp = catalog.get_experiment("_fake_reads_alice")
    assert runner.plan("_fake_reads_alice", _cfg(tmp_path)).tasks[0].data_identity.keys() == {"alice"}
    from harness.run.plan import data_identity

    assert data_identity(exp, {"corpus": "synthetic"}) is None


def test_the_gpt2_tokenizer_a_model_reads_is_part_of_the_key(tmp_path, monkeypatch):
    """tiny-gpt2 and the Llama-size panels tokenize with the GPT-2 tokenizer from the hub cache or the mirror: a
    replaced tokenizer gives the cells that read it a new identity, and other models none."""
    import importlib

    from tests._tiny_mirror import gpt2_tokenizer

    plan = importlib.import_module("harness.run.plan")  # the module (harness.run.plan is also its function)

    folder = tmp_path / "mirror" / "gpt2_tokenizer"
    gpt2_tokenizer(folder, ["alpha beta gamma " * 40, "the cat sat on the mat " * 40])
    monkeypatch.setenv("ATTNLIP_DATA", str(tmp_path / "mirror"))
    from harness.models import hub

    monkeypatch.setattr(hub, "cached_snapshot", lambda *a, **k: None)  # no cached snapshot: the mirror's folder
    exp = catalog.get_experiment("castin_sqrt_n")  # any experiment: data_identity reads the cell and the source
    src = "random-init:tiny-gpt2(seed=0)"
    first = plan.data_identity(exp, {}, tmp_path / "memo", src)
    assert set(first) == {"gpt2_tokenizer"}
    assert plan.data_identity(exp, {}, tmp_path / "memo", "random-init:tiny-bert(seed=0)") is None
    gpt2_tokenizer(folder, ["zebra quux " * 50, "other words entirely " * 40])
    assert plan.data_identity(exp, {}, tmp_path / "memo", src) != first
    assert plan.data_identity(exp, {}, tmp_path / "memo", "random-init:llama-7b(tokenizer=gpt2,seed=0)") == \
        plan.data_identity(exp, {}, tmp_path / "memo", src)


def test_a_damaged_gpt2_tokenizer_is_named_with_its_fix(tmp_path, monkeypatch):
    """A cut-off tokenizer.json in the mirror's gpt2_tokenizer/: MissingData naming the folder and the fetch, which
    skips the cells that read it (never a JSONDecodeError traceback)."""
    from harness.errors import MissingData
    from harness.models import hub, text as models_text
    from tests._tiny_mirror import gpt2_tokenizer

    folder = tmp_path / "mirror" / "gpt2_tokenizer"
    gpt2_tokenizer(folder, ["alpha beta gamma " * 40])
    data = (folder / "tokenizer.json").read_bytes()
    (folder / "tokenizer.json").write_bytes(data[:len(data) // 2])
    monkeypatch.setenv("ATTNLIP_DATA", str(tmp_path / "mirror"))
    monkeypatch.setattr(hub, "cached_snapshot", lambda *a, **k: None)
    monkeypatch.setattr(hub, "remote", lambda name: hub.Remote(name, None, (), "offline"))
    models_text.gpt2_tokenizer.cache_clear()
    with pytest.raises(MissingData, match="not a readable GPT-2 tokenizer") as e:
        models_text.gpt2_tokenizer()
    assert str(folder) in str(e.value) and "attnlip data fetch gpt2_tokenizer" in e.value.fix
    models_text.gpt2_tokenizer.cache_clear()
