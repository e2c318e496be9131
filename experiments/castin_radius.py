"""Castin et al.: growth of the local Lipschitz constant with the token radius R (MATH.md §3), three parts.

- `quadratic` (App. C.7, Fig. 3): x_1 = 0 and the other tokens at +-R v on a line; ||Df_l(X)|| grows like the
  empirical variance ~ R^2 (fitted log-log slope -> 2), with the exact first-token lower bound alongside.
- `large_radius` (Thm 3.7): generic unit-norm inputs X scaled by R, up to where R^2 x (smallest top-2 score gap)
  = 40 for every sequence; ||Df_l(RX)|| / (||V|| sqrt(n)) tends to Thm 3.7's limit sqrt(max_j #{i : j*(i) = j} / n)
  <= 1 (attention rows become one-hot).
- `edge` (Prop. 3.6): weighted self-attention on two Diracs with masses (p, 1-p), (1-p)/p = 3 e^{gamma R^2};
  ||Df^w||_w grows like gamma R^2 e^{gamma R^2 / 2}, against the mean-field bound of Thm 3.5 (log scale).
Weights: a seeded random single head (d = 8, std scale/sqrt(d)) and the MiniLM head of largest gamma
(last layer, biases dropped as the propositions are stated bias-free).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List

import numpy as np
import torch

from harness.bounds.castin import prop34_choice
from harness.kernels import layer as L
from harness.registry import Context, Experiment, experiment

from . import _castin_common as C

Tensor = torch.Tensor


def head_weights(source: str, seed: int):
    """(single-head bias-free AttentionWeights, label): 'random' (d = 8) or '<model>:<layer>' (max-gamma head)."""
    from harness.kernels.attention import AttentionWeights

    if source == "random":
        g = torch.Generator().manual_seed(seed)
        return AttentionWeights.random(8, 1, scale=2.0, generator=g), "random d=8"
    name, layer = source.split(":")
    pre = False if name.startswith("tiny") else None
    w = C.no_bias(C.weights(name, int(layer), pre, seed))
    ch = prop34_choice(w)
    gam = [(-1.0 if c is None else float(c["gamma"])) for c in ch]
    l = int(np.argmax(gam))
    return w.head(l), f"{name} L{layer} head {l}"


@experiment
class CastinRadius(Experiment):
    """Castin App. C.7 (quadratic in R), Thm 3.7 (large-radius limit), Prop. 3.6 vs Thm 3.5 (edge regime)."""

    name = "castin_radius"
    figures_ref = ["Castin et al. 2024, App. C.7 / Fig. 3", "Castin et al. Thm 3.7", "Castin et al. Prop. 3.6 vs Thm 3.5"]
    VERSION = "2"
    grid = {"part": ["quadratic", "large_radius", "edge"], "weights": ["random", "minilm:-1"], "points": [40],
            "n": [16], "count": [8]}
    quick = {"weights": ["random"], "points": [12], "count": [3]}
    test = {"weights": ["random"], "points": [6], "n": [6], "count": [2]}

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        w, label = head_weights(cell["weights"], ctx.seed)
        part = cell["part"]
        if part == "quadratic":
            return quadratic_rows(w, label, int(cell["n"]), int(cell["points"]))
        if part == "large_radius":
            return large_radius_rows(w, label, int(cell["n"]), int(cell["points"]), int(cell["count"]), ctx.seed)
        if part == "edge":
            return edge_rows(w, label, int(cell["points"]))
        raise ValueError(f"unknown part {part!r}: use quadratic, large_radius or edge")

    def figures(self, table, outdir):
        from harness import plotting

        parts = [p for p in ("quadratic", "large_radius", "edge") if p in set(table["part"])]
        labels = list(dict.fromkeys(table["weights_label"]))
        fig, axes = plotting.figure(len(labels), len(parts), squeeze=False)
        for i, lab in enumerate(labels):
            for j, part in enumerate(parts):
                ax = axes[i, j]
                g = table[(table["part"] == part) & (table["weights_label"] == lab)]
                if part == "quadratic":
                    plotting.loglog(ax, g["R"], g["lipschitz"], "||Df_l(X)||", key="lipschitz", markersize=2)
                    plotting.loglog(ax, g["R"], g["lower_bound"], "first-token LB", key="lower", linestyle=":",
                                    marker=None)
                    plotting.slope_guide(ax, g["R"], 2.0, (g["R"].iloc[-1], g["lipschitz"].iloc[-1]))
                    f = C.loglog_fit(g["R"][g["R"] >= g["R"].median()], g["lipschitz"][g["R"] >= g["R"].median()])
                    plotting.caption(ax, f"App C.7, {lab}\nslope (upper half of R) {f['slope']:.2f}")
                elif part == "large_radius":
                    for s, gs in g.groupby("seq"):
                        ax.loglog(gs["R"], gs["ratio"], color=plotting.color("lipschitz"), alpha=0.6, lw=0.8)
                        ax.axhline(gs["limit_ratio"].iloc[0], color=plotting.color("castin"), ls=":", lw=0.8)
                    ax.axhline(1.0, color="#888888", ls="--", lw=0.8)
                    ax.set_ylabel("||Df(RX)|| / (||V|| sqrt n)")
                    plotting.caption(ax, f"Thm 3.7, {lab}\ndotted: exact limits, dashed: 1")
                else:
                    plotting.semilogy(ax, g["gamma_R2"], g["lipschitz"], "||Df^w||_w (two Diracs)", key="lipschitz",
                                      markersize=2)
                    plotting.semilogy(ax, g["gamma_R2"], g["asymptotic_lb"], "Prop 3.6 asymptote", key="lower",
                                      linestyle=":", marker=None)
                    plotting.semilogy(ax, g["gamma_R2"], g["meanfield_bound"], "Thm 3.5 bound", key="castin",
                                      linestyle="--", marker=None)
                    ax.set_xlabel("gamma R^2")
                    plotting.caption(ax, f"Prop 3.6 edge regime, {lab}")
                if part != "edge":
                    ax.set_xlabel("R")
        for ax in axes[0]:
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=6)
        return plotting.save(fig, outdir, "castin_radius")

    def summary(self, table) -> str:
        out = []
        for lab, g in table.groupby("weights_label", sort=False):
            q = g[g["part"] == "quadratic"]
            if len(q):
                up = q[q["R"] >= q["R"].median()]
                f = C.loglog_fit(up["R"], up["lipschitz"])
                out.append(f"- App. C.7 ({lab}): log-log slope of ||Df|| vs R over the upper half of R = "
                           f"{C.fmt_fit(f)} (paper: quadratic, 2); min ||Df|| / first-token LB = "
                           f"{(q['lipschitz'] / q['lower_bound']).min():.4f} (>= 1 expected).")
            lr = g[g["part"] == "large_radius"]
            if len(lr):
                top = lr[lr["R"] == lr["R"].max()]
                err = (top["ratio"] - top["limit_ratio"]).abs()
                settled = lr[lr["R2_gap"] >= 20] if "R2_gap" in lr else lr.iloc[:0]
                out.append(f"- Thm 3.7 ({lab}): at R = {top['R'].iloc[0]:.3g}, ||Df(RX)|| / (||V|| sqrt n) = "
                           f"{top['ratio'].min():.3f}-{top['ratio'].max():.3f} vs exact limits "
                           f"{top['limit_ratio'].min():.3f}-{top['limit_ratio'].max():.3f} "
                           f"(max |ratio - limit| {err.max():.2e}; {int((err <= 1e-6).sum())} of {len(top)} "
                           f"sequences within 1e-6); max ratio over all R {lr['ratio'].max():.3f} (Thm 3.7: "
                           f"<= eps(R) -> 1)" + (f"; once R^2 x score gap >= 20: max |ratio - limit| "
                           f"{(settled['ratio'] - settled['limit_ratio']).abs().max():.2e}" if len(settled) else "")
                           + ".")
            e = g[g["part"] == "edge"]
            if len(e):
                big = e[e["gamma_R2"] == e["gamma_R2"].max()]
                f = np.polyfit(e["gamma_R2"], np.log(e["lipschitz"]), 1)[0]
                out.append(f"- Prop. 3.6 ({lab}): log ||Df^w||_w grows with slope {f:.3f} in gamma R^2 (theory 1/2 "
                           f"plus log factor); at gamma R^2 = {big['gamma_R2'].iloc[0]:.3g}: ||Df^w||_w = "
                           f"{big['lipschitz'].iloc[0]:.3g}, Prop. 3.6 asymptote {big['asymptotic_lb'].iloc[0]:.3g} "
                           f"(ratio {(big['lipschitz'] / big['asymptotic_lb']).iloc[0]:.3f}), Thm 3.5 bound "
                           f"{big['meanfield_bound'].iloc[0]:.3g}; bound >= value everywhere: "
                           f"{bool((e['meanfield_bound'] >= e['lipschitz']).all())}.")
        out.append("""
