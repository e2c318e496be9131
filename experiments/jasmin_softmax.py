"""JaSMin (Yudin et al.) Fig. 1 and Theorem 4: the g_1 landscape and the interlacing of J_sm's singular values.

Fig. 1: g_1(x) = x_(1) (1 - x_(1) + x_(2)) over its domain x_(1) >= x_(2), x_(1) + x_(2) <= 1 (heatmap); max 1/2
at (1/2, 1/2), zero at the corners (1, 0) and (0, 0). Next to it, the exact ||J_sm(p)|| for n = 3 on the same
(x_(1), x_(2)) coordinates, p = (x_(1), x_(2), 1 - x_(1) - x_(2)) where that is sorted, and the gap g_1 - ||J_sm||.
Theorem 4: p_(1) >= g_1 >= s_1 >= p_(2) >= g_2 >= s_2 >= ... >= s_n = 0 (MATH.md §2), checked on random
probability vectors p = softmax(z / T), z ~ N(0, I_n), for several n and temperatures T, plus edge cases
(uniform, one-hot, ties). Quantities come from harness.kernels.softmax (g_k, jsm_singular_values, jsm_norm).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List

import numpy as np

from harness.registry import Context, Experiment, experiment

TOL = 1e-12  # float64 eigvalsh error on entries <= 1 is ~1e-16; ties make some links equalities


def _edge_cases(n: int, dtype, device):
    """Deterministic vectors where links of the chain are equalities: uniform, one-hot, (1/2,1/2,0..), ties."""
    import torch

    kw = {"dtype": dtype, "device": device}
    onehot = torch.zeros(n, **kw)
    onehot[0] = 1
    half = torch.zeros(n, **kw)
    half[:2] = 0.5
    cases = [torch.full((n,), 1.0 / n, **kw), onehot, half]
    if n >= 3:
        cases.append(torch.tensor([0.3, 0.3] + [0.4 / (n - 2)] * (n - 2), **kw))
    return torch.stack(cases)  # (E, n)


def interlacing_gaps(p):
    """The three links of Thm 4 per k: (p_(k) - g_k, g_k - s_k, s_k - p_(k+1)), each (S, n); plus s_n (S,)."""
    import torch

    from harness.kernels.softmax import g_k, jsm_singular_values, sorted_desc

    n = p.shape[-1]
    ps = sorted_desc(p)  # (S, n)
    nxt = torch.cat([ps[..., 1:], torch.zeros_like(ps[..., :1])], -1)  # p_(k+1), p_(n+1) = 0
    g = torch.stack([g_k(p, k) for k in range(1, n + 1)], -1)  # (S, n)
    s = jsm_singular_values(p)  # (S, n) descending
    return ps - g, g - s, s - nxt, s[..., -1]


@experiment
class JasminSoftmax(Experiment):
    """JaSMin Fig. 1 (g_1 landscape over (x_(1), x_(2))) and Theorem 4's interlacing on random probability vectors."""

    name = "jasmin_softmax"
    figures_ref = ["JaSMin (Yudin et al.) Fig. 1", "JaSMin Theorem 4 / Corollary 1 (numerical check)"]
    VERSION = None
    grid = [
        {"part": ["landscape"], "resolution": [201]},
        {"part": ["interlacing"], "n": [2, 3, 5, 10, 30, 100], "temperature": [0.1, 1.0, 10.0],
         "samples": [4000]},
    ]
    quick = {"resolution": [101], "samples": [1000]}
    test = {"resolution": [21], "n": [2, 5], "temperature": [1.0], "samples": [50]}

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        if cell["part"] == "landscape":
            return self._landscape(int(cell["resolution"]), ctx)
        if cell["part"] == "interlacing":
            return self._interlacing(int(cell["n"]), float(cell["temperature"]), int(cell["samples"]), ctx)
        raise ValueError(f"unknown part {cell['part']!r}: use landscape or interlacing")

    # ---------------------------------------------------------------------------------------------- Fig. 1
    def _landscape(self, R: int, ctx: Context) -> List[Dict[str, Any]]:
        """g_1 on the grid x_(1), x_(2) in [0, 1] (domain x1 >= x2, x1 + x2 <= 1); exact ||J_sm|| for n = 3."""
        import torch

        from harness.kernels.softmax import g_k, jsm_norm

        if R < 3:
            raise ValueError(f"resolution must be >= 3, got {R}")
        t = torch.linspace(0, 1, R, dtype=ctx.torch_dtype, device=ctx.torch_device)
        x1, x2 = torch.meshgrid(t, t, indexing="ij")
        eps = 1e-12
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

    # ---------------------------------------------------------------------------------------------- Thm 4
    def _interlacing(self, n: int, T: float, S: int, ctx: Context) -> List[Dict[str, Any]]:
        import torch

        from harness.kernels.softmax import g_k, jsm_norm

        if n < 2 or S < 1 or not T > 0:
            raise ValueError(f"need n >= 2, samples >= 1, temperature > 0; got n={n}, samples={S}, T={T}")
        gen = ctx.generator(offset=1000 * n + int(round(1000 * T)))
        z = torch.randn(S, n, generator=gen, dtype=ctx.torch_dtype, device=ctx.torch_device)
        p = torch.softmax(z / T, dim=-1)  # (S, n)
        p = torch.cat([p, _edge_cases(n, ctx.torch_dtype, ctx.torch_device)], 0)  # (S + E, n)
        chunks = [interlacing_gaps(c) for c in torch.split(p, max(1, 2_000_000 // (n * n)), 0)]
        a, b, c, sn = (torch.cat([ch[i] for ch in chunks], 0) for i in range(4))  # (S+E, n) x3, (S+E,)
        links = torch.stack([a, b, c], -1)  # (S+E, n, 3)
        worst = links.amin(dim=(-1, -2))  # (S+E,) most negative link per vector
        holds = (worst >= -TOL) & (sn.abs() <= TOL)
        g1 = g_k(p, 1)
        s1 = jsm_norm(p)
        ratio = g1 / s1.clamp_min(1e-300)
        return [{
            "n": n, "temperature": T, "vectors": int(p.shape[0]),
            "frac_holds": holds.double().mean().item(),
            "frac_holds_exact": (worst >= 0).double().mean().item(),
            "worst_violation": (-worst).clamp_min(0).max().item(),
            "min_gap_p_g": a.min().item(), "min_gap_g_s": b.min().item(), "min_gap_s_pnext": c.min().item(),
            "max_abs_s_n": sn.abs().max().item(),
            "max_g1": g1.max().item(), "max_s1": s1.max().item(),
            "mean_g1_over_s1": ratio[s1 > 1e-9].mean().item() if bool((s1 > 1e-9).any()) else math.nan,
            "max_g1_over_s1": ratio[s1 > 1e-9].max().item() if bool((s1 > 1e-9).any()) else math.nan,
            "mean_p1": p.max(-1).values.mean().item(),
        }]

    # ---------------------------------------------------------------------------------------------- outputs
    def figures(self, table, outdir):
        from harness import plotting

        paths = []
        land = table[table["part"] == "landscape"]
        if len(land):
            paths += self._fig_landscape(land, outdir, plotting)
        inter = table[table["part"] == "interlacing"]
        if len(inter):
            paths += self._fig_interlacing(inter, outdir, plotting)
        return paths

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
        panels = [(grids["g1"], r"(a) $g_1=x_{(1)}(1-x_{(1)}+x_{(2)})$", "viridis", (0, 0.5)),
                  (grids["jsm_norm_n3"], r"(b) exact $\|J_{sm}(p)\|$, $n=3$", "viridis", (0, 0.5)),
                  (gap, r"(c) $g_1-\|J_{sm}\|$, $n=3$ ($\geq 0$)", "magma", None)]
        for ax, (Z, title, cmap, lim) in zip(axes, panels):
            im = ax.imshow(Z, origin="lower", extent=ext, cmap=cmap, aspect="equal",
                           vmin=None if lim is None else lim[0], vmax=None if lim is None else lim[1])
            ax.contour(np.linspace(xs[0], xs[-1], R), np.linspace(xs[0], xs[-1], R), Z, levels=6, colors="white",
                       linewidths=0.5, alpha=0.7)
            ax.set_xlabel(r"$x_{(1)}$")
            ax.set_ylabel(r"$x_{(2)}$")
            ax.grid(False)
            plotting.caption(ax, title)
            fig.colorbar(im, ax=ax, shrink=0.85)
        axes[0].plot([0.5], [0.5], marker="*", color="red", markersize=9, linestyle="none", label="max 1/2")
        axes[0].legend(loc="upper left")
        return plotting.save(fig, outdir, "g1_landscape")

    def _fig_interlacing(self, inter, outdir, plotting):
        fig, axes = plotting.figure(1, 3, width=10.2, height=2.9)
        for T, sub in inter.groupby("temperature"):
            sub = sub.sort_values("n")
            axes[0].plot(sub["n"], sub["mean_g1_over_s1"], marker="o", label=f"T={T:g}")
            axes[1].plot(sub["n"], sub["frac_holds"], marker="o", label=f"T={T:g}")
            axes[2].plot(sub["n"], sub["worst_violation"].clip(lower=1e-18), marker="o", label=f"T={T:g}")
        ns = sorted(inter["n"].unique())
        for ax in axes:
            ax.set_xscale("log")
            ax.set_xticks(ns)
            ax.set_xticklabels([str(int(v)) for v in ns])
            ax.minorticks_off()
            ax.set_xlabel("n")
        axes[0].axhline(1, color="gray", lw=0.8, ls="--")
        axes[0].set_ylabel(r"mean $g_1/\|J_{sm}\|$")
        plotting.caption(axes[0], r"(a) tightness of $g_1 \geq s_1$")
        axes[1].set_ylim(-0.05, 1.05)
        axes[1].set_ylabel("fraction where Thm 4 holds")
        plotting.caption(axes[1], f"(b) interlacing chain (tol {TOL:g})")
        axes[2].set_yscale("log")
        axes[2].axhline(TOL, color="gray", lw=0.8, ls="--", label="tol")
        axes[2].set_ylabel("worst violation (floored 1e-18)")
        plotting.caption(axes[2], "(c) largest negative link (float64)")
        axes[0].legend()
        plotting.footnote(fig, "p = softmax(z/T), z ~ N(0, I_n), plus uniform / one-hot / (1/2,1/2,0,..) / tied "
                               "edge cases per cell; s_k by dense eigvalsh.")
        return plotting.save(fig, outdir, "interlacing")

    def summary(self, table) -> str:
        land = table[table["part"] == "landscape"]
        inter = table[table["part"] == "interlacing"]
        out = []
        if len(land):
            best = land.loc[land["g1"].idxmax()]
            gap = (land["g1"] - land["jsm_norm_n3"]).dropna()
            out.append(f"- Fig. 1: max g_1 on the grid = {best['g1']:.6f} at (x_(1), x_(2)) = ({best['x1']:.3f}, "
                       f"{best['x2']:.3f}) (paper: 1/2 at (1/2, 1/2)); g_1 - ||J_sm|| (n=3) ranges "
                       f"[{gap.min():.2e}, {gap.max():.3f}], never negative beyond {1e-12:g}.")
        if len(inter):
            tot = int(inter["vectors"].sum())
            held = float((inter["frac_holds"] * inter["vectors"]).sum() / max(tot, 1))
            out.append(f"- Theorem 4: chain holds (tol {TOL:g}) for {held:.4%} of {tot} vectors over {len(inter)} "
                       f"(n, T) cells; worst violation {inter['worst_violation'].max():.1e}; min gaps "
                       f"p-g {inter['min_gap_p_g'].min():.1e}, g-s {inter['min_gap_g_s'].min():.1e}, "
                       f"s-p_next {inter['min_gap_s_pnext'].min():.1e} (ties make them 0, rounding slightly negative); "
                       f"exact (tol 0) {float((inter['frac_holds_exact'] * inter['samples']).sum() / max(tot, 1)):.4%}.")
            out.append(f"- Cor. 1: max g_1 = {inter['max_g1'].max():.6f} <= 1/2; g_1/||J_sm|| is "
                       f"{inter['mean_g1_over_s1'].min():.3f}-{inter['mean_g1_over_s1'].max():.3f} on average per "
                       f"cell (max {inter['max_g1_over_s1'].max():.3f}).")
        out.append("- Differs from the paper: Fig. 1 is only drawn there; here we add the exact ||J_sm|| for n = 3 "
                   "and check Theorem 4 numerically (float64, dense eigvalsh) on softmax-of-Gaussian vectors at "
                   "several temperatures plus equality edge cases.")
        return "\n".join(out)
