"""LoFAST Fig. 4 / App. C.2: the end-to-end bound vs PGD at several input norm scales (where the bound loosens).

The first (residual, 8-head) attention layer of the lofast_certified ViT at its real inputs with rows on the unit
sphere, scaled by s; and MiniLM layer 0 likewise (harness.models.lofast_eval.study_layer). One row per
(sample, eps): eq. 23 under each bound (bound_naive / coarse / fine / sharp) and the lower bounds pgd_plain (PGD,
random starts) and pgd (also X +- eps v, v Lemma 1's maximizer). Both sources give the same columns.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

import numpy as np

from experiments.lofast import grids
from experiments.lofast import study
from harness.models import lofast_eval
from harness.catalog import experiment


@experiment
class LofastInputNorm(study.StudyExperiment):
    name = "lofast_input_norm"
    figures_ref = ["LoFAST (Havens et al.) Fig. 4 (App. C.2)"]
    description = "End-to-end LoFAST bound / PGD as the input norm grows"
    substitutes = (grids.VIT_SUBSTITUTE,)  # CIFAR-10, else Fashion-MNIST (experiments/lofast/grids.py)
    grid = {"source": ["vit", "minilm"], "input_scale": [0.5, 1.0, 2.0, 4.0, 8.0],
            "eps": [[0.0, 0.025, 0.05, 0.075, 0.1]], "samples": [3], "pgd_steps": [50], "pgd_restarts": [4],
            **grids.VIT_FULL}
    quick = {"source": ["vit"], "input_scale": [1.0, 4.0], "eps": [[0.0, 0.05, 0.1]], "samples": [1],
             "pgd_steps": [15], "pgd_restarts": [2], **grids.VIT_QUICK}
    test = {"source": ["vit"], "input_scale": [1.0], "eps": [[0.1]], "samples": [1], "pgd_steps": [5],
            "pgd_restarts": [1], **grids.VIT_TEST}
    # --scale paper (App. C.2): the first attention layer of the CIFAR-10 ViT (8 heads) trained on all of CIFAR-10
    paper = {"source": ["vit"], "input_scale": [0.5, 1.0, 2.0, 4.0, 8.0], "eps": [[0.0, 0.025, 0.05, 0.075, 0.1]],
             "samples": [3], "pgd_steps": [50], "pgd_restarts": [4], **grids.VIT_PAPER}
    paper_cost = 20  # x the full run's cell time: the 62x longer training of the ViT dominates, on a GPU
    float32_exempt = ("pgd", "pgd_plain")  # PGD lower bounds: random starts drawn in the run's dtype

    def run(self, cell, ctx) -> List[dict]:
        w, X, model = self.study_layer(cell, ctx)
        X = X * float(cell["input_scale"])
        rows = lofast_eval.multihead_rows(w, X, cell["eps"], residual=True, pgd_steps=int(cell["pgd_steps"]),
                                          pgd_restarts=int(cell["pgd_restarts"]), seed=ctx.seed)
        return [dict(source=cell["source"], input_scale=float(cell["input_scale"]), model=model, heads=w.h, **r)
                for r in rows]

    def figures(self, table, outdir: Path):
        from experiments.lofast.figures import plots

        return plots.plot_input_norm(table, outdir)

    def summary(self, table) -> str:
        from experiments.lofast.figures import plots

        r = plots.input_norm_ratios(table)
        e = r.eps.max()
        r = r[np.isclose(r.eps, e)]
        shown = [v for v in plots.BOUNDS if f"ratio_{v}" in r]  # tables made before "refined" existed lack it
        lines = [f"Tightness ratio bound / best lower bound (PGD, plus X +- eps v with v Lemma 1's maximizer) at "
                 f"eps = {e:.3g} (mean over samples):", "",
                 "| source | scale | " + " | ".join(plots.BOUND_LABELS[v] for v in shown) + " |",
                 "|---|---|" + "---|" * len(shown)]
        for _, x in r.sort_values(["source", "input_scale"]).iterrows():
            lines.append(f"| {x.source} | {x.input_scale:g} | "
                         + " | ".join(f"{x[f'ratio_{v}']:.3f}" for v in shown) + " |")
        lines += ["", f"Unconverged Lanczos values: {int((~table.converged.astype(bool)).sum())} of {len(table)} rows.",
                  "", "Paper: the bound stays tight for controlled ||X|| and loosens as the input norm grows (the "
                  "X-dependent delta_21 terms take over). Residual layer (H = I) as in the paper's App. C.2. Ours uses "
                  "the Fashion-MNIST LipViT's first layer instead of a CIFAR-10 ViT."]
        col = "ratio_coarse" if "ratio_coarse" in r else f"ratio_{shown[0]}" if shown else None
        if col is not None and len(r):
            lines += ["", _verdict(r, col)]
        return "\n".join(lines)


TIGHT = 1.25  # "tight": the bound within 25 % of the best lower bound (the paper gives no number)


def _verdict(r, col: str) -> str:
    """The paper's claim per source (model layer): tight at the smallest input scale (ratio <= TIGHT) and looser as
    the scale grows (the ratio increasing with it); reproduced where both hold for every source."""
    per = []
    for src, g in r.groupby("source"):
        g = g.sort_values("input_scale")
        per.append((src, float(g[col].iloc[0]), float(g[col].iloc[-1]), bool(g[col].is_monotonic_increasing)))
    tight = [p for p in per if p[1] <= TIGHT]
    grows = all(p[3] for p in per)
    word = ("reproduced" if grows and len(tight) == len(per) else "partly reproduced" if grows or tight
            else "not reproduced")
    each = "; ".join(f"{src}: {lo:.2f} at scale {r.input_scale.min():g} ({'tight' if lo <= TIGHT else 'not tight'}), "
                     f"{hi:.2f} at {r.input_scale.max():g}, increasing: {inc}" for src, lo, hi, inc in per)
    return (f"Verdict (tight for controlled ||X||, looser as the input norm grows; the paper's bound Thm 1 with xi; "
            f"scope: one attention layer with its residual, per source; stand-ins: the Fashion-MNIST LipViT's first "
            f"layer for the paper's CIFAR-10 ViT, and MiniLM beside it; tight read as bound / best lower bound <= "
            f"{TIGHT:g}): **{word}**: tight at the smallest scale for {len(tight)} of {len(per)} sources, looser as "
            f"the scale grows for {'every' if grows else 'not every'} source ({each}).")