**Versus the paper.** App. C.7 and Prop. 3.6 are reproduced as stated (quadratic growth; exponential
growth in gamma R^2 of the two-Dirac weighted constant, inside Thm 3.5's exp(2||A||R^2) envelope).
Thm 3.7's eps(R) -> 1 is an upper-bound statement: on generic inputs the ratio converges to the exact limit
sqrt(max_j #{i : j*(i) = j} / n), which equals 1 only when one token grasps every row's attention. How
fast depends on the smallest top-1 minus top-2 score gap of the unit-radius input: a row leaves the softmax
transition once R^2 x gap >> 1, and before that the ratio can exceed the limit by orders of magnitude (on
MiniLM's head, random unit tokens in d = 384 have gaps down to ~1e-5 ||A||). R therefore runs per cell
until R^2 x gap = 40 for every sequence.
Prop. 3.6 is asymptotic (R -> inf), so the ratio to its asymptote tends to 1 rather than staying >= 1.
""")
        return "\n".join(out)


def _single_lip(X, w):
    """||Df_l(X)|| for bias-free single-head w on X (B, n, d), float64 Lanczos."""
    return L.lipschitz(X, w, tol=1e-8, iters=600).value


def quadratic_rows(w, label, n, points):
    from harness.bounds.castin import first_token_lower_bound, quadratic_example_input

    Rs = np.geomspace(0.1, 30.0, points)
    X = torch.stack([quadratic_example_input(w, 0, n, float(R)) for R in Rs])  # (P, n, d)
    lip = _single_lip(X, w)
    lb = first_token_lower_bound(X, w)[..., 0]
    return [dict(part="quadratic", weights_label=label, R=float(R), n=n, lipschitz=float(lip[i]),
                 lower_bound=float(lb[i])) for i, R in enumerate(Rs)]


def score_gaps(X0: Tensor, w) -> Tensor:
    """Smallest top-1 minus top-2 score gap over the rows of X0 A X0^T (head 0): (B, n, d) -> (B,).

    At radius R the rows leave the softmax transition once R^2 x gap >> 1: Thm 3.7's limit is reached there."""
    S = X0 @ w.A()[0] @ X0.transpose(-1, -2)  # (B, n, n)
    top = S.topk(2, dim=-1).values  # (B, n, 2)
    return (top[..., 0] - top[..., 1]).amin(-1)


def large_radius_rows(w, label, n, points, count, seed, settle: float = 40.0):
    """||Df(RX)|| / (||V|| sqrt n) on generic unit-token X over R up to where R^2 x (smallest score gap) = settle
    for every sequence (at least R sqrt(||A||) = 300), against Thm 3.7's exact limit."""
    from harness.bounds.castin import large_radius_limit

    g = torch.Generator().manual_seed(seed + 1)
    X0 = torch.randn(count, n, w.d, dtype=w.dtype, generator=g)
    X0 = X0 / X0.norm(dim=-1, keepdim=True)  # unit tokens: R is the radius
    vnorm = float(w.VO_norm()[0])
    limit = large_radius_limit(X0, w)[..., 0] / (vnorm * math.sqrt(n))  # (count,)
    gap = score_gaps(X0, w)  # (count,)
    a = float(w.A_norm()[0])
    r_max = max(300.0 / math.sqrt(a), math.sqrt(settle / float(gap.min())))
    rows = []
    for R in np.geomspace(0.5 / math.sqrt(a), r_max, points):  # scores up to R^2 ||A||, exact in float64
        lip = _single_lip(float(R) * X0, w)
        for s in range(count):
            rows.append(dict(part="large_radius", weights_label=label, R=float(R), n=n, seq=s,
                             lipschitz=float(lip[s]), ratio=float(lip[s]) / (vnorm * math.sqrt(n)),
                             limit_ratio=float(limit[s]), score_gap=float(gap[s]),
                             R2_gap=float(R) ** 2 * float(gap[s])))
    return rows


def edge_rows(w, label, points):
    from harness.bounds.castin import (edge_regime_input, edge_regime_lower_bound, meanfield_bound,
                                       weighted_dense_jacobian)

    gam = float(prop34_choice(w)[0]["gamma"])
    rows = []
    for gr2 in np.linspace(0.5, 40.0, points):
        R = math.sqrt(gr2 / gam)
        X, m = edge_regime_input(w, 0, R)  # (2, d): (Ru, Ru/2) or (-Ru, Ru); masses (p, 1-p), (1-p)/p = 3e^{gR^2}
        p = float(m[0])
        J = weighted_dense_jacobian(X, m, w.A()[0], w.VO()[0])  # (2d, 2d): exact, W^{1/2} J W^{-1/2}
        lip = float(torch.linalg.matrix_norm(J, ord=2))
        asym = float(edge_regime_lower_bound(w, R)[0])  # Prop. 3.6: (3 sqrt 3 / 16) ||V^T u|| gR^2 e^{gR^2/2}
        rows.append(dict(part="edge", weights_label=label, R=R, gamma=gam, gamma_R2=float(gr2), p=p,
                         lipschitz=lip, asymptotic_lb=asym, meanfield_bound=float(meanfield_bound(w, R)[0])))
    return rows
