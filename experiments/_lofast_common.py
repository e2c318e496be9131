"""Compatibility shim: only tests/test_lofast_certify.py still imports synthetic_images from here. The lofast_*
experiments use harness.models.lofast_train / lofast_eval and experiments/_lofast_plots.py. Delete this file
once that test loads images with harness.data.images.load_images("synthetic", ...)."""
from __future__ import annotations

from typing import Tuple

import torch


def synthetic_images(N: int, seed: int = 0, size: int = 28) -> Tuple[torch.Tensor, torch.Tensor]:
    """(X (N, 1, size, size) in [0, 1], y (N,)): harness.data.images' synthetic set (train split for seed 0)."""
    from harness.data.images import load_images

    X, y, _ = load_images("synthetic", split="train" if seed == 0 else "test", limit=N, size=size, n_synthetic=N)
    return X, y
