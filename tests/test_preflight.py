"""Before anything runs, the planner checks every dataset and model a cell declares (Experiment.data_names,
model_source); a cell missing any is skipped with one message per missing item, printed once however many cells
need it, while the cells that can run still run. Experiments that read a corpus or images declare it, so its
resolved source is in their cell keys."""
from __future__ import annotations

import pytest

from harness import cli, catalog
from harness import run as runner
from harness.catalog import Experiment, experiment
from harness.run import substitutes

CALLS: list = []


class _NeedsThings(Experiment):
    """n=1 needs nothing, n=2 the Alice corpus, n=3 Alice and pretrained BERT-base."""

    name = "_preflight_needs"
    grid = {"n": [1, 2, 3]}

    def data_names(self, cell):
        return ["alice"] if cell["n"] >= 2 else []

    def model_source(self, cell):
        from harness.models import text

        return text.model_source("bert-base-uncased", True) if cell["n"] == 3 else None

    def run(self, cell, ctx):
        CALLS.append(cell["n"])
        return [{"v": cell["n"] * 2}]


@pytest.fixture(autouse=True)
def _registered():
    """Registered for this module's tests only (not at import: other modules parametrize over the registry)."""
    experiment(_NeedsThings)
    yield
    catalog.unregister("_preflight_needs")


