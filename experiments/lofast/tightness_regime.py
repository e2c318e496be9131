"""LoFAST Fig. 1's claim, tested: is the end-to-end bound (eq. 23) tight "for small ||X|| and eps"? A sweep of
the input norm and eps that finds the regime where bound / PGD approaches 1, or shows there is none.

Inputs as lofast_tightness (harness.models.lofast_eval.study_layer: the lofast_certified ViT's first attention layer
and pretrained MiniLM layer 0, rows on the unit sphere), then scaled by `x_scale` (so ||x_i|| = x_scale <= 1,
inside LayerProject's ball) and optionally cut to the first `tokens` tokens (4 = the paper's 4-patch ViT; 0 = all).
Per (x_scale, tokens, eps, sample): eq. 23 under each bound (naive / coarse / fine / sharp) and the PGD lower
bound (random restarts and the Lemma 1 start), as lofast_tightness's end-to-end rows. As eps -> 0 the ratio tends
to (first-order coefficient of the bound) / ||J_F(X)||, since Theorem 1's Delta_2 terms are linear in eps there.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from experiments.lofast import grids
from experiments.lofast import study
from harness.models import lofast_eval
from harness.catalog import experiment

EPS = [0.001, 0.003, 0.01, 0.03, 0.1]


@experiment
class LofastTightnessRegime(study.StudyExperiment):
    name = "lofast_tightness_regime"
    figures_ref = ["LoFAST (Havens et al.) Fig. 1 (its 'tight for small ‖X‖ and eps' claim)"]
    description = "End-to-end bound / PGD over input norm x eps: where (if anywhere) LoFAST's eq. 23 is tight"
    substitutes = (grids.VIT_SUBSTITUTE,)  # CIFAR-10, else Fashion-MNIST (experiments/lofast/grids.py)
    grid = {"source": ["vit", "minilm"], "x_scale": [1.0, 0.5, 0.25, 0.1], "tokens": [0, 4], "eps": [EPS],
            "samples": [4], "pgd_steps": [50], "pgd_restarts": [4], **grids.VIT_FULL}
    quick = {"source": ["vit", "minilm"], "x_scale": [1.0, 0.25], "tokens": [0, 4], "eps": [[0.001, 0.01, 0.1]],
             "samples": [2], "pgd_steps": [15], "pgd_restarts": [2], **grids.VIT_QUICK}
    test = {"source": ["vit"], "x_scale": [1.0, 0.25], "tokens": [0], "eps": [[0.01, 0.1]], "samples": [1],
            "pgd_steps": [5], "pgd_restarts": [1], **grids.VIT_TEST}
    # --scale paper: Fig. 1's claim on the CIFAR-10 ViT trained on all of CIFAR-10 (the paper's own model)
    paper = {"source": ["vit"], "x_scale": [1.0, 0.5, 0.25, 0.1], "tokens": [0, 4], "eps": [EPS], "samples": [4],
             "pgd_steps": [50], "pgd_restarts": [4], **grids.VIT_PAPER}
    paper_cost = 20  # x the full run's cell time: the 62x longer training of the ViT dominates, on a GPU
    float32_exempt = ("pgd", "pgd_plain")  # PGD lower bounds: random starts drawn in the run's dtype

    def run(self, cell, ctx) -> List[dict]:
        w, X, model = self.study_layer(cell, ctx)
        scale, tokens = float(cell["x_scale"]), int(cell["tokens"])
        if not 0 < scale <= 1:
            raise ValueError(f"x_scale must be in (0, 1] (LayerProject's unit ball), got {scale}")
        if tokens < 0:
            raise ValueError(f"tokens must be >= 0 (0 = all), got {tokens}")
        X = scale * (X[:, :tokens] if tokens else X)
        rows = lofast_eval.multihead_rows(w, X, cell["eps"], residual=False, pgd_steps=int(cell["pgd_steps"]),
                                          pgd_restarts=int(cell["pgd_restarts"]), seed=ctx.seed)
        meta = dict(source=cell["source"], model=model, heads=w.h, d=w.d, n=X.shape[-2], x_scale=scale)
        return [dict(meta, **r) for r in rows]

    def figures(self, table, outdir: Path):
        from experiments.lofast.figures import regime as regime_plots

        return regime_plots.regime_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.lofast.figures import regime as regime_plots

        return regime_plots.regime_summary(table)
