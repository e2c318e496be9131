"""Castin et al. App. E.3: self-attention with biases (BERT adds them to the formula the theorems study).

Remark E.1: the key bias b_K has no influence on the attention map (q_i . b_K is the same for every key j of a
row, and the softmax ignores a constant shift), hence none on f or on its Jacobian. Per layer of the cell's model
on `count` real windows of each length n: the largest |P - P without b_K| over every head and row and the largest
relative |f - f without b_K| (float64 forward maps: rounding only), and the true local Lipschitz constant ||Df(X)||
(harness.kernels.layer.lipschitz) with all biases, without b_K and without any bias (the bias-free map the main
theorems bound). Thm E.3's bound itself is not computed: its formula is not in the text we have.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List

import torch

from harness.kernels import layer as layer_ops
from harness.kernels.attention import attention, probs
from harness.catalog import Context, Experiment, experiment

from experiments.castin import common
from experiments.castin import paper


@experiment
class CastinBiases(Experiment):
    """Castin App. E.3: the key bias's null effect (Remark E.1) and how much the biases move ||Df(X)||."""

    name = "castin_biases"
    figures_ref = ["Castin et al. 2024, App. E.3 (Remark E.1: the key bias has no effect)"]
    description = "Self-attention with biases: b_K changes nothing (Remark E.1); ||Df(X)|| with, without b_K, bias-free"
    grid = {"model": ["minilm", "bert-base-uncased"], "pretrained": ["auto"], "corpus": ["alice"],
            "n": [[8, 16, 32, 64]], "count": [4]}
    quick = {"model": ["minilm"], "n": [[8, 16, 32]], "count": [2]}
    test = {"model": ["tiny-bert"], "corpus": ["synthetic"], "n": [[4, 8]], "count": [1]}
    # pretrained BERT-base where its weights can be had, else the same architecture from random init
    substitutes = tuple(s for s in paper.PRETRAINED if s.paper == "bert-base-uncased")
    # --scale paper: pretrained BERT-base, the model whose biases the appendix discusses
    paper = {"model": ["bert-base-uncased"], "pretrained": [True], "corpus": ["alice"], "n": [[8, 16, 32, 64, 128]],
             "count": [5]}
    paper_cost = 2  # x the full run's cell time: one of its two cells at 5 / 4 the windows and n up to 128, on a GPU

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per (n, layer, window)."""
        dt, count = ctx.torch_dtype, int(cell["count"])
        info = common.info(cell, ctx)
        cell = dict(cell, masked=info["causal"])  # decoder models: inputs from the causal forward pass
        rows = []
        for n in cell["n"]:
            for l, lay in common.layers(cell, ctx, int(n), count, range(info["n_layers"])).items():
                X, w, causal = lay.X.to(dt), lay.w.to(dt), lay.causal
                no_bk, none = dataclasses.replace(w, bk=None), common.no_bias(w)
                with torch.no_grad():
                    dp = (probs(X, w, causal) - probs(X, no_bk, causal)).abs().flatten(1).amax(-1)  # (count,)
                    f, f0 = attention(X, w, causal=causal), attention(X, no_bk, causal=causal)
                    df = (f - f0).flatten(1).norm(dim=-1) / f.flatten(1).norm(dim=-1)
                res = {k: layer_ops.lipschitz(X, v, causal, tol=common.tol(dt))
                       for k, v in (("all", w), ("no_bk", no_bk), ("none", none))}
                for i in range(count):
                    rows.append(dict(n=int(n), layer=l, seq=i, has_bk=w.bk is not None, max_dp=float(dp[i]),
                                     rel_df=float(df[i]), lipschitz=float(res["all"].value[i]),
                                     lipschitz_no_bk=float(res["no_bk"].value[i]),
                                     lipschitz_no_bias=float(res["none"].value[i]),
                                     converged=bool(all(r.converged[i] for r in res.values())), causal=causal,
                                     pretrained=bool(info["pretrained"]), weights_source=info["source"]))
        return rows

    def figures(self, table, outdir):
        from experiments.castin.figures.biases import biases_figure

        return biases_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.castin.figures.biases import biases_summary

        return biases_summary(table)
