"""Castin et al. App. C.5 (Fig. 2): the scaling factor gamma R^2 of Prop. 3.4 per layer and head on real data.

gamma = max(lam_max / 4, -2 lam_min) over the real eigenvalues of A_c = A_l^T (bias-free weights, docs/math.md §3);
R = mean token norm of the layer's real inputs (forward hooks, `count` extracts of length n), as the paper's
Fig. 2 text defines it (5 extracts); the authors' code computes R as the RMS token norm sqrt(mean ||x_i||^2)
(columns radius_rms, gamma_R2_rms), reported beside it. Prop. 3.4's lower bound grows like sqrt(n) while
n << e^{gamma R^2}, so n* = e^{gamma R^2} marks where the sqrt(n) regime ends; we report log10 n* and whether it
exceeds typical context lengths (512). Columns with the max token radius and with biases folded in (JaSMin Remark 2: A of the
augmented weights on [x, 1], radius sqrt(R^2 + 1)) show how sensitive the picture is to those choices.
gamma comes from a non-symmetric eigenproblem whose real eigenvalues are told apart from complex pairs with a
1e-9 relative tolerance, so it is computed in float64 (column gamma_dtype); radii follow ctx.dtype.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List

from harness.bounds.castin import prop34_choice
from harness.catalog import Context, Experiment, experiment

from experiments.castin import common
from experiments.castin import paper


@experiment
class CastinGamma(Experiment):
    """Castin App. C.5: gamma R^2 per layer/head of the pretrained model on real data; n* = e^{gamma R^2}."""

    name = "castin_gamma"
    figures_ref = ["Castin et al. 2024, App. C.5 / Fig. 2"]
    grid = {"model": ["minilm", "bert-base-uncased", "gpt2"], "pretrained": ["auto"], "corpus": ["alice"],
            "n": [64], "count": [5]}
    quick = {"model": ["minilm", "gpt2"]}
    test = {"model": ["tiny-bert"], "corpus": ["synthetic"], "n": [8], "count": [2]}
    # pretrained BERT-base / GPT-2 where their weights can be had, else the same architecture from random init
    substitutes = paper.PRETRAINED
    # --scale paper (App. C.5, Fig. 2): pretrained BERT-base on a batch of five Alice extracts (the extract length is
    # not stated in the paper: 64 tokens as at full scale)
    paper = {"model": ["bert-base-uncased"], "pretrained": [True], "corpus": ["alice"], "n": [64], "count": [5]}
    paper_cost = 1  # x the full run's cell time: one of its three cells, on a GPU

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per (layer, head)."""
        info = common.info(cell, ctx)
        cell = dict(cell, masked=info["causal"])  # decoder models: inputs from the causal forward pass
        rows = []
        got = common.layers(cell, ctx, int(cell["n"]), int(cell["count"]), range(info["n_layers"]))
        for l, lay in got.items():
            r = lay.X.to(ctx.torch_dtype).norm(dim=-1)  # (count, n)
            R_mean, R_max, R_rms = float(r.mean()), float(r.max()), float(r.square().mean().sqrt())
            ch = prop34_choice(common.no_bias(lay.w))  # float64, dh x dh route
            ch_aug = prop34_choice(lay.w.augmented())
            for h, (c, ca) in enumerate(zip(ch, ch_aug)):
                g = math.nan if c is None else float(c["gamma"])
                ga = math.nan if ca is None else float(ca["gamma"])
                gr2 = g * R_mean ** 2
                rows.append(dict(layer=l, head=h, gamma=g, gamma_dtype="float64", radius_mean=R_mean,
                                 radius_max=R_max, radius_rms=R_rms, gamma_R2=gr2, gamma_R2_max=g * R_max ** 2,
                                 gamma_R2_rms=g * R_rms ** 2,
                                 gamma_R2_biased=ga * (R_mean ** 2 + 1), log10_nstar=gr2 / math.log(10),
                                 case=None if c is None else c["case"],
                                 lam=math.nan if c is None else float(c["lam"]),
                                 pretrained=bool(info["pretrained"]), weights_source=info["source"], d=info["d"]))
        return rows

    def figures(self, table, outdir):
        from experiments.castin.figures.gamma import gamma_figure

        return gamma_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.castin.figures.gamma import gamma_summary

        return gamma_summary(table)
