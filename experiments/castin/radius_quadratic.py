"""Castin et al. App. C.7 (Fig. 3): the local Lipschitz constant of one head grows quadratically in the radius.

x_1 = 0 and the other n - 1 tokens at +-R v on a line (harness.bounds.castin.quadratic_example_input, built in
float64); ||Df_l(X)|| (Lanczos, ctx.dtype) grows like the empirical variance ~ R^2 (fitted log-log slope -> 2),
with the exact first-token lower bound (ctx.dtype) alongside. Weights: a seeded random single head (d = 8, std
2/sqrt(d)) and the head of largest gamma of a text model's layer (biases dropped: the statement is bias-free).
"""
from __future__ import annotations

from typing import Any, Dict, List

import numpy as np
import torch

from harness.bounds.castin import first_token_lower_bound, quadratic_example_input
from harness.kernels import layer as layer_ops
from harness.catalog import Context, experiment

from experiments.castin import common

@experiment
class CastinRadiusQuadratic(common.RadiusExperiment):
    """Castin App. C.7: ||Df_l(X)|| ~ R^2 on the line configuration, with the first-token lower bound."""

    name = "castin_radius_quadratic"
    figures_ref = ["Castin et al. 2024, App. C.7 / Fig. 3"]
    grid = common.radius_grid(points=40, n=16, r_min=0.1, r_max=30.0)
    quick = [common.radius_grid(points=12, n=16, r_min=0.1, r_max=30.0)[0]]
    test = [common.radius_grid(points=6, n=6, r_min=0.1, r_max=30.0)[0]]
    # --scale paper: App. C.7's Fig. 3 states no n, dimension or radius range (its text we have drops the formulas);
    # the full grid is the figure's setting here
    paper = grid
    paper_cost = 1

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per radius."""
        w64, label = common.head_weights(cell, ctx)
        dt, n = ctx.torch_dtype, int(cell["n"])
        Rs = np.geomspace(float(cell["r_min"]), float(cell["r_max"]), int(cell["points"]))
        X = torch.stack([quadratic_example_input(w64, 0, n, float(R)) for R in Rs]).to(dt)  # (P, n, d)
        w = w64.to(dt)
        lip = layer_ops.lipschitz(X, w, tol=1e-8 if dt == torch.float64 else 1e-4, iters=600)
        lb = first_token_lower_bound(X, w)[..., 0]
        return [dict(weights_label=label, R=float(R), lipschitz=float(lip.value[i]), lower_bound=float(lb[i]),
                     converged=bool(lip.converged[i])) for i, R in enumerate(Rs)]

    def figures(self, table, outdir):
        from experiments.castin.figures.radius import radius_quadratic_figure

        return radius_quadratic_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.castin.figures.radius import radius_quadratic_summary

        return radius_quadratic_summary(table)
