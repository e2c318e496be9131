"""The JaSMin experiments' ViT grids on the paper's data, CIFAR-10, with Fashion-MNIST as the declared stand-in.

The JaSMin ViT budget (experiments/jasmin/common.py: VIT_FULL, VIT_QUICK) is sized for 28x28 Fashion-MNIST with
patch 7: 16 patches + cls = 17 tokens. On CIFAR-10 (32x32x3) patch 8 gives the same 17 tokens, so `on_cifar10`
names CIFAR-10 with patch 8 in every ViT sub-grid of the full and quick scales, and SUBSTITUTE
(jasmin.common.VIT_SUBSTITUTE: patch 8 -> 7, 4 -> 7) turns such a cell back into the Fashion-MNIST cell when
CIFAR-10 cannot be obtained (harness.run.substitutes). Offline the planned cells are the Fashion-MNIST ones, key for
key. The test scale's synthetic images need no substitute.

Only the experiments' declarations read this module (their run() does not), so it is not part of any cell key.
"""
from __future__ import annotations

from typing import Any, Dict

from experiments.jasmin import common

SUBSTITUTE = common.VIT_SUBSTITUTE
PAPER_DATA = {"dataset": ["cifar10"], "patch": [8]}  # 32x32 in 8x8 patches: 16 patches + cls, as 28x28 in 7x7


def _stand_in(g: Dict[str, Any]) -> bool:
    """Whether a sub-grid is the Fashion-MNIST ViT budget of the full / quick scale (dataset and patch as declared
    there, which SUBSTITUTE maps CIFAR-10's patch 8 back onto)."""
    return g.get("dataset") == common.VIT_FULL["dataset"] and g.get("patch") == common.VIT_FULL["patch"]


def on_cifar10(grids):
    """A grid (a dict or a list of sub-grids), or a (grid, quick, test) tuple of them, with every Fashion-MNIST
    ViT sub-grid naming CIFAR-10 at patch 8 instead; other sub-grids (text models, synthetic) unchanged."""
    if isinstance(grids, tuple):
        return tuple(on_cifar10(g) for g in grids)
    if isinstance(grids, dict):
        return dict(grids, **PAPER_DATA) if _stand_in(grids) else dict(grids)
    return [on_cifar10(g) for g in grids]



# --scale paper for jasmin_sweep: every setting of the paper's Tables 3 / 4 (31 each, Tables 1 / 2 their subsets):
# the baseline; Specformer joint / q / k / v at lambda 1e-2, 1e-3, 1e-4; JaSMin k = 0 / 10 / 30 at the same lambdas
# with mean and max aggregation (patch 4 gives 65 tokens, so k = 30 fits). The paper trains each once; the Table 1
# comparison the verdict rests on keeps the full scale's three training seeds.
_S3, _S1 = [0, 1, 2], [0]
LAMS = [1e-2, 1e-3, 1e-4]
SWEEP_PAPER = [
    {"method": ["baseline"], "train_seed": _S3},
    {"method": ["specformer"], "variant": ["joint"], "lam": [1e-2], "train_seed": _S3},
    {"method": ["specformer"], "variant": ["joint"], "lam": LAMS[1:], "train_seed": _S1},
    {"method": ["specformer"], "variant": ["q", "k", "v"], "lam": LAMS, "train_seed": _S1},
    {"method": ["jasmin"], "k": [0, 10], "lam": [1e-2], "agg": ["mean"], "train_seed": _S3},
    {"method": ["jasmin"], "k": [30], "lam": [1e-2], "agg": ["mean"], "train_seed": _S1},
    {"method": ["jasmin"], "k": [0, 10, 30], "lam": LAMS[1:], "agg": ["mean"], "train_seed": _S1},
    {"method": ["jasmin"], "k": [0, 10, 30], "lam": LAMS, "agg": ["max"], "train_seed": _S1},
]


def sweep_paper_tables(own: dict):
    """jasmin_sweep's paper-scale grid: every SWEEP_PAPER setting on CIFAR-100 (Tables 1 / 3) and CIFAR-10 (2 / 4)
    with the paper's ViT-B recipe (jasmin.common.VIT_PAPER) and the experiment's own keys."""
    return [dict(g, **common.VIT_PAPER, **own) for g in SWEEP_PAPER]
