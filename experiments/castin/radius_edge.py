"""Castin et al. Prop. 3.6 vs Thm 3.5: the edge regime of weighted self-attention on two Diracs.

Masses (p, 1-p) with (1-p)/p = 3 e^{gamma R^2} at (Ru, Ru/2) or (-Ru, Ru) (harness.bounds.castin.
edge_regime_input); ||Df^w||_w (exact: 2d x 2d weighted Jacobian, ctx.dtype) grows like gamma R^2 e^{gamma R^2/2},
against Prop. 3.6's asymptote and the mean-field bound of Thm 3.5 (log scale). gamma R^2 runs over
[gr2_min, gr2_max]. Weights as castin_radius_quadratic; gamma from the float64 eigenproblem.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List

import numpy as np
import torch

from harness.bounds.castin import (edge_regime_input, edge_regime_lower_bound, meanfield_bound, prop34_choice,
                                   weighted_dense_jacobian)
from harness.catalog import Context, experiment

from experiments.castin import common


@experiment
class CastinRadiusEdge(common.RadiusExperiment):
    """Castin Prop. 3.6 vs Thm 3.5: two-Dirac weighted constant vs gamma R^2, asymptote and mean-field bound."""

    name = "castin_radius_edge"
    figures_ref = ["Castin et al. 2024, Prop. 3.6 vs Thm 3.5 (edge regime)"]
    grid = common.radius_grid(points=40, gr2_min=0.5, gr2_max=40.0)
    quick = [common.radius_grid(points=12, gr2_min=0.5, gr2_max=40.0)[0]]
    test = [common.radius_grid(points=6, gr2_min=0.5, gr2_max=40.0)[0]]
    # --scale paper: Prop. 3.6 and Thm 3.5 are statements without a figure or sizes in the paper; the full grid is
    # their check at this resolution, so the paper scale is the full grid
    paper = grid
    paper_cost = 1

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per gamma R^2."""
        w64, label = common.head_weights(cell, ctx)
        dt = ctx.torch_dtype
        gam = float(prop34_choice(w64)[0]["gamma"])
        A, V = w64.A()[0].to(dt), w64.VO()[0].to(dt)
        rows = []
        for gr2 in np.linspace(float(cell["gr2_min"]), float(cell["gr2_max"]), int(cell["points"])):
            R = math.sqrt(gr2 / gam)
            X, m = edge_regime_input(w64, 0, R)  # (2, d), masses (p, 1-p): (1-p)/p = 3e^{gR^2}, float64
            J = weighted_dense_jacobian(X.to(dt), m.to(dt), A, V)  # (2d, 2d): exact, W^{1/2} J W^{-1/2}
            rows.append(dict(weights_label=label, R=R, gamma=gam, gamma_R2=float(gr2), p=float(m[0]),
                             lipschitz=float(torch.linalg.matrix_norm(J, ord=2)),
                             asymptotic_lb=float(edge_regime_lower_bound(w64, R)[0]),
                             meanfield_bound=float(meanfield_bound(w64, R)[0]), certificate_dtype="float64"))
        return rows

    def figures(self, table, outdir):
        from experiments.castin.figures.radius import radius_edge_figure

        return radius_edge_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.castin.figures.radius import radius_edge_summary

        return radius_edge_summary(table)
