"""LoFAST Fig. 1: tightness of the single-head Delta_21, Delta_22 bounds and the multi-head end-to-end bound (eq. 23).

Inputs (harness.models.lofast_eval.study_layer): the first attention layer of the lofast_certified ViT (8 heads,
its real attention inputs with rows on the unit sphere) and layer 0 of pretrained all-MiniLM-L6-v2 (12 heads,
biases dropped, SST-2 tokens, unit rows). H = 0 as in eq. 23. Upper bounds from harness.bounds.lofast, lower
bounds by PGD on each quantity. One row per (quantity, eps, sample) with a column per bound (NaN where a
quantity has no such bound); both sources give the same columns.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from experiments.lofast import grids
from experiments.lofast import study
from harness.models import lofast_eval
from harness.catalog import experiment


@experiment
class LofastTightness(study.StudyExperiment):
    name = "lofast_tightness"
    figures_ref = ["LoFAST (Havens et al.) Fig. 1"]
    description = "Tightness of delta_21, delta_22 and the end-to-end bound vs PGD over eps in [0, 0.1]"
    substitutes = (grids.VIT_SUBSTITUTE,)  # CIFAR-10, else Fashion-MNIST (experiments/lofast/grids.py)
    grid = {"source": ["vit", "minilm"], "eps": [[round(0.01 * i, 2) for i in range(11)]], "samples": [4],
            "pgd_steps": [50], "pgd_restarts": [4], **grids.VIT_FULL}
    quick = {"source": ["vit", "minilm"], "eps": [[0.0, 0.025, 0.05, 0.1]], "samples": [2], "pgd_steps": [15],
             "pgd_restarts": [2], **grids.VIT_QUICK}
    test = {"source": ["vit"], "eps": [[0.0, 0.1]], "samples": [1], "pgd_steps": [5], "pgd_restarts": [1],
            **grids.VIT_TEST}
    # --scale paper (Fig. 1): eps in [0, 0.1] at 4 patches, as the paper's X (||X||_F = 4, "the number of patches"):
    # patch 16 on 32x32 CIFAR-10 (one of lofast_certified's paper patches, so the same trained ViT), trained on all
    # of CIFAR-10
    paper = {"source": ["vit"], "eps": [[round(0.01 * i, 2) for i in range(11)]], "samples": [4], "pgd_steps": [50],
             "pgd_restarts": [4], **grids.VIT_PAPER, "patch": [16]}
    paper_cost = 20  # x the full run's cell time: the 62x longer training of the ViT dominates, on a GPU
    float32_exempt = ("pgd", "pgd_plain")  # PGD lower bounds: random starts drawn in the run's dtype

    def run(self, cell, ctx) -> List[dict]:
        w, X, model = self.study_layer(cell, ctx)
        pgd = dict(pgd_steps=int(cell["pgd_steps"]), pgd_restarts=int(cell["pgd_restarts"]), seed=ctx.seed)
        rows = lofast_eval.single_head_rows(w, X, cell["eps"], **pgd)
        rows += [dict(r) for r in lofast_eval.multihead_rows(w, X, cell["eps"], residual=False, **pgd)]
        meta = dict(source=cell["source"], model=model, heads=w.h, d=w.d, n=X.shape[-2])
        return [dict(meta, **r) for r in rows]

    def figures(self, table, outdir: Path):
        from experiments.lofast.figures import plots

        return plots.plot_quantities(table, outdir, "lofast_tightness")

    def summary(self, table) -> str:
        from experiments.lofast.figures import plots

        return plots.tightness_summary(table)