@pytest.fixture
def nothing(monkeypatch, tmp_path):
    """No mirror, empty NLTK path / datasets / hub caches, every download off."""
    for v in ("ATTNLIP_DATA", "HF_HUB_CACHE", "ATTNLIP_CIFAR10"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf" / "datasets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("ATTNLIP_OFFLINE", "1")
    import nltk

    monkeypatch.setattr(nltk.data, "path", [str(tmp_path / "nltk")])  # no system-wide NLTK folder either
    substitutes.clear_cache()
    CALLS.clear()
    yield tmp_path
    substitutes.clear_cache()


def _cfg(tmp_path, **kw):
    return runner.RunConfig(results_dir=tmp_path / "res", progress=False, figures=False, **kw)


def test_plan_lists_every_missing_item_of_a_cell(nothing):
    tasks = runner.plan("_preflight_needs", _cfg(nothing), verify=False).tasks
    assert [[m["item"] for m in t.missing] for t in tasks] == \
        [[], ["dataset alice"], ["dataset alice", "model bert-base-uncased"]]
    fixes = [m["fix"] for m in tasks[2].missing]
    assert fixes == ["attnlip data fetch alice", "hf download bert-base-uncased"]
    assert tasks[1].data_source == "missing:alice" and tasks[2].model_source == "unavailable:hub:bert-base-uncased"


def test_cells_missing_items_are_skipped_and_the_rest_run(nothing):
    (r,) = runner.run(["_preflight_needs"], _cfg(nothing), echo=lambda *a: None)
    assert CALLS == [1]  # the cells missing something never start; the one that can run does
    assert (r.computed, r.missing_data, r.failed) == (1, 2, 0) and not r.ok
    summary = runner.missing_summary([r])
    assert summary.count("dataset 'alice' is not available") == 1  # one message per item, not per cell
    assert summary.count("pretrained weights for 'bert-base-uncased' are not available") == 1
    assert summary.count("fix: attnlip data fetch alice") == 1
    assert summary.count("fix: hf download bert-base-uncased") == 1
    assert "needed by 2 cell(s)" in summary and "needed by 1 cell(s)" in summary
    errors = runner.format_errors([r])  # the FAILED list names the cells and refers to the messages above
    assert "not available" not in errors and errors.count("see MISSING DATA") == 2
    assert "missing dataset alice, model bert-base-uncased" in errors


def test_cli_prints_each_missing_item_once_and_fails(nothing, capsys):
    rc = cli.main(["_preflight_needs", "--results-dir", str(nothing / "res"), "--no-figures", "--no-progress"],
                  out=lambda *a: None)
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err
    assert err.count("dataset 'alice' is not available") == 1, err
    assert err.count("pretrained weights for 'bert-base-uncased' are not available") == 1, err
    assert "MISSING DATA" in err and "FAILED" in err


def test_missing_data_a_cell_raises_is_grouped_with_its_fix():
    """A MissingData raised while running (no declaration, a download that failed) joins the same summary."""
    from harness.run.specs import CellStatus

    st = [CellStatus(experiment="e", key=str(i), label=f"n={i}", status="missing_data",
                     error="MissingData: folder absent", fix="attnlip data fetch x") for i in range(3)]
    r = runner.ExpResult("e", 3, missing_data=3, errors=st)
    s = runner.missing_summary([r])
    assert s.count("folder absent") == 1 and s.count("fix: attnlip data fetch x") == 1 and "needed by 3" in s


# every experiment whose cells read Alice (text rows), SST-2 (MiniLM study cells) or images without a corpus key
TEXT_ROWS = {"jasmin_attention_maps": "alice", "jasmin_jsm_rows": "alice", "jasmin_g1_ratio": "alice",
             "bound_leaderboard": "alice"}
STUDY = ("lofast_tightness", "lofast_tightness_regime", "lofast_input_norm")


@pytest.mark.parametrize("name", sorted(TEXT_ROWS))
def test_text_rows_declare_the_corpus_they_read(nothing, name):
    p = runner.plan(name, _cfg(nothing, scale="quick"), verify=False)
    text = [t for t in p.tasks if t.cell["model"] != "vit"]
    assert text and all(t.data_source == f"missing:{TEXT_ROWS[name]}" for t in text), name
    # the corpus, and for a random-init GPT-2 its tokenizer unless a hub cache holds it
    assert all([m["item"] for m in t.missing if m["item"] != "the GPT-2 tokenizer"] == [f"dataset {TEXT_ROWS[name]}"]
               for t in text), name
    vit = [t for t in p.tasks if t.cell["model"] == "vit"]
    assert vit and all(t.data_source and "alice" not in t.data_source for t in vit), name


def test_gpt2_text_rows_are_keyed_as_the_random_init_they_load(nothing, monkeypatch):
    """GPT-2's text rows load random init by design: their key says so even where pretrained GPT-2 is cached."""
    from harness.models import hub

    monkeypatch.setattr(hub, "cached_snapshot", lambda name, files=(): f"/hub/{name}/snapshots/0123456789abcdef")
    exp = catalog.get_experiment("bound_leaderboard")
    gpt2 = [c for c in exp.cells("full") if c["model"] == "gpt2"]
    assert gpt2 and {exp.model_source(c) for c in gpt2} == {"random-init:gpt2(seed=0)"}


@pytest.mark.parametrize("name", STUDY)
def test_minilm_study_cells_declare_sst2(nothing, name):
    exp = catalog.get_experiment(name)
    cells = [c for c in exp.cells("full") if c["source"] == "minilm"]
    assert cells and all(exp.data_names(c) == ["sst2"] for c in cells)
    assert all(exp.model_source(c).startswith(("package:", "random-init:")) for c in cells)
    vit = [c for c in exp.cells("full") if c["source"] == "vit"]
    assert vit and all(exp.data_names(c) == [c["dataset"]] and exp.model_source(c) is None for c in vit)


def test_the_corpus_source_is_in_the_key(nothing, monkeypatch):
    """The text rows' key follows where Alice comes from (a mirror, NLTK's path, missing)."""
    cfg = _cfg(nothing, scale="test")
    before = {t.label: t.key for t in runner.plan("jasmin_attention_maps", cfg, verify=False).tasks}
    root = nothing / "nltk" / "corpora" / "gutenberg"
    root.mkdir(parents=True)
    (root / "carroll-alice.txt").write_text("Alice was beginning to get very tired.\n\nOf sitting by her sister.\n")
    after = runner.plan("jasmin_attention_maps", cfg, verify=False).tasks
    text = [t for t in after if t.cell["model"] != "vit"]
    assert text and all(t.data_source == "nltk:gutenberg" and not t.missing for t in text)
    assert all(before[t.label] != t.key for t in text)
    assert all(before[t.label] == t.key for t in after if t.cell["model"] == "vit")




def test_dry_run_names_each_missing_item_once(nothing):
    lines: list = []
    cli.cmd_dry_run(["_preflight_needs"], _cfg(nothing), out=lines.append)
    skips = [line for line in lines if line.startswith("would skip: ")]
    assert len(skips) == 2, lines  # alice (2 cells) and the BERT-base weights (1 cell), each once
    alice = next(line for line in skips if "alice" in line)
    assert "-- 2 cell(s)" in alice and alice.endswith("get it with: attnlip data fetch alice")
    assert any(line.endswith("get it with: hf download bert-base-uncased") and "-- 1 cell(s)" in line
               for line in skips)
    assert CALLS == []  # planning computes nothing


class _NeedsTokenizer(Experiment):
    """A random-init GPT-2: no weights to fetch, but the real GPT-2 tokenizer."""

    name = "_preflight_tokenizer"
    grid = {"model": ["tiny-gpt2"], "n": [1, 2]}

    def run(self, cell, ctx):
        CALLS.append(cell["n"])
        return [{"v": 1}]


def test_a_random_init_gpt2_without_its_tokenizer_is_named_before_running(nothing, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(nothing / "hf" / "hub"))  # as a fresh process reads HF_HOME
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    experiment(_NeedsTokenizer)
    try:
        lines: list = []
        cli.cmd_dry_run(["_preflight_needs", "_preflight_tokenizer"], _cfg(nothing), out=lines.append)
        tok = [line for line in lines if line.startswith("would skip: the GPT-2 tokenizer")]
        assert len(tok) == 1 and "-- 2 cell(s)" in tok[0], lines
        assert tok[0].endswith("get it with: attnlip data fetch gpt2_tokenizer"), tok[0]  # as every dataset
        assert lines[-1].startswith("4 cell(s) cannot run here: missing dataset alice, model bert-base-uncased, "
                                    "the GPT-2 tokenizer")  # alice 2 cells, BERT 1 of them, tokenizer 2
        assert lines[-1].endswith("`attnlip data fetch --for _preflight_needs,_preflight_tokenizer`")
        snap = nothing / "hf" / "hub" / "models--openai-community--gpt2" / "snapshots" / "abc"
        snap.mkdir(parents=True)
        (snap / "tokenizer.json").write_text("{}")  # fetched: the cells can run
        tasks = runner.plan("_preflight_tokenizer", _cfg(nothing), verify=False).tasks
        assert [t.missing for t in tasks] == [[], []]
    finally:
        catalog.unregister("_preflight_tokenizer")
