"""Every experiment names the papers' data and models: CIFAR-10 for the JaSMin ViTs (Fashion-MNIST where it cannot be
had, with the same cells the committed results hold), pretrained BERT-base / GPT-2 for the Castin experiments
(random init of the same architecture otherwise), the papers' sizes at --scale paper; and with nothing available a
run names each missing item with the command that gets it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.jasmin import common
from harness import catalog
from harness import run as runner
from harness.store.codehash import experiment_code
from tests.test_paper_scale import _fake_cifar10

REPO = Path(__file__).resolve().parent.parent
# every experiment that trains or loads the JaSMin ViT (one cached model per sweep entry, shared between them)
JASMIN_VIT = ("jasmin_sweep", "jasmin_heatmaps", "jasmin_jacobian_norm", "jasmin_overhead", "jasmin_attention_maps",
              "jasmin_g1_ratio", "jasmin_jsm_rows", "bound_leaderboard")
CASTIN = ("castin_gamma", "castin_sqrt_n_block", "castin_sqrt_n_adversarial")
BUDGET = {"full": common.VIT_FULL, "quick": common.VIT_QUICK}


def _vit_cells(name, scale, results):
    p = runner.plan(name, runner.RunConfig(scale=scale, results_dir=results), verify=False)
    return [t for t in p.tasks if t.cell.get("model", "vit") == "vit"]


@pytest.mark.parametrize("scale", ["full", "quick"])
def test_jasmin_vits_fall_back_to_the_committed_fashion_mnist_cells(offline, scale):
    want = {k: v[0] for k, v in BUDGET[scale].items()}
    for name in JASMIN_VIT:
        exp = catalog.get_experiment(name)
        declared = [c for c in exp.cells(scale) if c.get("model", "vit") == "vit"]
        assert declared and {(c["dataset"], c["patch"]) for c in declared} == {("cifar10", 8)}, name
        tasks = _vit_cells(name, scale, offline / "r")
        assert len(tasks) == len(declared), name
        for t in tasks:  # the Fashion-MNIST budget, value for value: the keys of the committed results
            assert {k: t.cell[k] for k in common.VIT_KEYS if k in t.cell} == want, name
            assert t.used == "fashion_mnist (substitute for cifar10)"


def test_jasmin_vits_use_cifar10_together_where_it_resolves(offline, monkeypatch):
    monkeypatch.setenv("ATTNLIP_DATA", str(_fake_cifar10(offline / "mirror")))
    for name in JASMIN_VIT:
        tasks = _vit_cells(name, "quick", offline / "r")
        assert {(t.cell["dataset"], t.cell["patch"]) for t in tasks} == {("cifar10", 8)}, name
        assert {t.data_source for t in tasks} == {"mirror:cifar10"} and {t.used for t in tasks} == {"cifar10 (paper)"}
    # the models the experiments share are the same artifacts: one ViT budget among all of them
    budgets = {tuple(t.cell.get(k) for k in common.VIT_KEYS) for n in JASMIN_VIT for t in _vit_cells(n, "quick", offline)}
    assert len(budgets) == 1


def test_test_scale_needs_no_substitute(offline):
    for name in JASMIN_VIT + CASTIN + ("lofast_text",):
        p = runner.plan(name, runner.RunConfig(scale="test", results_dir=offline / "r"), verify=False)
        assert not p.substituted and {t.used for t in p.tasks} == {None}, name


def test_castin_cells_keep_the_model_name_and_record_random_init(offline):
    for name in CASTIN:
        exp = catalog.get_experiment(name)
        p = runner.plan(name, runner.RunConfig(results_dir=offline / "r"), verify=False)
        assert [t.cell for t in p.tasks] == exp.cells("full"), name  # substitution leaves the cells as declared
        paper_models = [t for t in p.tasks if t.cell["model"] in ("bert-base-uncased", "gpt2")]
        assert paper_models and all(t.model_source.startswith("random-init:") for t in paper_models), name
        assert {t.used for t in paper_models} <= {f"random-init {m} (substitute for {m})"
                                                  for m in ("bert-base-uncased", "gpt2")}, name
        paper = exp.cells("paper")
        assert {c["model"] for c in paper if c["pretrained"] is True} == \
            ({"bert-base-uncased", "gpt2"} if name == "castin_sqrt_n_adversarial" else {"bert-base-uncased"}), name


def test_paper_sizes_of_the_remaining_experiments():
    text = catalog.get_experiment("lofast_text").cells("paper")
    assert len({(c["layers"], c["heads"], c["vo_norm"]) for c in text}) == 12  # layers x heads x norms, as the paper
    assert {(c["dataset"], c["train_size"], c["points"]) for c in text} == {("sst2", 67349, 872)}
    vit_paper = ("jasmin_heatmaps", "jasmin_jacobian_norm", "jasmin_overhead", "jasmin_attention_maps",
                 "bound_leaderboard")
    for name in vit_paper:  # the CIFAR-100 ViT-B models jasmin_sweep fine-tunes at --scale paper (Figs. 4-6)
        vit = [c for c in catalog.get_experiment(name).cells("paper") if c.get("model", "vit") == "vit"]
        assert vit and {(c["dataset"], c["patch"], c["vit_d"], c["vit_depth"], c["vit_init"]) for c in vit} == \
            {("cifar100", 4, 768, 12, "google/vit-base-patch16-224")}, name
    assert all(catalog.get_experiment(n).paper_cost for n in vit_paper + CASTIN + ("lofast_text",))

def test_declarations_are_not_compute_code():
    """The modules holding the papers' grids and substitutes are read by declarations only: editing them never
    invalidates a computed cell."""
    for name in catalog.list_experiments():
        files = {f.name for f in experiment_code(catalog.get_experiment(name))["files"]}
        assert not files & {"jasmin/grids.py", "castin/paper.py", "lofast/grids.py"}, name


def _run_with_nothing(tmp_path, *args):
    """run_all.py at test scale with no mirror, empty NLTK / datasets / hub caches and every download off."""
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNLIP_DATA", "HF_HOME", "HF_HUB_CACHE", "NLTK_DATA")}
    env.update(HOME=str(tmp_path / "home"), NLTK_DATA=str(tmp_path / "nltk"), HF_HOME=str(tmp_path / "hf"),
               HF_DATASETS_CACHE=str(tmp_path / "hf" / "datasets"), HF_HUB_OFFLINE="1", ATTNLIP_OFFLINE="1",
               OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "run_all.py", *args, "--scale", "test", "--no-progress", "--results-dir",
                        str(tmp_path / "res")], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout + r.stderr


@pytest.mark.parametrize("args, item, fix", [
    (["jasmin_attention_maps"], "dataset 'alice' is not available", "attnlip data fetch alice"),
    (["castin_gamma", "--set", "model=bert-base-uncased", "--set", "pretrained=true"],
     "pretrained weights for 'bert-base-uncased' are not available", "hf download bert-base-uncased"),
])
def test_nothing_available_names_the_missing_item_and_its_fix(tmp_path, args, item, fix):
    rc, out = _run_with_nothing(tmp_path, *args)
    assert rc != 0 and "Traceback" not in out, out[-3000:]
    assert item in out and f"`{fix}`" in out
    assert out.count(item) == 1, out  # the message once (MISSING DATA); FAILED names the cell and refers to it
    assert out.count(f"fix: {fix}") == 1  # one fix line per missing item


def test_a_cell_missing_two_items_names_both_once(tmp_path):
    rc, out = _run_with_nothing(tmp_path, "castin_gamma", "--set", "model=bert-base-uncased", "--set",
                                "pretrained=true", "--set", "corpus=alice")
    assert rc != 0 and "Traceback" not in out, out[-3000:]
    for item, fix in (("dataset 'alice' is not available", "attnlip data fetch alice"),
                      ("pretrained weights for 'bert-base-uncased' are not available", "hf download bert-base-uncased")):
        assert out.count(item) == 1 and out.count(f"fix: {fix}") == 1, out
