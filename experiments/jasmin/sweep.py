"""JaSMin (Yudin et al.) Tables 1-4: small ViTs trained from scratch on Fashion-MNIST with no regularizer,
Specformer (joint and per-matrix) and JaSMin_k (the grid: experiments/jasmin/common.py), evaluated on clean, FGSM,
PGD (l_inf and l2) and AutoAttack accuracy.

One cell = one trained model (a cached artifact, shared with jasmin_jacobian_norm, jasmin_heatmaps,
jasmin_overhead, and for the baseline with jasmin_attention_maps / bound_leaderboard) and one row per attack
and budget. The attacks run in the run's dtype on its device (the model is trained in float32 and cast). The
paper's tables beside ours and the verdict: experiments/jasmin/figures/sweep_report.py (Table 4 for CIFAR-10 rows,
Table 3 otherwise).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

from experiments.jasmin import common
from experiments.jasmin import grids
from harness.catalog import Context, experiment

# full: clean / FGSM / PGD on 500 test images (1000 would cost 1,010 s of attacks against 586 s), AutoAttack the first 100
GRIDS = common.sweep_grids({"n_eval": [500], "n_aa": [100], "pgd_steps": [10], "linf_255": [[2, 4, 8]], "l2": [[0.5]]},
                      {"n_eval": [128], "n_aa": [32], "pgd_steps": [5], "linf_255": [[2, 4, 8]], "l2": [[]]},
                      {"n_eval": [8], "n_aa": [0], "pgd_steps": [2], "linf_255": [[2]], "l2": [[]]})


@experiment
class JasminSweep(common.LayersExperiment):
    """JaSMin Tables 1-4 on Fashion-MNIST ViTs (baseline, Specformer, JaSMin sweep): accuracy under attack."""

    name = "jasmin_sweep"
    figures_ref = ["JaSMin (Yudin et al.) Tables 1-4"]
    float32_exempt = ("accuracy", "wall_s")  # attack outcomes flip on rounding near the decision boundary
    verify_tol = {"default": 1e-9, "wall_s": None}  # timings are not reproducible numbers
    grid, quick, test = grids.on_cifar10(GRIDS)  # CIFAR-10 at patch 8, else Fashion-MNIST (experiments/jasmin/grids.py)
    # --scale paper: every row of Tables 1-4 (experiments/jasmin/grids.py: SWEEP_PAPER), ViT-B fine-tuned from
    # ImageNet on CIFAR-100 and CIFAR-10 (jasmin.common.VIT_PAPER), attacked on 1,000 test images with the paper's 4
    # PGD steps and AutoAttack on 500
    paper = grids.sweep_paper_tables({"n_eval": [1000], "n_aa": [500], "pgd_steps": [4], "linf_255": [[2, 4, 8]],
                                      "l2": [[0.5]]})
    substitutes = (common.VIT_SUBSTITUTE,)
    # x the full run's cell time: ViT-B (d 768, 12 layers), 0.84x the steps at 4x the batch, on a GPU: about 10x a
    # full cell, and 78 cells (39 per dataset: 31 settings, 3 seeds for 4 of them) against the full run's 16
    paper_cost = 49

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        import torch

        from harness.models import attacks

        model = common.trained_vit(ctx, cell).to(dtype=ctx.torch_dtype).eval()
        base = common.sweep_columns(cell, model)
        x, y = common.eval_images(cell, int(cell["n_eval"]), ctx)
        x = x.to(ctx.torch_dtype)
        with torch.no_grad():  # the clean cross-entropy: a smooth function of the model, unlike the accuracies
            base["clean_loss"] = float(torch.nn.functional.cross_entropy(model(x), y))
        steps_pgd, n_aa = int(cell["pgd_steps"]), int(cell["n_aa"])
        rows: List[Dict[str, Any]] = []
        backend = attacks.backend_name("auto")

        def add(attack, norm, eps, fn, n, steps=None):
            t0 = time.perf_counter()
            acc = 100 * fn()
            rows.append(dict(base, attack=attack, norm=norm, eps=float(eps),
                             eps_255=float(eps * 255) if norm == "linf" else float("nan"),
                             steps=steps, accuracy=acc, n_images=n, backend=backend if attack != "clean" else "",
                             wall_s=time.perf_counter() - t0))

        add("clean", "", 0.0, lambda: attacks.clean_accuracy(model, x, y), len(x))
        for e255 in cell["linf_255"]:
            eps = e255 / 255
            for kind, steps in (("fgsm", 1), ("pgd", steps_pgd)):
                add(kind, "linf", eps, lambda: attacks.robust_accuracy(model, x, y, kind, eps, "linf", steps=steps,
                                                                       seed=0), len(x), steps)
        for eps in cell["l2"]:
            add("pgd", "l2", float(eps), lambda: attacks.robust_accuracy(model, x, y, "pgd", float(eps), "l2",
                                                                         steps=steps_pgd, seed=0), len(x), steps_pgd)
        if n_aa and attacks.torchattacks_available():
            add("autoattack", "linf", 2 / 255, lambda: attacks.robust_accuracy(
                model, x[:n_aa], y[:n_aa], "autoattack", 2 / 255, "linf", steps=10, seed=0, aa_version="apgd"),
                n_aa, 10)
        return rows

    # ------------------------------------------------------------------------------------------- outputs
    def figures(self, table, outdir):
        from experiments.jasmin.figures.accuracy import accuracy_figure
        from experiments.jasmin.figures.sweep_report import acc_table

        ran = list(dict.fromkeys(table["dataset"])) if "dataset" in table.columns else []
        if len(ran) <= 1:
            return accuracy_figure(table, acc_table(table), outdir)
        paths = []  # the paper scale: one figure per dataset (Tables 1 / 3 on CIFAR-100, 2 / 4 on CIFAR-10)
        for d in ran:
            t = table[table["dataset"] == d]
            paths += accuracy_figure(t, acc_table(t), outdir, stem=f"jasmin_sweep_accuracy_{d}")
        return paths

    def summary(self, table) -> str:
        from experiments.jasmin.figures.sweep_report import summary

        return summary(table)
