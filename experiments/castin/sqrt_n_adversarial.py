"""Castin et al. Fig. 1 (§5.2): the layer's local Lipschitz constant vs n at Prop. 3.4's adversarial inputs.

Per head l with a real eigenvalue of A_c (bias-free weights, float64): X = R(u, u/2, ..., u/2) or
R(-u, u, ..., u), R = radius_factor x the mean token radius of the layer's real inputs (`radius_count` chunks
of length `radius_n`). Per (n, head): ||J_F(X)|| of the multi-head layer with biases (causally masked when
`masked`) and the paper code's estimator (ctx.dtype), the Thm 3.3 bound (float64), the bias-free head-alone
constant ||Df_l(X)|| (ctx.dtype) and Prop. 3.4's lower bound for that head (float64; NaN under a mask, where it
is not proved). `map`: "layer" = the self-attention layer with W^O and biases; "self" = Hugging Face's
`attention.self` (heads concatenated, no W^O, no output bias), the map the authors' adversarial code measured.
Inputs and certificates are float64 (column certificate_dtype), the estimates ctx.dtype.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

import torch

from harness.bounds.castin import adversarial_input, layer_bound, lower_bound, prop34_choice
from harness.kernels import layer as layer_ops
from harness.kernels.attention import AttentionWeights
from harness.catalog import Context, Experiment, experiment

from experiments.castin import common
from experiments.castin import paper

N_ADV = [2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 80, 100]
N_ADV_768 = [2, 4, 8, 16, 32, 64, 100]  # d = 768 panels (57 % of the cost of N_ADV, to keep the full run near 2.5 h)


def _grid(model, layers, masked, factors, ns=N_ADV, count=10, maps=("layer",)):
    return {"model": [model], "pretrained": ["auto"], "layer": layers, "masked": masked, "corpus": ["alice"],
            "radius_factor": factors, "radius_n": [64], "radius_count": [count], "n": [ns], "map": list(maps)}


def self_map(w: AttentionWeights) -> AttentionWeights:
    """The weights of Hugging Face's `attention.self` (what the authors' adversarial code measured): the heads'
    outputs P_l (X wv_l + bv_l) concatenated, no W^O and no output bias (wo = identity blocks)."""
    eye = torch.eye(w.d, dtype=w.wq.dtype, device=w.wq.device).reshape(w.h, w.dh, w.d)
    return AttentionWeights(w.wq, w.wk, w.wv, eye, w.bq, w.bk, w.bv, None)


# --scale paper (§5.2, Fig. 1's adversarial row; App. E.2 for pretrained GPT-2): pretrained BERT-base as encoder
# and decoder at the mean token radius of real data (the paper's R = 15.5 / 21.5), random GPT-2 at about 4x it
# (the paper's 100 against 27.7), pretrained GPT-2 at 1x; 12 values of n up to 100, first and last layer.
# The paper scale is declared through the decorator: run() has a local variable named `paper`, and the code hash
# (harness.store.codehash) counts a class member named like one of run()'s names as compute code.
PAPER = [dict(_grid("bert-base-uncased", [0, -1], [False, True], [1.0], maps=("layer", "self")), pretrained=[True]),
         dict(_grid("gpt2", [0, -1], [True], [1.0]), pretrained=[True]),
         dict(_grid("gpt2", [0, -1], [True], [4.0]), pretrained=[False])]


@experiment(paper=PAPER)
class CastinSqrtNAdversarial(Experiment):
    """Castin Fig. 1 (adversarial): ||Df|| vs n at Prop. 3.4's inputs, head alone, lower and upper bounds."""

    name = "castin_sqrt_n_adversarial"
    figures_ref = ["Castin et al. 2024, Fig. 1 (§5.2, adversarial inputs)", "Castin et al. Prop. 3.4 / Thm 3.3"]
    float32_exempt = ("cpu_s",)  # timings
    verify_tol = {"default": 1e-9, "cpu_s": None}  # timings are not reproducible numbers
    grid = [
        _grid("minilm", [0, -1], [False], [1.0, 2.0], maps=("layer", "self")),
        _grid("gpt2", [0], [False], [1.0, 4.0], ns=N_ADV_768),
        _grid("bert-base-uncased", [0], [False], [1.0, 4.0], maps=("layer", "self"), ns=N_ADV_768),
        # masked panels (Prop. 3.4's input under a causal mask; its lower bound is for the unmasked map)
        _grid("minilm", [0, -1], [True], [1.0, 2.0]),
        _grid("gpt2", [0], [True], [1.0, 4.0], ns=N_ADV_768),
        _grid("gpt2", [-1], [False, True], [1.0, 4.0], ns=N_ADV_768),
        _grid("bert-base-uncased", [-1], [False], [1.0, 4.0], ns=N_ADV_768),
    ]
    quick = [_grid("minilm", [-1], [False], [1.0, 2.0], [2, 4, 8, 16, 32, 64], maps=("layer", "self"))]
    test = [dict(_grid("tiny-bert", [0], [False, True], [2.0], [2, 4, 8], count=3, maps=("layer", "self")),
                 corpus=["synthetic"], radius_n=[16])]
    # pretrained BERT-base / GPT-2 where their weights can be had, else the same architecture from random init
    substitutes = paper.PRETRAINED
    paper_cost = 1  # x the full run's cell time: the d = 768 panels at 12 values of n instead of 7, on a GPU

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per (n, head) for the heads whose A_c has a real eigenvalue."""
        masked, dt = bool(cell["masked"]), ctx.torch_dtype
        info = common.info(cell, ctx)
        real = common.layer(cell, ctx, int(cell["radius_n"]), int(cell["radius_count"]))
        R0 = float(real.X.norm(dim=-1).mean())  # mean token radius of real inputs (float64)
        R = float(cell["radius_factor"]) * R0
        if cell["map"] not in ("layer", "self"):
            raise ValueError(f"map must be 'layer' (with W^O) or 'self' (attention.self), got {cell['map']!r}")
        w64 = real.w if cell["map"] == "layer" else self_map(real.w)
        wnb = common.no_bias(w64)
        choice = prop34_choice(wnb)  # dh x dh eigenproblems (factored route), float64
        heads = [l for l, c in enumerate(choice) if c is not None]
        w, wh = w64.to(dt), layer_ops.stack_heads(wnb.to(dt), heads)
        lbs_nan = float("nan")
        rows, prev = [], None
        for n in cell["n"]:
            X64 = torch.stack([adversarial_input(wnb, l, n, R, choices=choice) for l in heads])  # (H, n, d)
            X = X64.to(dt)
            t0 = time.process_time()
            v0 = layer_ops.warm_start(prev, X.shape, ctx.seed + n, dt, X.device)
            res = layer_ops.lipschitz(X, w, masked, tol=common.tol(dt), v0=v0)
            res_h = layer_ops.lipschitz(X, wh, masked, tol=common.tol(dt))  # element b: head heads[b] alone
            cpu = time.process_time() - t0
            prev = res.vector
            paper = layer_ops.paper_value(X, w, masked)
            bnd = layer_bound(X64, w64, masked)
            lbs = lower_bound(wnb, n, R, choices=choice)  # (h,): Prop. 3.4 is for the unmasked map
            for b, l in enumerate(heads):
                g = float(choice[l]["gamma"])
                rows.append(dict(n=n, head=l, radius=R, radius_real_mean=R0, gamma=g, gamma_R2=g * R * R,
                                 case=choice[l]["case"], lipschitz=float(res.value[b]),
                                 paper_estimator=float(paper[b]), bound_castin=float(bnd[b]),
                                 lipschitz_head=float(res_h.value[b]),
                                 lower_bound=lbs_nan if masked else float(lbs[l]), certificate_dtype="float64",
                                 iters=int(res.iters), iters_head=int(res_h.iters),
                                 map=cell["map"], converged=bool(res.converged[b]) and bool(res_h.converged[b]),
                                 cpu_s=cpu / len(heads), causal=masked, pretrained=bool(info["pretrained"]),
                                 weights_source=info["source"], d=info["d"], heads=info["n_heads"]))
        return rows

    def figures(self, table, outdir):
        from experiments.castin.figures.adversarial import sqrt_n_adversarial_figure

        return sqrt_n_adversarial_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.castin.figures.adversarial import sqrt_n_adversarial_summary

        return sqrt_n_adversarial_summary(table)
