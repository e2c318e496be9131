"""JaSMin's paper recipe: ViT-B fine-tuned from an ImageNet checkpoint on CIFAR-100 / CIFAR-10 (jasmin.common's
VIT_PAPER). At test size a tiny Hugging Face ViT saved in tmp stands for the checkpoint: the recipe builds our ViT
from it (q/k/v biases removed, as the paper), trains it with SGD, and the checkpoint names the cells' weights; the
paper-scale plan names the real checkpoint and CIFAR-100 with the commands that get them."""
from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from experiments.jasmin import common
from harness import cli
from harness.models import train
from harness.models import vit_import as VI
from tests.test_vit_import import save_hf


def _cell(folder, **over):
    cell = {k: v[0] for k, v in common.VIT_PAPER.items()}  # at the tiny checkpoint's size (tests.test_vit_import)
    return {**cell, **dict(vit_init=str(folder), patch=2, train_steps=2, batch=8, vit_d=32, vit_depth=2,
                            vit_heads=4), **over}


def test_the_recipe_starts_from_the_checkpoint_without_qkv_biases(tmp_path):
    save_hf(tmp_path, qkv_bias=True)
    recipe = common.vit_recipe(_cell(tmp_path))
    assert recipe["model"] == {"pretrained": str(tmp_path), "patch": 2, "qkv_bias": False, "d": 32, "depth": 2,
                               "heads": 4}
    assert (recipe["optimizer"], recipe["batch_size"], recipe["weight_decay"], recipe["lr"]) == ("sgd", 8, 1e-4, 0.01)
    c = train.full_recipe(recipe)
    model = train.build_model(c, (3, 8, 8), 7)
    blk = model.blocks[0].attn
    assert blk.bq is None and blk.bk is None and blk.bv is None and model.head.out_features == 7
    q = load_file(str(tmp_path / "model.safetensors"))["encoder.layer.0.attention.attention.query.weight"]
    assert torch.equal(blk.Wq.detach(), q.T.float())  # the checkpoint's weights, x -> x W
    assert model.n_tokens == 17  # 8x8 images in 2x2 patches + cls, positions interpolated from 4x4


def test_the_recipe_trains_with_sgd_and_keys_the_checkpoint(tmp_path):
    save_hf(tmp_path, qkv_bias=True)
    g = torch.Generator().manual_seed(0)
    data = ((torch.rand(16, 3, 8, 8, generator=g), torch.randint(0, 5, (16,), generator=g)),
            (torch.rand(8, 3, 8, 8, generator=g), torch.randint(0, 5, (8,), generator=g)))
    before = VI.vit_from_hf(str(tmp_path), image_size=8, patch=2, n_classes=5, qkv_bias=False)
    model = train.train_classifier(common.vit_recipe(_cell(tmp_path)), data=data)
    assert model.train_metrics["steps"] == 2 and torch.isfinite(torch.tensor(model.train_metrics["loss_last"]))
    assert model.train_recipe["model"]["pretrained"] == str(tmp_path)  # in the artifact key
    assert not torch.equal(model.blocks[0].attn.Wq, before.blocks[0].attn.Wq)  # SGD moved it
    assert common.model_source(_cell(tmp_path)).startswith(f"local:{tmp_path.resolve()}@")
    from harness.run import fetch  # a local checkpoint is nothing to download
    assert fetch._model_needs(common.model_source(_cell(tmp_path)), _cell(tmp_path)) == []
    assert fetch._model_needs(f"unavailable:hub:{common.VIT_B_IMAGENET}", {}) == [(common.VIT_B_IMAGENET, "weights")]
    assert common.model_source({k: v[0] for k, v in common.VIT_FULL.items()}) is None  # trained from scratch


def test_paper_plan_names_the_checkpoint_and_cifar100(offline, monkeypatch, capsys):
    monkeypatch.delenv("ATTNLIP_CIFAR100", raising=False)
    assert common.model_source(_cell(common.VIT_B_IMAGENET)) == f"unavailable:hub:{common.VIT_B_IMAGENET}"
    assert cli.main(["jasmin_sweep", "--dry-run", "--scale", "paper", "--results-dir", str(offline / "r")]) == 0
    out = capsys.readouterr().out
    assert f"hf download {common.VIT_B_IMAGENET}" in out and "attnlip data fetch cifar100" in out


