"""Castin et al. Thm 3.7 (and Thm 4.5, its masked version): the local Lipschitz constant of one head at large radius.

Generic unit-norm inputs X0 (`count` sequences of n tokens, seeded) scaled by R, from 0.5/sqrt(||A||) up to
where R^2 x (smallest top-1 minus top-2 score gap of X0) = `settle` for every sequence (at least
R sqrt(||A||) = 300); ||Df_l(RX0)|| / (||V|| sqrt(n)) tends to Thm 3.7's exact limit
sqrt(max_j #{i : j*(i) = j} / n) <= 1 (attention rows become one-hot). Weights as castin_radius_quadratic.
Float64 only: scores reach R^2 ||A|| ~ settle / gap (up to ~1e6 on MiniLM's head) and the gaps that decide
the limit (down to ~1e-5 ||A||) are below float32's resolution there.
`masked`: the causally masked head (Thm 4.5): j*(i) = argmax over j <= i, the score gaps taken over j <= i (row 0
attends to itself only), and the same exact limit with the masked argmax.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List

import numpy as np
import torch

from harness.bounds.castin import large_radius_limit, score_gaps
from harness.kernels import layer as layer_ops
from harness.catalog import Context, experiment

from experiments.castin import common


def masked_score_gaps(X: torch.Tensor, w) -> torch.Tensor:
    """score_gaps under a causal mask: the smallest top-1 minus top-2 gap over rows i >= 1 of the scores <A_c x_i,
    x_j>, j <= i (row 0 has one candidate): (count, n, d) -> (count,)."""
    S = X @ w.A()[0] @ X.transpose(-1, -2)
    n = S.shape[-1]
    S = S.masked_fill(torch.ones(n, n, dtype=torch.bool, device=S.device).triu(1), float("-inf"))
    top = S[..., 1:, :].topk(2, dim=-1).values  # rows 1..n-1 have >= 2 candidates
    return (top[..., 0] - top[..., 1]).amin(-1)


@experiment
class CastinRadiusLarge(common.RadiusExperiment):
    """Castin Thm 3.7: ||Df(RX)|| / (||V|| sqrt n) on generic inputs vs R, against the exact limit."""

    name = "castin_radius_large"
    figures_ref = ["Castin et al. 2024, Thm 3.7 (large-radius limit) and Thm 4.5 (masked)"]
    dtypes = ("float64",)
    dtype_note = ("scores reach R^2 ||A|| ~ 1e6 while the score gaps that decide Thm 3.7's limit are ~1e-5 ||A||: "
                  "below float32 resolution")
    grid = [dict(g, masked=[False, True]) for g in common.radius_grid(points=40, n=16, count=8, settle=40.0)]
    quick = [dict(common.radius_grid(points=12, n=16, count=3, settle=40.0)[0], masked=[False, True])]
    test = [dict(common.radius_grid(points=6, n=6, count=2, settle=40.0)[0], masked=[False, True])]
    # --scale paper: Thms 3.7 and 4.5 are limits without a figure or sizes in the paper; the full grid is their check
    paper = grid
    paper_cost = 1

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per (R, sequence)."""
        w, label = common.head_weights(cell, ctx)
        n, count, settle = int(cell["n"]), int(cell["count"]), float(cell["settle"])
        g = torch.Generator().manual_seed(ctx.seed + 1)
        X0 = torch.randn(count, n, w.d, dtype=w.dtype, generator=g).to(w.device)
        X0 = X0 / X0.norm(dim=-1, keepdim=True)  # unit tokens: R is the radius
        masked = bool(cell.get("masked", False))
        vnorm = float(w.VO_norm()[0])
        limit = large_radius_limit(X0, w, causal=masked)[..., 0] / (vnorm * math.sqrt(n))  # (count,)
        gap = masked_score_gaps(X0, w) if masked else score_gaps(X0, w)  # (count,)
        a = float(w.A_norm()[0])
        r_max = max(300.0 / math.sqrt(a), math.sqrt(settle / float(gap.min())))
        rows = []
        for R in np.geomspace(0.5 / math.sqrt(a), r_max, int(cell["points"])):
            lip = layer_ops.lipschitz(float(R) * X0, w, masked, tol=1e-8, iters=600)
            for s in range(count):
                rows.append(dict(weights_label=label, R=float(R), seq=s, lipschitz=float(lip.value[s]),
                                 converged=bool(lip.converged[s]),
                                 ratio=float(lip.value[s]) / (vnorm * math.sqrt(n)), limit_ratio=float(limit[s]),
                                 score_gap=float(gap[s]), R2_gap=float(R) ** 2 * float(gap[s]), masked=masked))
        return rows

    def figures(self, table, outdir):
        from experiments.castin.figures.radius import radius_large_figure

        return radius_large_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.castin.figures.radius import radius_large_summary

        return radius_large_summary(table)
