"""JaSMin (Yudin et al.) Fig. 1: the g_1 landscape.

g_1(x) = x_(1) (1 - x_(1) + x_(2)) over its domain x_(1) >= x_(2), x_(1) + x_(2) <= 1 (heatmap); max 1/2
at (1/2, 1/2), zero at the corners (1, 0) and (0, 0). Next to it, the exact ||J_sm(p)|| for n = 3 on the same
(x_(1), x_(2)) coordinates, p = (x_(1), x_(2), 1 - x_(1) - x_(2)) where that is sorted, and the gap g_1 - ||J_sm||.
Theorem 4's interlacing check is the sibling experiment jasmin_interlacing. Quantities: harness.kernels.softmax.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List

import numpy as np

from harness.catalog import Context, Experiment, experiment

@experiment
class JasminSoftmax(Experiment):
    """JaSMin Fig. 1: g_1 landscape over (x_(1), x_(2)), with the exact ||J_sm|| for n = 3 beside it."""

    name = "jasmin_softmax"
    figures_ref = ["JaSMin (Yudin et al.) Fig. 1"]
    grid = {"resolution": [201]}
    quick = {"resolution": [101]}
    test = {"resolution": [21]}
    ranges = {"resolution": ">=3"}  # grid points per axis: the simplex's corners and its midpoint (1/2, 1/2)
    # --scale paper: Fig. 1 draws g_1 on the simplex with no stated resolution; the full grid is its setting here
    paper = grid
    paper_cost = 1

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """g_1 on the grid x_(1), x_(2) in [0, 1] (domain x1 >= x2, x1 + x2 <= 1); exact ||J_sm|| for n = 3."""
        import torch

        from harness.kernels.softmax import g_k, jsm_norm

        R = int(cell["resolution"])  # >= 3: `ranges`, checked when the run is planned
        t = torch.linspace(0, 1, R, dtype=ctx.torch_dtype, device=ctx.torch_device)
        x1, x2 = torch.meshgrid(t, t, indexing="ij")
        eps = max(1e-12, 1e3 * torch.finfo(ctx.torch_dtype).eps)  # boundary ties survive rounding in this dtype
        dom = (x1 >= x2 - eps) & (x1 + x2 <= 1 + eps)
        x1, x2 = x1[dom], x2[dom]  # (M,)
        rest = (1 - x1 - x2).clamp_min(0)
        p3 = torch.stack([x1, x2, rest], -1)  # (M, 3) a probability vector with these two largest iff rest <= x2
        sorted3 = rest <= x2 + eps
        g1 = g_k(torch.stack([x1, x2, torch.zeros_like(x1)], -1), 1)  # g_1 depends on the top two only
        s1 = jsm_norm(p3)
        rows = []
        for a, b, g, s, ok in zip(x1.tolist(), x2.tolist(), g1.tolist(), s1.tolist(), sorted3.tolist()):
            rows.append({"x1": a, "x2": b, "g1": g, "jsm_norm_n3": s if ok else math.nan})
        return rows

    # ---------------------------------------------------------------------------------------------- outputs
    def figures(self, table, outdir):
        from harness import plotting

        return self._fig_landscape(table, outdir, plotting)

    def _fig_landscape(self, land, outdir, plotting):
        xs = np.unique(np.concatenate([land["x1"].to_numpy(), land["x2"].to_numpy()]))
        idx = {round(v, 9): i for i, v in enumerate(xs)}
        R = len(xs)
        grids = {k: np.full((R, R), np.nan) for k in ("g1", "jsm_norm_n3")}
        for x1, x2, g, s in land[["x1", "x2", "g1", "jsm_norm_n3"]].itertuples(index=False):
            i, j = idx[round(x1, 9)], idx[round(x2, 9)]
            grids["g1"][j, i], grids["jsm_norm_n3"][j, i] = g, s
        gap = grids["g1"] - grids["jsm_norm_n3"]
        fig, axes = plotting.figure(1, 3, width=10.2, height=3.1)
        ext = (xs[0], xs[-1], xs[0], xs[-1])
        panels = [(grids["g1"], r"(a) $g_1=x_{(1)}(1-x_{(1)}+x_{(2)})$", "viridis", (0, 0.5), r"$g_1(p)$"),
                  (grids["jsm_norm_n3"], r"(b) exact $\|J_{sm}(p)\|$, $n=3$", "viridis", (0, 0.5), r"$\|J_{sm}(p)\|$"),
                  (gap, r"(c) $g_1-\|J_{sm}\|$, $n=3$ ($\geq 0$)", "magma", None, r"$g_1-\|J_{sm}\|$")]
        for ax, (Z, title, cmap, lim, zlabel) in zip(axes, panels):
            im = ax.imshow(Z, origin="lower", extent=ext, cmap=cmap, aspect="equal",
                           vmin=None if lim is None else lim[0], vmax=None if lim is None else lim[1])
            ax.contour(np.linspace(xs[0], xs[-1], R), np.linspace(xs[0], xs[-1], R), Z, levels=6, colors="white",
                       linewidths=0.5, alpha=0.7)
            ax.set_xlabel(r"$x_{(1)}$")
            ax.set_ylabel(r"$x_{(2)}$")
            ax.grid(False)
            plotting.caption(ax, title)
            fig.colorbar(im, ax=ax, shrink=0.85, label=zlabel)
        axes[0].plot([0.5], [0.5], marker="*", color="red", markersize=9, linestyle="none", label="max 1/2")
        return plotting.finish(fig, outdir, "g1_landscape", self.figures_ref[0], "The g_1 bound and the exact softmax "
                               "Jacobian norm over the two largest probabilities", note="x_(1) >= x_(2): the two "
                               "largest entries of p; for n = 3 the third is 1 - x_(1) - x_(2).")

    def summary(self, table) -> str:
        best = table.loc[table["g1"].idxmax()]
        gap = (table["g1"] - table["jsm_norm_n3"]).dropna()
        ok = abs(best["g1"] - 0.5) < 1e-9 and abs(best["x1"] - 0.5) < 1e-9 and gap.min() > -1e-12
        return "\n".join([
            f"- Fig. 1: max g_1 on the grid = {best['g1']:.6f} at (x_(1), x_(2)) = ({best['x1']:.3f}, "
            f"{best['x2']:.3f}) (paper: 1/2 at (1/2, 1/2)); g_1 - ||J_sm|| (n=3) ranges "
            f"[{gap.min():.2e}, {gap.max():.3f}], never negative beyond {1e-12:g}.",
            "- Differs from the paper: Fig. 1 is only drawn there; here we add the exact ||J_sm|| for n = 3.",
            "",
            f"Verdict (Fig. 1: g_1 peaks at 1/2 at (1/2, 1/2) and stays above ||J_sm||): "
            f"**{'reproduced' if ok else 'not reproduced'}**: "
            f"max g_1 {best['g1']:.6f} at ({best['x1']:.3f}, {best['x2']:.3f}), g_1 - ||J_sm|| >= {gap.min():.1e}."])
