"""The data layer's sources without network: NLTK data folders, the `datasets` offline cache (built here in its
real layout), downloads through recording fakes, the mirror's precedence, and the one error when nothing has it."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from harness.data import hub, paths, resolve, sources, text
from harness.data.images import load_images
from harness.errors import DataNotFound

ALICE = "Alice was beginning to get very tired.\n\nDown the rabbit hole   she went.\n\n\nThe End.\n"
SHA = "0123456789abcdef" * 2 + "01234567"


@pytest.fixture
def env(monkeypatch, tmp_path):
    """No mirror, empty NLTK and `datasets` caches in tmp_path, downloads off, Debian's Fashion-MNIST absent."""
    import nltk

    for k in ("ATTNLIP_DATA", "ATTNLIP_FASHION_MNIST", "ATTNLIP_CIFAR10", "ATTNLIP_CIFAR100"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("ATTNLIP_OFFLINE", "1")
    monkeypatch.setenv("NLTK_DATA", str(tmp_path / "nltk"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf"))
    monkeypatch.setattr(nltk.data, "path", [])  # no ~/nltk_data or /usr/share/nltk_data of this machine
    monkeypatch.setattr(paths, "LOCAL_FASHION_MNIST", tmp_path / "no-deb")
    monkeypatch.setattr(paths, "DEFAULT_FASHION_MNIST", tmp_path / "no-deb")
    (tmp_path / "nltk").mkdir()
    return tmp_path


def online(monkeypatch):
    for k in ("ATTNLIP_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(k, raising=False)


def build_hub_cache(name: str, splits: dict, features=None, sha: str = SHA):
    """A prepared `datasets` cache entry for the table's hub dataset `name`, as load_dataset leaves it:
    <cache>/<namespace>___<name>/<config>/0.0.0/<revision>/ with dataset_info.json and <name>-<split>.arrow."""
    import datasets
    from datasets.packaged_modules.parquet.parquet import Parquet

    h = sources.get(name).hub
    cache = hub.cache_dir()
    build = cache.parent / "build"
    files = {}
    for split, cols in splits.items():
        files[split] = str(build / f"{split}.parquet")
        datasets.Dataset.from_dict(cols, features=features).to_parquet(files[split])
    b = Parquet(dataset_name=hub._short_name(h), config_name="default", hash=sha, cache_dir=str(build / "c"),
                data_files=files)
    b.download_and_prepare()
    ns, short = h.repo.split("/")
    dst = cache / f"{ns}___{hub._short_name(h)}" / (h.config or "default") / "0.0.0" / sha
    shutil.copytree(b.cache_dir, dst)
    return dst


# ---- NLTK ------------------------------------------------------------------------------------------------------
def test_alice_from_nltk_data(env):
    f = env / "nltk" / "corpora" / "gutenberg" / "carroll-alice.txt"
    f.parent.mkdir(parents=True)
    f.write_text(ALICE, encoding="latin1")
    assert text.load_corpus("alice") == ["Alice was beginning to get very tired.", "Down the rabbit hole she went.",
                                         "The End."]
    assert resolve.source("alice") == text.data_source("alice") == "nltk:gutenberg"
    assert resolve.locate("alice").path == env / "nltk"


def test_alice_download_when_online(env, monkeypatch):
    import nltk

    calls = []

    def fake_download(pkg, download_dir=None, quiet=False, **kw):
        calls.append((pkg, download_dir))
        f = env / "nltk" / "corpora" / "gutenberg" / "carroll-alice.txt"
        f.parent.mkdir(parents=True)
        f.write_text(ALICE, encoding="latin1")
        return True

    monkeypatch.setattr(nltk, "download", fake_download)
    assert resolve.locate("alice").kind == "missing" and calls == []  # offline: nothing tried
    online(monkeypatch)
    assert resolve.locate("alice").kind == "download"
    assert text.load_corpus("alice")[-1] == "The End."
    assert calls == [("gutenberg", str(env / "nltk"))]
    assert resolve.locate("alice").kind == "nltk"


def test_failed_download_is_one_clear_error(env, monkeypatch):
    import nltk

    online(monkeypatch)
    monkeypatch.setattr(nltk, "download", lambda *a, **k: False)
    with pytest.raises(DataNotFound, match=r"nltk.download\('brown'\).*attnlip data fetch brown.*brown.zip"):
        text.load_corpus("brown")


# ---- the `datasets` cache ----------------------------------------------------------------------------------------
SST2 = {"train": {"idx": [0, 1, 2], "sentence": ["a fine film ", "dull , dull ", "moving "], "label": [1, 0, 1]},
        "validation": {"idx": [0, 1], "sentence": ["great ", "bad "], "label": [1, 0]}}


def test_sst2_from_datasets_cache(env):
    import datasets

    where = build_hub_cache("sst2", SST2)
    assert resolve.locate("sst2") == resolve.Resolved("hf", where, f"hf:stanfordnlp/sst2@{SHA[:12]}")
    assert text.load_corpus("sst2") == ["a fine film", "dull , dull", "moving"]
    assert text.load_labeled("sst2", "dev") == (["great", "bad"], [1, 0])  # the hub's validation split
    # the same folder is what `datasets` itself reads offline
    ds = datasets.load_dataset("stanfordnlp/sst2", split="validation", cache_dir=str(hub.cache_dir()))
    assert ds["sentence"] == SST2["validation"]["sentence"]


def test_ag_news_from_datasets_cache(env):
    build_hub_cache("ag_news", {"test": {"text": ["Fears for pension  Unions say", "Race is On \\ second"],
                                         "label": [2, 3]}})
    assert text.load_labeled("ag_news") == (["Fears for pension Unions say", "Race is On \\ second"], [2, 3])
    assert text.data_source("ag_news") == f"hf:fancyzhx/ag_news@{SHA[:12]}"


def test_hub_download_when_online(env, monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(repo, config=None, cache_dir=None, **kw):
        calls.append((repo, config, cache_dir))
        build_hub_cache("ag_news", {"test": {"text": ["t d"], "label": [0]}})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    with pytest.raises(DataNotFound, match="ATTNLIP_OFFLINE"):
        text.load_corpus("ag_news")
    assert calls == []
    online(monkeypatch)
    assert resolve.source("ag_news") == "hf:fancyzhx/ag_news"  # to download: no revision yet
    assert text.load_labeled("ag_news") == (["t d"], [0])
    assert calls == [("fancyzhx/ag_news", None, str(env / "hf"))]
    assert resolve.source("ag_news") == f"hf:fancyzhx/ag_news@{SHA[:12]}"


@pytest.mark.parametrize("name,shape", [("svhn", (3, 32, 32)), ("fashion_mnist", (1, 28, 28))])
def test_images_from_datasets_cache(env, name, shape):
    import datasets
    from PIL import Image

    rng = np.random.RandomState(0)
    arrs = [rng.randint(0, 256, (shape[1], shape[2], shape[0]), dtype=np.uint8).squeeze(-1 if shape[0] == 1 else None)
            for _ in range(2)]
    feats = datasets.Features({"image": datasets.Image(), "label": datasets.Value("int64")})
    build_hub_cache(name, {"test": {"image": [Image.fromarray(a) for a in arrs], "label": [7, 1]}}, features=feats)
    X, y, info = load_images(name, split="test")
    assert X.shape == (2,) + shape and y.tolist() == [7, 1] and info["source"].startswith("hf:")
    first = arrs[0] if shape[0] == 1 else arrs[0].transpose(2, 0, 1)
    assert np.allclose(X[0].numpy().reshape(first.shape), first / 255.0)


# ---- mirror and errors -------------------------------------------------------------------------------------------
def test_mirror_wins(env, monkeypatch):
    build_hub_cache("sst2", SST2)
    m = env / "mirror"
    (m / "sst2").mkdir(parents=True)
    (m / "sst2" / "train.tsv").write_text("label\tsentence\n1\tmirror text \n", encoding="utf-8")
    (m / "sst2" / "dev.tsv").write_text("label\tcontent\n0\tmirror dev\n", encoding="utf-8")
    monkeypatch.setenv("ATTNLIP_DATA", str(m))
    assert resolve.source("sst2") == "mirror:sst2"
    assert text.load_labeled("sst2") == (["mirror text"], [1])
    assert text.load_labeled("sst2", "dev") == (["mirror dev"], [0])
    assert resolve.source("ag_news") == "missing:ag_news"  # a mirror without it is skipped, not an error


@pytest.mark.parametrize("name", ["alice", "sst2", "ag_news", "svhn", "fashion_mnist", "cifar100"])
def test_nothing_available_offline(env, name):
    d = sources.get(name)
    assert resolve.source(name) == f"missing:{name}"
    with pytest.raises(DataNotFound) as e:
        if name in ("svhn", "fashion_mnist", "cifar100"):
            load_images(name, split="test")
        else:
            text.load_corpus(name)
    msg = str(e.value)
    assert f"attnlip data fetch {name}" in msg and e.value.fix == f"attnlip data fetch {name}"
    assert all(f in msg for f in d.mirror) and "ATTNLIP_OFFLINE" in msg
    assert (f"set {d.env} to a folder" in msg) == bool(d.env)  # fashion_mnist, cifar100: their own variable
    assert msg.count("is not available") == 1


def test_mirror_setting_errors(env, monkeypatch):
    with pytest.raises(DataNotFound, match="ATTNLIP_DATA is unset.*attnlip data fetch"):
        paths.data_root()
    monkeypatch.setenv("ATTNLIP_DATA", str(env / "absent"))
    with pytest.raises(DataNotFound, match="is not a folder"):
        resolve.locate("sst2")
    assert resolve.source("sst2") == "missing:sst2"
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        resolve.locate("nope")


# ---- the command and the cell key --------------------------------------------------------------------------------
def test_data_command(env, monkeypatch, capsys):
    from harness import entry

    assert entry.main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert "missing:sst2" in out and "hf:stanfordnlp/sst2" in out and "sst2/dev.tsv" in out
    assert entry.main(["data", "fetch", "sst2", "alice"]) == 1  # offline: says what is missing and why
    err = capsys.readouterr().err
    assert "could not get 2 of 2" in err and "sst2: hub download off (ATTNLIP_OFFLINE=1)" in err
    assert entry.main(["data", "fetch", "mnist"]) == 2 and "unknown dataset(s) mnist" in capsys.readouterr().err
    build_hub_cache("sst2", SST2)
    assert entry.main(["data", "fetch", "sst2"]) == 0
    assert f"sst2 (hf:stanfordnlp/sst2@{SHA[:12]})" in capsys.readouterr().out


def test_default_fetch_downloads_what_the_default_run_reads(env, monkeypatch):
    import datasets
    import nltk

    from harness.data import cli

    online(monkeypatch)
    got = []
    monkeypatch.setattr(nltk, "download", lambda pkg, **k: got.append(pkg) or False)
    monkeypatch.setattr(datasets, "load_dataset", lambda repo, config=None, **k: got.append(repo))
    assert cli.cmd_fetch([]) == 1  # the fakes fetch nothing, so everything stays missing
    assert got == ["gutenberg", "stanfordnlp/sst2", "fancyzhx/ag_news", "zalando-datasets/fashion_mnist"]
    assert sources.DEFAULT == ("alice", "sst2", "ag_news", "fashion_mnist")


def test_data_source_reaches_the_cell_key(env):
    from types import SimpleNamespace

    from harness.catalog import Experiment
    from harness.run.plan import data_source
    from harness.store.keys import cell_key

    build_hub_cache("sst2", SST2)
    exp = Experiment()  # the default data_names: the cell's "corpus" and "dataset"
    assert data_source(exp, {"dataset": "sst2", "n": 4}) == f"hf:stanfordnlp/sst2@{SHA[:12]}"
    assert data_source(exp, {"corpus": "synthetic"}) is None and data_source(exp, {"n": 4}) is None
    assert data_source(SimpleNamespace(data_names=lambda c: ["sst2", "alice"]), {}) == \
        f"hf:stanfordnlp/sst2@{SHA[:12]}+missing:alice"
    args = ("e", {"n": 1}, 0, "float64", "cpu", "code")
    k0, k1 = cell_key(*args, versions={}), cell_key(*args, versions={}, data_source="mirror:sst2")
    assert k0 != k1 != cell_key(*args, versions={}, data_source="hf:stanfordnlp/sst2@abc")
    assert k0 == cell_key(*args, versions={}, data_source=None)  # cells without data keep their keys


def test_missing_error_says_before_loading_whether_require_would_fail(env, monkeypatch):
    err = resolve.missing_error("alice")  # nothing local, downloads off: the error require raises, with its fix
    assert isinstance(err, DataNotFound) and err.fix == "attnlip data fetch alice" and "ATTNLIP_OFFLINE" in str(err)
    with pytest.raises(DataNotFound) as raised:
        resolve.require("alice")
    assert str(raised.value) == str(err)
    online(monkeypatch)
    assert resolve.missing_error("alice") is None  # a download may still get it: the loader tries
    monkeypatch.setenv("ATTNLIP_OFFLINE", "1")
    (env / "nltk" / "corpora" / "gutenberg").mkdir(parents=True)
    (env / "nltk" / "corpora" / "gutenberg" / "carroll-alice.txt").write_text(ALICE)
    assert resolve.missing_error("alice") is None
    monkeypatch.setenv("ATTNLIP_DATA", str(env / "not-a-folder"))
    assert "not a folder" in str(resolve.missing_error("alice"))  # a broken mirror setting: its own message


# ---- fetch here, run there ---------------------------------------------------------------------------------------
def test_fetch_for_an_experiment_then_run_offline_elsewhere(env, monkeypatch, capsys):
    """`attnlip data fetch --for EXP --to DIR` on a node with network (faked: NLTK and the hub write their usual
    files), then a fresh process with only the printed variables and no network finds every item there."""
    import os
    import subprocess
    import sys

    import huggingface_hub
    import nltk

    from harness import catalog
    from harness.data import cli
    from harness.models import hub as models_hub
    from harness.run import fetch

    @catalog.experiment
    class _FetchProbe(catalog.Experiment):
        name = "_fetch_probe"
        grid = {"model": ["tiny-gpt2"], "corpus": ["alice"]}

        def run(self, cell, ctx):
            return []

    def fake_nltk(pkg, download_dir=None, **k):
        f = Path(download_dir) / "corpora" / "gutenberg" / "carroll-alice.txt"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(ALICE, encoding="latin1")
        return True

    def fake_snapshot(repo, allow_patterns=(), revision=None, cache_dir=None, **k):
        top = Path(cache_dir) / ("models--" + repo.replace("/", "--"))
        snap = top / "snapshots" / revision
        snap.mkdir(parents=True)
        for f in allow_patterns:
            (snap / f).write_text("{}")
        (top / "refs").mkdir()
        (top / "refs" / "main").write_text(revision)
        return str(snap)

    online(monkeypatch)
    monkeypatch.setattr(nltk, "download", fake_nltk)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    monkeypatch.setattr(models_hub, "remote", lambda name: models_hub.Remote(
        name, SHA, ("config.json", "vocab.json", "merges.txt", "tokenizer.json", "model.safetensors"), ""))
    monkeypatch.setenv("HF_HOME", str(env / "home-hf"))  # what --to replaces
    try:
        assert fetch.needs(["_fetch_probe"], ["quick"]) == (["alice"], {"openai-community/gpt2": "tokenizer"})
        dest = env / "carry"
        assert cli.main(["fetch", "--for", "_fetch_probe", "--to", str(dest)]) == 2  # needs the experiments
        assert "run it as `attnlip data fetch`" in capsys.readouterr().err
        assert cli.main(["fetch", "--for", "_fetch_probe", "--to", str(dest)], planner=fetch) == 0
        out = capsys.readouterr().out
        assert "all 2 item(s) available" in out and f"export HF_HOME={dest / 'huggingface'}" in out
        snap = dest / "huggingface" / "hub" / "models--openai-community--gpt2" / "snapshots" / SHA
        assert sorted(p.name for p in snap.iterdir()) == ["config.json", "merges.txt", "tokenizer.json", "vocab.json"]
        export = out.split("before running: export ")[1].split()
        node = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "NLTK", "ATTNLIP"))}
        node.update(dict(kv.split("=", 1) for kv in export), HF_HUB_OFFLINE="1")
        probe = ("from harness.data import resolve; from harness.models import hub; "
                 "print(resolve.locate('alice').path); print(hub.cached_snapshot('openai-community/gpt2', "
                 "hub.TOKENIZER_FILES))")
        got = subprocess.run([sys.executable, "-c", probe], env=node, capture_output=True, text=True, check=True)
        assert got.stdout.split() == [str(dest / "nltk_data"), str(snap)], got.stderr
        with pytest.raises(ValueError, match="no experiment matches"):
            fetch.needs(["no_such_exp*"], ["quick"])
    finally:
        catalog.unregister("_fetch_probe")


def test_inventory_says_present_download_missing_and_stand_ins(env, monkeypatch, capsys, tmp_path):
    """`attnlip data list` and `run_all.py --list` name every dataset, model and tokenizer the cells read: present
    (where), will download, or missing, a declared stand-in with it, and the fetch command for what is missing."""
    from huggingface_hub import constants

    from harness import cli as run_cli, catalog
    from harness.data import cli
    from harness.models import hub as models_hub
    from harness.run import fetch

    @catalog.experiment
    class _InventoryProbe(catalog.Experiment):
        name = "_inventory_probe"
        grid = {"model": ["tiny-gpt2"], "corpus": ["alice"], "dataset": ["cifar10"]}
        substitutes = (catalog.Substitute("dataset", "cifar10", "fashion_mnist", label="CIFAR-10",
                                           use_label="Fashion-MNIST"),)

        def run(self, cell, ctx):
            return []

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(models_hub, "offline", lambda: True)
    try:
        state = {n: (s, why) for _, n, s, why in fetch.inventory(["_inventory_probe"], ["quick"])}
        assert {n: s for n, (s, _) in state.items()} == {
            "alice": "missing", "cifar10": "missing", "fashion_mnist": "missing", "openai-community/gpt2": "missing"}
        assert state["cifar10"][1].endswith("runs with the stand-in: Fashion-MNIST")
        last = fetch.inventory_lines(["_inventory_probe"], ["quick"])[-1]
        assert "cells reading alice, fashion_mnist, openai-community/gpt2 cannot run; stand-ins replace cifar10" in last
        assert "`attnlip data fetch --for _inventory_probe`" in last

        online(monkeypatch)  # downloads on: what is not here will download on first use
        monkeypatch.setattr(models_hub, "offline", lambda: False)
        state = {n: s for _, n, s, _ in fetch.inventory(["_inventory_probe"], ["quick"])}
        assert state["alice"] == state["openai-community/gpt2"] == "will download"

        alice = env / "nltk" / "corpora" / "gutenberg" / "carroll-alice.txt"  # now present: each says where
        alice.parent.mkdir(parents=True)
        alice.write_text(ALICE, encoding="latin1")
        snap = tmp_path / "hub" / "models--openai-community--gpt2" / "snapshots" / SHA
        snap.mkdir(parents=True)
        (snap / "tokenizer.json").write_text("{}")
        state = {n: (s, why) for _, n, s, why in fetch.inventory(["_inventory_probe"], ["quick"])}
        assert state["alice"] == ("present", f"nltk:gutenberg ({env / 'nltk'})")
        assert state["openai-community/gpt2"] == ("present", str(snap))

        assert cli.main(["list"], planner=fetch) == 0
        out = capsys.readouterr().out
        assert "what the experiments read" in out
        assert f"alice              present        nltk:gutenberg ({env / 'nltk'})" in out
        lines = []
        assert run_cli.main(["_inventory_probe", "--list", "--quick", "--results-dir", str(tmp_path / "r")],
                            out=lines.append) == 0
        i = lines.index("\ndatasets, models and tokenizers these experiments read (quick scale):")
        assert [l.split()[1] for l in lines[i + 1:i + 5]] == ["alice", "cifar10", "fashion_mnist",
                                                              "openai-community/gpt2"]
    finally:
        catalog.unregister("_inventory_probe")
