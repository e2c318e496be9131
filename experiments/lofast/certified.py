"""LoFAST Fig. 2: certified l2 robustness of a certifiable ViT (LayerProject + 1-Lipschitz layers) by Prop. 1.

Each cell trains (or loads) one LipViT configuration (layers, heads, vo_norm = the ||W^V||, ||W^O|| bound) on
Fashion-MNIST, certifies the first `points` test points by propagating eps layer by layer with Theorem 1 (naive
eq. 9 / coarse xi / fine exact ||M|| / sharpened softmax 1/2 side by side), computes per-point certified radii
by bisection, and attacks the same points with l2 PGD at the same radii (empirical robust accuracy, an upper
bound on certified accuracy). A plug-in ball-change bound (`--bound module:function`, registry.register_plugin)
certifies beside them, with the same PGD check (`violations`; any is named in the summary and fails the run). Certificates are float64 whatever the run's dtype (column certificate_dtype);
the model is trained in float32 (see harness.models.lofast_train) and evaluated and attacked in the run's dtype.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from experiments.lofast import grids
from harness.models import lofast_eval
from harness.catalog import Experiment, experiment
from harness.store.artifacts import cached_artifact

EPS_REF = 0.1  # the summary's reference radius
# 200 test points (300 points measured 1,915 s against 792 s, the
# 1,915 s run shared the machine with a CI run)
_EVAL = {"points": [200], "pgd_steps": [15], "pgd_restarts": [2],
         "eps": [[0.0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0]]}


@experiment
class LofastCertified(Experiment):
    name = "lofast_certified"
    figures_ref = ["LoFAST (Havens et al.) Fig. 2"]
    description = "Certified accuracy vs eps of Lipschitz-constrained ViTs (Prop. 1, Theorem 1 propagated)"
    # the paper's Fig. 2 also varies the patch size: L2-h8-c0.5 at patch 4 and 16 beside 8 (Fashion-MNIST: 4, 14, 7)
    substitutes = (grids.VIT_SUBSTITUTE,)  # CIFAR-10, else Fashion-MNIST (experiments/lofast/grids.py)
    # c = 1 (W^V, W^O only 1-Lipschitz, no fraction): the paper's "no meaningful certified accuracy" without it
    grid = [{"layers": [1, 2, 2, 2, 2, 2], "heads": [8, 4, 8, 8, 8, 8], "vo_norm": [0.5, 0.5, 0.25, 0.5, 0.75, 1.0],
             **grids.VIT_FULL, **_EVAL},
            {"layers": [2], "heads": [8], "vo_norm": [0.5], **dict(grids.VIT_FULL, patch=[4, 16]), **_EVAL}]
    paired = [("layers", "heads", "vo_norm")]
    quick = {"layers": [2, 2], "heads": [8, 8], "vo_norm": [0.5, 1.0], **grids.VIT_QUICK, "points": [48],
             "pgd_restarts": [1]}
    test = {"layers": [2], "heads": [8], "vo_norm": [0.5], **grids.VIT_TEST, "points": [12], "pgd_steps": [8],
            "pgd_restarts": [1]}
    # --bound module:function with the attributes scope = "layer", bounds = "ball_change" certifies beside these
    accepts_bounds = True
    # the papers' sizes (--scale paper): Fig. 2's architectures on all of CIFAR-10, certified on the whole test set,
    # and one on all of SVHN
    paper = [{"layers": [1, 2, 2, 2, 2, 2], "heads": [8, 4, 8, 8, 8, 8], "vo_norm": [0.5, 0.5, 0.25, 0.5, 0.75, 1.0],
              **grids.VIT_PAPER, **dict(_EVAL, points=[10000])},
             {"layers": [2], "heads": [8], "vo_norm": [0.5], **dict(grids.VIT_PAPER, patch=[4, 16]),
              **dict(_EVAL, points=[10000])},
             # the paper's SVHN certification (cropped digits, 73,257 train / 26,032 test), L2-h8-c0.5 at patch 8
             {"layers": [2], "heads": [8], "vo_norm": [0.5],
              **dict(grids.VIT_PAPER, dataset=["svhn"], train_size=[73257], test_size=[26032]),
              **dict(_EVAL, points=[26032])}]
    paper_cost = 40  # x the full run's cell time: 62x the training steps and 50x the points, on a GPU
    float32_exempt = ("pgd_acc", "train_seconds")  # PGD and wall-clock time are chaotic under a dtype change
    verify_tol = {"default": 1e-9, "train_seconds": None}  # timings are not reproducible numbers

    def run(self, cell, ctx) -> List[dict]:
        return lofast_eval.certified_cell("vit", cell, ctx, store=cached_artifact)

    def figures(self, table, outdir: Path):
        from experiments.lofast.figures import certified as certified_figures
        from experiments.figures.common import lipvit_name

        return certified_figures.plot_certified(table, outdir, "lofast_certified", "l2 radius eps (pixels in [0, 1])",
                                "CIFAR-10 ViT", lipvit_name(table))

    def summary(self, table) -> str:
        from experiments.lofast.figures import certified as certified_figures
        from experiments.lofast.figures.constraint import constraint_verdict

        return "\n".join([
            certified_figures.certified_summary(table, EPS_REF), "", certified_figures.certified_verdict(table, EPS_REF), "",
            constraint_verdict(table, EPS_REF), "",
            certified_figures.patch_verdict(table, EPS_REF), "", certified_figures.naive_note(table, EPS_REF), "",
            "Paper (CIFAR-10 ViT, SLL layers): non-zero certified accuracy up to eps ~ 36/255 = 0.14, with a clean vs "
            "certified trade-off over layers, heads and the ||W^V||, ||W^O|| fraction. Here: Fashion-MNIST (28x28, 7x7 "
            "patches, d = 64; L2-h8-c0.5 also at 4x4 and 14x14 patches for Fig. 2's patch-size axis), a few "
            "epochs on a shared 2-core CPU, the first test points only (clean accuracy in "
            "parentheses: the whole test split used); the paper's SVHN certification runs only at --scale paper "
            "(`attnlip data fetch svhn`; SVHN is not reachable here). eps is the l2 radius in [0, 1] pixel units. "
            "Our choices where the paper is silent: exact spectral normalization for every linear map (the constraint "
            "holds exactly, so the certificate never trusts an estimate), SLL feed-forward layers, and the residual "
            "taken after LayerProject(1) so each block is 1-Lipschitz maps around eq. (3) with H = I. 'violations' "
            "counts certified points broken by PGD (must be 0). Beyond the paper: exact ||M_l|| (fine) and the softmax"
            " constant 1/2 (sharp) next to xi (coarse, the paper's practical bound) and eq. 9 (naive)."])
