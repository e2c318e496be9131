"""The papers' settings: the `paper` scale (dry-run plans with an estimate, refusal where undeclared) and the
declared substitutes (the paper's data where it resolves, the stand-in otherwise, recorded and printed once)."""
from __future__ import annotations

import pickle
import re

import numpy as np
import pandas as pd
import pytest

from harness import cli, catalog
from harness import run as runner
from harness.catalog import Substitute
from harness.run import substitutes
from experiments.jasmin import common
from tests._harness_fakes import registered_fakes



def paper_exps() -> set:
    """The experiments that declare the paper scale, read from the catalog (a new experiment's own `paper`)."""
    return {n for n in catalog.list_experiments() if catalog.get_experiment(n).paper}


def _fake_cifar10(root, n=48):
    """The mirror layout of CIFAR-10 (cifar-10-batches-py/, python pickle batches of plain data and arrays)."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.RandomState(0)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"data": rng.randint(0, 256, size=(n, 3 * 32 * 32)).astype(np.uint8),
                 b"labels": list(rng.randint(0, 10, size=n))}
        (d / name).write_bytes(pickle.dumps(batch))
    return root


def test_dry_run_plans_the_paper_scale_with_an_estimate(offline, capsys):
    assert cli.main(["--dry-run", "--scale", "paper", "--results-dir", str(offline / "res")]) == 0
    out = capsys.readouterr().out
    heads = {line.split(" (paper)")[0] for line in out.splitlines() if " (paper): " in line}
    assert heads == paper_exps()  # with no names: exactly the experiments that declare the paper scale
    assert "expected at paper scale" in out
    # the paper scale never substitutes: the missing items are named with how to get them
    assert re.search(r"CIFAR-10 unreachable \(offline: [A-Z_]+=1\): [a-z0-9_, ]*jasmin_sweep, "
                     r"[a-z0-9_, ]*lofast_certified, [a-z0-9_, ]*lofast_tightness_regime need it", out)
    assert "hf download bert-base-uncased" in out
    # JaSMin's ViT-B: fine-tuned from the ImageNet checkpoint on CIFAR-100 (and CIFAR-10 for Tables 2 / 4)
    assert "hf download google/vit-base-patch16-224" in out and "attnlip data fetch cifar100" in out


def test_paper_grids_are_the_papers_sizes():
    cert = catalog.get_experiment("lofast_certified").cells("paper")
    assert {(c["dataset"], c["train_size"], c["points"]) for c in cert} == {("cifar10", 50000, 10000),
                                                                           ("svhn", 73257, 26032)}
    assert {c["patch"] for c in cert if c["dataset"] == "cifar10"} == {4, 8, 16}
    castin = catalog.get_experiment("castin_sqrt_n").cells("paper")
    assert {c["model"] for c in castin} == {"bert-base-uncased", "gpt2"}
    assert {c["corpus"] for c in castin} == {"alice", "ag_news"} and all(len(c["n"]) == 50 for c in castin)
    for name in ("lofast_ablation", "lofast_input_norm", "lofast_tightness", "lofast_tightness_regime"):
        cells = catalog.get_experiment(name).cells("paper")  # the paper's CIFAR-10 ViT, trained on all of it
        assert {(c["dataset"], c["train_size"], c.get("source", "vit")) for c in cells} == {("cifar10", 50000, "vit")}
    for name in ("jasmin_g1_ratio", "jasmin_jsm_rows"):
        cells = catalog.get_experiment(name).cells("paper")
        assert {(c["model"], c["dataset"], c["vit_d"], len(c["layers"])) for c in cells} == {("vit", "cifar100", 768, 12)}
    for name in ("jasmin_jacobian_norm", "jasmin_heatmaps", "bound_leaderboard"):  # Figs. 4-6: CIFAR-100 alone
        assert {c["dataset"] for c in catalog.get_experiment(name).cells("paper") if "vit_d" in c} == {"cifar100"}
    magnitude = catalog.get_experiment("castin_magnitude").cells("paper")
    assert {(c["model"], c["pretrained"]) for c in magnitude} == {("gpt2", True)}
    sweep = catalog.get_experiment("jasmin_sweep").cells("paper")
    # Tables 1 / 3 (CIFAR-100) and 2 / 4 (CIFAR-10): ViT-B fine-tuned from the ImageNet checkpoint with the paper's SGD
    assert {(c["dataset"], c["patch"], c["vit_d"], c["vit_depth"]) for c in sweep} == {("cifar100", 4, 768, 12),
                                                                                       ("cifar10", 4, 768, 12)}
    assert {(c["vit_init"], c["optimizer"], c["batch"], c["weight_decay"]) for c in sweep} == \
        {("google/vit-base-patch16-224", "sgd", 512, 1e-4)}
    assert {common.vit_recipe(c)["epochs"] for c in sweep} == {40}  # 3,920 steps of 512 on 50,000 images


def test_every_experiment_declares_the_paper_scale():
    assert set(catalog.list_experiments()) == paper_exps()
    for name in ("castin_radius_edge", "jasmin_softmax", "mass_splitting"):  # no sizes stated: the full grid
        exp = catalog.get_experiment(name)
        assert exp.cells("paper") == exp.cells("full")


def test_an_experiment_without_paper_sizes_refuses_the_scale(fakes, capsys):
    assert catalog.get_experiment("_fake_squares").paper is None
    assert cli.main(["_fake_squares", "--scale", "paper", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "_fake_squares" in err and "declares no paper scale" in err and "Traceback" not in err


def test_substitute_chosen_offline_with_one_line(offline, capsys):
    assert cli.main(["lofast_certified", "lofast_ablation", "--dry-run", "--results-dir", str(offline / "r")]) == 0
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if "unreachable" in x]
    assert len(lines) == 1 and re.fullmatch(r"CIFAR-10 unreachable \(offline: [A-Z_]+=1\): using Fashion-MNIST "
                                            r"for lofast_certified, lofast_ablation", lines[0])
    p = runner.plan("lofast_certified", runner.RunConfig(results_dir=offline / "r"), verify=False)
    assert {t.cell["dataset"] for t in p.tasks} == {"fashion_mnist"}
    assert sorted(t.cell["patch"] for t in p.tasks) == [4, 7, 7, 7, 7, 7, 7, 14]  # the patch count kept
    assert {t.used for t in p.tasks} == {"fashion_mnist (substitute for cifar10)"}


def test_paper_data_chosen_when_it_resolves(offline, monkeypatch):
    monkeypatch.setenv("ATTNLIP_DATA", str(_fake_cifar10(offline / "mirror")))
    p = runner.plan("lofast_certified", runner.RunConfig(results_dir=offline / "r"), verify=False)
    assert {t.cell["dataset"] for t in p.tasks} == {"cifar10"} and not p.substituted
    assert sorted(t.cell["patch"] for t in p.tasks) == [4, 8, 8, 8, 8, 8, 8, 16]
    assert {t.data_source for t in p.tasks} == {"mirror:cifar10"} and {t.used for t in p.tasks} == {"cifar10 (paper)"}


def test_set_value_is_never_substituted(offline):
    cfg = runner.RunConfig(results_dir=offline / "r", overrides={"dataset": ["cifar10"]})
    p = runner.plan("lofast_certified", cfg, verify=False)
    assert {t.cell["dataset"] for t in p.tasks} == {"cifar10"} and {t.data_source for t in p.tasks} == \
        {"missing:cifar10"}


def test_lipvit_trains_on_cifar10_shaped_images(offline, monkeypatch):
    """The paper's data path at test size: a LipViT on 3x32x32 images (patch 8: 16 patches) trains and predicts."""
    import torch

    from harness.models import lofast_train

    monkeypatch.setenv("ATTNLIP_DATA", str(_fake_cifar10(offline / "mirror")))
    cfg = lofast_train.model_recipe("vit", layers=1, heads=2, vo_norm=0.5, seed=0, dataset="cifar10", train_size=32,
                                 test_size=16, epochs=1, lr=1e-2, patch=8)
    out = lofast_train.train(cfg)
    assert 0.0 <= out["info"]["test_acc"] <= 1.0 and out["info"]["steps"] >= 1
    model = lofast_train.build(cfg)
    model.load_state_dict(out["state_dict"])
    assert (model.channels, model.image_size) == (3, 32)
    assert model(torch.rand(2, 3, 32, 32)).shape == (2, 10)
    with pytest.raises(ValueError, match="expected images"):  # Fashion-MNIST-shaped input is refused
        model(torch.rand(2, 1, 28, 28))


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    yield from registered_fakes(tmp_path, monkeypatch, "fake_paper")


def test_table_column_and_readme_line(fakes, tmp_path, monkeypatch, capsys):
    """A substituted cell runs the substitute's value, with data_used in the table and the README."""
    exp = catalog.get_experiment("_fake_squares")
    monkeypatch.setattr(exp, "substitutes", (Substitute("mult", 2.0, 1.5, label="MULT-2", use_label="mult 1.5"),),
                        raising=False)
    monkeypatch.setattr(substitutes, "obtainable", lambda s: (False, "offline: test"))
    cfg = runner.RunConfig(scale="test", results_dir=tmp_path / "res", progress=False, figures=False)
    lines = []
    runner.run(["_fake_squares"], cfg, echo=lines.append)
    assert "MULT-2 unreachable (offline: test): using mult 1.5 for _fake_squares" in lines
    table = pd.read_csv(cfg.output_root / "_fake_squares" / "table.csv")
    used = dict(zip(table["mult"], table["data_used"]))
    assert used[1.5] == "1.5 (substitute for 2.0)" and pd.isna(used[1.0])
    assert set(table.loc[table["mult"] == 1.5, "value"]) == {1.5}  # the substitute's value ran
    assert "Data / model used: 1.5 (substitute for 2.0) (1 cell)" in (cfg.output_root / "README.md").read_text()
