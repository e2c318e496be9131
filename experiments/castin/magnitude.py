"""Castin et al. App. E.2 (Figs. 4-6): token magnitude entering attention vs sequence length n for models with
learned position embeddings, and its effect on the fitted slope of ||Df(X)|| vs n.

For each n, `count` Alice chunks; X = the layer's real attention input (forward hook, the model's float32
forward pass). Per sequence: mean and max token norm, the norm of the first and last position, and ||J_F(X)||
(ctx.dtype) for X as is and for X rescaled so that every sequence has the same mean token norm (the pooled mean
over all n). The slope difference between the two is the part of the n-dependence carried by the magnitude
drift (the paper's explanation for pretrained GPT-2).
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from harness.kernels import layer as layer_ops
from harness.catalog import Context, Experiment, experiment

from experiments.castin import common


@experiment
class CastinMagnitude(Experiment):
    """Castin App. E.2: token magnitude vs n (learned position embeddings) and its effect on the slope."""

    name = "castin_magnitude"
    figures_ref = ["Castin et al. 2024, App. E.2 / Figs. 4-6"]
    grid = {"model": ["minilm", "gpt2"], "pretrained": ["auto"], "layer": [0, -1], "corpus": ["alice"],
            "n": [[2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 100]], "count": [10]}
    quick = {"model": ["minilm"], "n": [[2, 4, 8, 16, 32, 64]], "count": [4]}
    test = {"model": ["tiny-bert"], "layer": [0], "corpus": ["synthetic"], "n": [[2, 4, 8]], "count": [2]}
    # --scale paper (App. E.2): pretrained GPT-2, first and last layer, Alice windows
    paper = {"model": ["gpt2"], "pretrained": [True], "layer": [0, -1], "corpus": ["alice"],
             "n": [[2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 100]], "count": [10]}
    paper_cost = 1  # x the full run's cell time: half its cells, on a GPU

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per (n, sequence)."""
        count, dt = int(cell["count"]), ctx.torch_dtype
        info = common.info(cell, ctx)
        cell = dict(cell, masked=info["causal"])  # decoder models: inputs from the causal forward pass
        Ls = {n: common.layer(cell, ctx, n, count) for n in cell["n"]}
        Xs = {n: lay.X.to(dt) for n, lay in Ls.items()}  # (count, n, d)
        causal = next(iter(Ls.values())).causal
        w = next(iter(Ls.values())).w.to(dt)
        pooled = torch.cat([X.norm(dim=-1).flatten() for X in Xs.values()]).mean()
        rows = []
        for n, X in Xs.items():
            r = X.norm(dim=-1)  # (count, n)
            Xr = X * (pooled / r.mean(dim=-1))[:, None, None]  # same mean token norm for every sequence
            res, res_r = layer_ops.lipschitz(X, w, causal, tol=common.tol(dt)), layer_ops.lipschitz(Xr, w, causal, tol=common.tol(dt))
            lip, lip_r = res.value, res_r.value
            ok = res.converged & res_r.converged  # (count,): both Lanczos runs converged
            for i in range(count):
                rows.append(dict(n=n, seq=i, radius_mean=float(r[i].mean()), radius_max=float(r[i].max()),
                                 radius_first=float(r[i, 0]), radius_last=float(r[i, -1]), lipschitz=float(lip[i]),
                                 lipschitz_rescaled=float(lip_r[i]), converged=bool(ok[i]),
                                 pooled_radius=float(pooled), causal=causal,
                                 pretrained=bool(info["pretrained"]), weights_source=info["source"]))
        return rows

    def figures(self, table, outdir):
        from experiments.castin.figures.gamma import magnitude_figure

        return magnitude_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.castin.figures.gamma import magnitude_summary

        return magnitude_summary(table)
