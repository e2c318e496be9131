"""Castin et al. Fig. 1 (§5.1) on the map the authors measured for real data: BERT's post-LN attention block
F(X) = LN(X + attn(X)) (Hugging Face `BertAttention`: self-attention with W^O and biases, residual, LayerNorm).

Why: on this map the authors' estimator sqrt(||J^T F(X)||) (their `jvp(...)[0]` is F(X)) scales with
||F(X)||_F, and LayerNorm pins every output token to a fixed radius, so ||F(X)||_F ~ sqrt(n) and the estimator
picks up about n^0.25 whatever ||J|| does. Per cell (model, layer, inputs) and sequence: the true ||J_F(X)||
(Lanczos on J^T J through torch.func, ctx.dtype), the estimator, and the attention layer alone (castin_sqrt_n's
map) at the same X. Inputs: `text` = the layer's exact inputs on Alice windows (forward hook, as
castin_sqrt_n), `random_tokens` = Gaussian tokens rescaled to a fixed norm R = the mean token norm of those
real inputs (per n), so only n changes along a panel.
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

import torch

from harness.kernels import block as block_ops
from harness.kernels import layer as layer_ops
from harness.models.blocks import post_ln
from harness.catalog import Context, Experiment, experiment

from experiments.castin import common
from experiments.castin import paper

N_PAPER = list(range(2, 101, 2))
N_SPARSE = [2, 4, 8, 12, 16, 24, 32, 48, 64, 80, 100]  # d = 768 panels: ~4x the cost per n


def _grid(model, layers, ns, count=10, inputs=("text", "random_tokens"), corpus="alice"):
    return {"model": [model], "pretrained": ["auto"], "layer": layers, "inputs": list(inputs), "corpus": [corpus],
            "n": [ns], "count": [count]}


def fixed_norm_tokens(shape, R: float, seed: int, dtype, device) -> torch.Tensor:
    """Gaussian tokens rescaled to norm R each: (count, n, d), drawn in float64 (the same tokens in every dtype)."""
    g = torch.Generator(device=device).manual_seed(seed)
    Z = torch.randn(tuple(shape), dtype=torch.float64, device=device, generator=g)
    return (R * Z / Z.norm(dim=-1, keepdim=True)).to(dtype)


# --scale paper (§5.1, the authors' BertAttention map): pretrained BERT-base, 10 Alice sequences per even n up to 100,
# first / middle / last layer, real text and fixed-norm tokens.
# The paper scale is declared through the decorator: run() has a local variable named `paper`, and the code hash
# (harness.store.codehash) counts a class member named like one of run()'s names as compute code.
PAPER = [dict(_grid("bert-base-uncased", [0, 5, -1], N_PAPER, count=10), pretrained=[True])]


@experiment(paper=PAPER)
class CastinSqrtNBlock(Experiment):
    """Castin Fig. 1 on LN(X + attn(X)): true ||J|| vs the authors' estimator vs n, real text and fixed-norm tokens."""

    name = "castin_sqrt_n_block"
    figures_ref = ["Castin et al. 2024, Fig. 1 (§5.1, real data; the BertAttention map of the authors' code)"]
    # timings; and the estimator, rounding noise where LayerNorm is the identity (random init: J^T F(X) = 0)
    float32_exempt = ("cpu_s", "paper_estimator")
    verify_tol = {"default": 1e-9, "cpu_s": None}  # timings are not reproducible numbers
    # 5 sequences per n (10 sequences cost 2,085 s of cell time against 911 s; the full run is kept near 2.5 h)
    grid = [_grid("minilm", [0, 5], N_PAPER, count=5), _grid("bert-base-uncased", [0, 5], N_SPARSE, count=5)]
    quick = [_grid("minilm", [0, 5], [2, 4, 8, 16, 32, 64], count=4),
             _grid("bert-base-uncased", [0], [2, 8, 32], count=3)]
    test = [_grid("tiny-bert", [0], [2, 4, 8], count=3, corpus="synthetic")]
    # pretrained BERT-base where its weights can be had, else the same architecture from random init
    substitutes = paper.PRETRAINED[:1]  # pretrained BERT-base (the grid has no GPT-2)
    # x the full run's cell time: the d = 768 panels at 6.5x the summed n, 2x the sequences and 1.5x the layers, on
    # a GPU (~10x a 2-core CPU for these batched Jacobian products)
    paper_cost = 2

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per (n, sequence): lipschitz_block, paper_estimator, lipschitz_attention, radii."""
        count, dt, layer = int(cell["count"]), ctx.torch_dtype, int(cell["layer"])
        info = common.info(cell, ctx)
        lnw, lnb, eps = post_ln(cell["model"], layer, cell["pretrained"], ctx.seed, ctx.torch_device, dt)
        rows = []
        for n in cell["n"]:
            lay = common.layer(dict(cell, masked=False), ctx, n, count)  # float64 copy of the float32 forward pass
            X = lay.X.to(dt)
            R = float(X.norm(dim=-1).mean())
            if cell["inputs"] == "random_tokens":
                X = fixed_norm_tokens(X.shape, R, ctx.seed * 7919 + n, dt, X.device)
            elif cell["inputs"] != "text":
                raise ValueError(f"inputs must be 'text' or 'random_tokens', got {cell['inputs']!r}")
            w = lay.w.to(dt)
            F = block_ops.block_map(w, lnw, lnb, eps)
            t0 = time.process_time()
            op = block_ops.block_operator(F, X)  # one forward pass: F(X), J and J^T
            res = block_ops.block_lipschitz(F, X, w.d, seed=ctx.seed + n, operator=op)
            cpu = time.process_time() - t0
            paper = block_ops.block_paper_value(F, X, operator=op)
            att = layer_ops.lipschitz(X, w, False, tol=common.tol(dt))
            fnorm = op[0].flatten(-2).norm(dim=-1)
            for i in range(count):
                rows.append(dict(n=n, seq=i, lipschitz_block=float(res.value[i]), paper_estimator=float(paper[i]),
                                 lipschitz_attention=float(att.value[i]), output_fro=float(fnorm[i]),
                                 radius_mean=float(X[i].norm(dim=-1).mean()), iters=int(res.iters),
                                 converged=bool(res.converged[i]) and bool(att.converged[i]), cpu_s=cpu / count,
                                 pretrained=bool(info["pretrained"]), weights_source=info["source"],
                                 d=info["d"], heads=info["n_heads"]))
        return rows

    def figures(self, table, outdir):
        from experiments.castin.figures.block import block_figure

        return block_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.castin.figures.block import block_summary

        return block_summary(table)