def test_paper_scale_sweep_reports_each_dataset_against_its_table(tmp_path):
    """A paper-scale sweep table (both datasets, the fine-tuning recipe's columns): one summary section and one
    accuracy figure per dataset, each against its own table of the paper (3 for CIFAR-100, 4 for CIFAR-10)."""
    import pandas as pd

    from harness import catalog
    from harness.store.codehash import REPO_ROOT

    quick = pd.read_parquet(REPO_ROOT / "results" / "quick" / "jasmin_sweep" / "table.parquet")
    recipe = {k: v[0] for k, v in common.VIT_PAPER.items() if k != "dataset"}
    table = pd.concat([quick.assign(dataset=d, **recipe) for d in ("cifar100", "cifar10")], ignore_index=True)
    exp = catalog.get_experiment("jasmin_sweep")
    text = exp.summary(table)
    assert text.index("**CIFAR-100**") < text.index("**CIFAR-10**")
    assert "CIFAR-100 as in Tables 1 and 3" in text and "CIFAR-10 as in Tables 2 and 4" in text
    assert "paper = ViT-B / CIFAR-100, Table 3" in text and "paper = ViT-B / CIFAR-10, Table 4" in text
    assert f"fine-tuned from {common.VIT_B_IMAGENET}" in text and "trained from scratch" not in text
    assert "3920 SGD steps of batch 512 (learning rate 0.01;" in text  # read from the table: the recipe that ran
    paths = exp.figures(table, tmp_path)
    assert {Path(p).stem for p in paths} >= {"jasmin_sweep_accuracy_cifar100", "jasmin_sweep_accuracy_cifar10"}


def test_paper_inventory_offers_no_stand_in(offline, monkeypatch):
    """`attnlip data list` at the paper scale: the ViT-B checkpoint and the CIFAR data are missing with no stand-in
    (that scale never substitutes), so the cells reading them cannot run."""
    from harness.run import fetch

    monkeypatch.delenv("ATTNLIP_CIFAR100", raising=False)
    rows = {n: (s, why) for _, n, s, why in fetch.inventory(["jasmin_sweep"], ["paper"])}
    for item in (common.VIT_B_IMAGENET, "cifar100", "cifar10"):
        state, why = rows[item]
        assert state == fetch.MISSING and "stand-in" not in why, (item, why)
    quick = {n: why for _, n, s, why in fetch.inventory(["jasmin_sweep"], ["quick"])}
    assert "stand-in" in quick["cifar10"]  # the quick scale does substitute Fashion-MNIST


def test_the_recipe_must_fit_the_checkpoint(tmp_path):
    """A cell whose width / depth / heads or image channels disagree with the checkpoint fails before training,
    naming both; a missing folder is a clear DataNotFound."""
    import pytest

    from harness.errors import DataNotFound

    save_hf(tmp_path)
    c = train.full_recipe(common.vit_recipe(_cell(tmp_path, vit_d=768)))
    with pytest.raises(ValueError, match=r"d 768 \(checkpoint: 32\)"):
        train.build_model(c, (3, 8, 8), 5)
    with pytest.raises(ValueError, match=r"1-channel images \(checkpoint: 3 channels\)"):
        train.build_model(train.full_recipe(common.vit_recipe(_cell(tmp_path))), (1, 8, 8), 5)
    missing = tmp_path / "nowhere"
    assert common.model_source(_cell(missing)) == f"unavailable:local:{missing}"
    with pytest.raises(DataNotFound, match="no ViT checkpoint folder"):
        train.build_model(train.full_recipe(common.vit_recipe(_cell(missing))), (3, 8, 8), 5)


def test_the_fine_tuned_model_is_keyed_by_the_checkpoint_content(tmp_path):
    """Other weights in the same folder: another model_source and another artifact key (no stale fine-tuned model)."""
    save_hf(tmp_path, seed=0)
    first = common.model_source(_cell(tmp_path))
    key1 = train.full_recipe(common.vit_recipe(_cell(tmp_path)))["model"]["weights"]
    save_hf(tmp_path, seed=1)
    assert common.model_source(_cell(tmp_path)) != first
    assert train.full_recipe(common.vit_recipe(_cell(tmp_path)))["model"]["weights"] != key1 == first
