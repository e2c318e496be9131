"""Same key, same numbers: training gives bitwise-identical weights run twice and at any torch thread count.

The ViT + JaSMin configuration below is the one that gave different weights at 1 and 2 threads before `fit`
computed with a fixed thread count (2-core machine); the LipViT one is LoFAST's test-scale model."""
from __future__ import annotations

import hashlib

import pytest
import torch

from harness import context
from harness.data.images import load_images
from harness.models import lofast_train
from harness.models import regularizers as R
from harness.models.train import TRAIN_THREADS, train_classifier

LIPVIT_CELL = {"layers": 1, "heads": 2, "vo_norm": 0.5, "dataset": "synthetic", "train_size": 64, "test_size": 16,
               "epochs": 1, "lr": 3e-3, "patch": 14}


def _digest(model) -> str:
    h = hashlib.sha256()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def _vit():
    tr = load_images("synthetic", split="train", size=8, n_classes=3, n_synthetic=256)
    te = load_images("synthetic", split="test", size=8, n_classes=3, n_synthetic=64)
    recipe = {"dataset": "synthetic", "model": {"d": 16, "depth": 1, "heads": 2}, "epochs": 3, "batch_size": 32,
           "lr": 3e-3, "seed": 1}
    m = train_classifier(recipe, None, regularizer=R.JaSMin(0, 1e-3), data=((tr[0], tr[1]), (te[0], te[1])))
    return m, m.train_metrics


def _lipvit():
    recipe = lofast_train.recipe_from_cell("vit", LIPVIT_CELL, seed=0)
    m, info = lofast_train.trained_model(recipe)
    return m, info


TRAININGS = {"vit_jasmin": _vit, "lipvit": _lipvit}


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("name", sorted(TRAININGS))
def test_training_twice_in_one_process_is_bitwise_equal(name):
    a, b = TRAININGS[name](), TRAININGS[name]()
    assert _digest(a[0]) == _digest(b[0])
    for x, y in zip(a[0].state_dict().values(), b[0].state_dict().values()):
        assert torch.equal(x, y)


@pytest.mark.parametrize("name", sorted(TRAININGS))
def test_training_on_one_and_two_threads_is_bitwise_equal(name, restore_threads):
    """The runner may set any thread count (--threads, cores // -j); training computes with TRAIN_THREADS anyway
    and gives the thread count back afterwards."""
    out = {}
    for n in (1, 2):
        torch.set_num_threads(n)
        model, metrics = TRAININGS[name]()
        assert torch.get_num_threads() == n  # restored after training
        out[n] = (_digest(model), metrics)
    assert out[1][0] == out[2][0]
    if name == "vit_jasmin":  # fit reports the count it trained with; the accuracy is the same number too
        assert out[1][1]["threads"] == out[2][1]["threads"] == TRAIN_THREADS
        assert out[1][1]["test_acc"] == out[2][1]["test_acc"]
        assert out[1][1]["loss_curve"] == out[2][1]["loss_curve"]


def test_fixed_threads_sets_and_restores(restore_threads):
    torch.set_num_threads(2)
    det = torch.are_deterministic_algorithms_enabled()
    with context.fixed_threads(1):
        assert torch.get_num_threads() == 1 and torch.are_deterministic_algorithms_enabled()
    assert torch.get_num_threads() == 2 and torch.are_deterministic_algorithms_enabled() == det
    with pytest.raises(RuntimeError, match="inside"):
        with context.fixed_threads(1):
            raise RuntimeError("inside")
    assert torch.get_num_threads() == 2 and torch.are_deterministic_algorithms_enabled() == det
