"""Castin et al. arXiv v1 §4.2 / Fig. 2 (mass splitting): where duplicating a token and moving the copies apart
changes the output of self-attention more than moving the token.

Setting (docs/math.md §3): d = 1, A = -2, V = 1, two atoms at x1, x2 with masses (p, 1-p), p = a / (a + b).
Two independent routes on the same (x1, x2) grid:
- *weighted criterion*: unsplit = ||Df^w(X)||_w (weighted self-attention, Def. C.4), cov = max_i |V Cov_i A|,
  split = max(unsplit, cov); splitting pays where cov > unsplit (harness.bounds.mass_splitting).
- *explicit duplication*: ordinary self-attention (harness.kernels.layer) on n = 2(a + b) tokens, x1 repeated 2a
  times and x2 2b times; its dense Jacobian J (n x n, built column by column from the layer operator). Moving each
  group of copies together is the unsplit move: unsplit = ||J Q|| with Q the orthonormal group-constant basis;
  split = ||J|| (copies free to move apart).
The two must agree (tested). Computed in ctx.dtype on ctx.device. The worked example X = (-3, -0.3), p = 1/2: unsplit 1.382, duplicated 2.011.
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch

from harness.bounds.mass_splitting import explicit_duplication, mass_splitting_map
from harness.catalog import Context, Experiment, experiment

A_SCORE, V_VALUE = -2.0, 1.0
EXAMPLE = {"x1": -3.0, "x2": -0.3}


@experiment
class MassSplitting(Experiment):
    """Castin arXiv v1 §4.2: 1-D phase map of mass splitting, weighted criterion vs explicit duplication."""

    name = "mass_splitting"
    figures_ref = ["Castin et al., arXiv v1 §4.2 / Fig. 2 (mass splitting phase map; in the ICML 2024 text §4.2 is "
                   "masked attention and Fig. 2 the gamma R^2 plot)", "docs/math.md §3 worked example"]
    grid = {"a": [1, 1, 1, 2], "b": [1, 2, 4, 1], "resolution": [161], "extent": [4.0]}
    paired = [("a", "b")]  # masses p = a / (a + b)
    quick = {"a": [1, 1, 1], "b": [1, 2, 4], "resolution": [81]}
    test = {"a": [1, 1], "b": [1, 2], "resolution": [9]}
    ranges = {"resolution": ">=2"}  # grid points per axis of the phase map: both ends of [-extent, extent]
    # --scale paper: arXiv v1 Fig. 2 is a phase map of the two-mass configuration with no stated resolution; the
    # full grid (161 x 161, masses 1/2 .. 4/5) is its setting here
    paper = grid
    paper_cost = 1

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per grid point (x1, x2), plus the worked example (-3, -0.3) as the last row."""
        a, b = int(cell["a"]), int(cell["b"])
        if a < 1 or b < 1:
            raise ValueError(f"a and b must be positive integers, got a={a}, b={b}")
        p = a / (a + b)
        res, ext = int(cell["resolution"]), float(cell["extent"])
        kw = dict(dtype=ctx.torch_dtype, device=ctx.torch_device)
        xs = torch.linspace(-ext, ext, res, **kw)
        x1, x2 = torch.meshgrid(xs, xs, indexing="ij")
        x1 = torch.cat([x1.reshape(-1), torch.tensor([EXAMPLE["x1"]], **kw)])
        x2 = torch.cat([x2.reshape(-1), torch.tensor([EXAMPLE["x2"]], **kw)])
        wm = mass_splitting_map(x1, x2, p, A=A_SCORE, V=V_VALUE, **kw)
        ex = explicit_duplication(x1, x2, a, b, A=A_SCORE, V=V_VALUE)
        wm, ex = ({k: v.tolist() for k, v in d.items()} for d in (wm, ex))
        xs1, xs2 = x1.tolist(), x2.tolist()
        rows = []
        for i in range(len(xs1)):
            unsplit_w, split_w = wm["unsplit"][i], wm["split"][i]
            unsplit_e, split_e = ex["unsplit"][i], ex["split"][i]
            rows.append(dict(x1=xs1[i], x2=xs2[i], p=p, a=a, b=b, example=i == len(xs1) - 1,
                             unsplit_weighted=unsplit_w, cov=wm["cov"][i], split_weighted=split_w,
                             splits_weighted=bool(wm["splits"][i]), unsplit_explicit=unsplit_e,
                             split_explicit=split_e, splits_explicit=bool(split_e > unsplit_e * (1 + 1e-9)),
                             gain=split_w / unsplit_w))
        return rows

    def figures(self, table, outdir):
        from experiments.castin.figures.radius import mass_splitting_figure

        return mass_splitting_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.castin.figures.radius import mass_splitting_summary

        return mass_splitting_summary(table)
