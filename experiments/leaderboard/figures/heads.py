"""Heads whose attention does not depend on the input, found from the bound_leaderboard table alone (presentation:
imported only inside figures()/summary()).

If a head's score matrix A_l = W_Q W_K^T / sqrt(d_h) (bias-augmented, as in Castin's Thm 3.3) is ~0, its softmax is
uniform (P = 11^T / n) for every input, the head is the linear map X -> P X VO_l and its true local Lipschitz
constant is ||P|| ||VO_l|| = ||VO_l||, the same for every input. Every bound with a separate ||VO||-only term then
equals the truth (ratio 1). Two numbers of the table show it per (model, layer, head):

- `spread`: max / min - 1 of the truth over the inputs (0 for an input-independent Jacobian);
- `ar2`: an upper bound on ||A_l|| R^2 implied by Castin's Thm 3.3 value, sqrt(3) ||VO_l|| (||A_l||^2 R^4 (4n+1)
  + n)^(1/2): with truth = ||VO_l|| <= ||VO_l||_aug (constant attention), q = castin / (truth sqrt(3n)) >= 1 and
  ||A_l|| R^2 <= sqrt((q^2 - 1) n / (4n + 1)). Scores then differ across keys by at most 2 ||A_l|| R^2, so every
  attention weight lies within a factor exp(2 ||A_l|| R^2) of 1/n.
"""
from __future__ import annotations

SPREAD_TOL = 1e-4  # relative spread of the truth over inputs below which a head counts as input-independent
AR2_TOL = 1e-2  # implied ||A_l|| R^2 below which its attention is uniform to within exp(2e-2) - 1 = 2 %


def head_stats(table):
    """One row per (model, layer, head) of the per-head scope: inputs, spread, q, ar2, constant (bool)."""
    import numpy as np
    import pandas as pd

    h = table[(table["scope"] == "head")]
    c = h[h["method"] == "castin"]
    cols = ["model", "layer", "head", "inputs", "spread", "q", "ar2", "constant"]
    if c.empty:
        return pd.DataFrame(columns=cols)
    keys = ["model", "layer", "head"]
    q = (c["ratio"] / np.sqrt(3.0 * c["n"])).rename("q")
    c = c.assign(q=q, ar2=np.sqrt(np.clip(q ** 2 - 1, 0, None) * c["n"] / (4 * c["n"] + 1)))
    g = c.groupby(keys, sort=False)
    out = pd.DataFrame({"inputs": g["truth"].size(), "spread": g["truth"].max() / g["truth"].min() - 1,
                        "q": g["q"].max(), "ar2": g["ar2"].max()}).reset_index()
    flat = (out["inputs"] < 2) | (out["spread"] < SPREAD_TOL)
    out["constant"] = flat & (out["ar2"] < AR2_TOL)
    return out[cols]


def constant_mask(table, stats=None):
    """Boolean Series over `table`'s rows: True where the row's (model, layer, head) has constant attention."""
    stats = head_stats(table) if stats is None else stats
    keys = ["model", "layer", "head"]
    const = stats[stats["constant"]][keys].assign(_c=True)
    return table[keys].merge(const, on=keys, how="left")["_c"].fillna(False).astype(bool).set_axis(table.index)


def per_model(stats) -> dict:
    """model -> (constant heads, heads): only models with at least one constant head."""
    out = {}
    for m, g in stats.groupby("model", sort=False):
        if g["constant"].any():
            out[m] = (int(g["constant"].sum()), len(g))
    return out


def summary_lines(table, stats=None) -> list:
    """A table of the constant-attention heads per model and the number behind it (empty when there are none)."""
    stats = head_stats(table) if stats is None else stats
    pm = per_model(stats)
    if not pm:
        return []
    lines = ["", "**Heads with constant attention** (softmax uniform for every input, so the head is linear and every "
             "bound with a ||VO||-only term is exact: ratio 1.000). Evidence from this table: the truth is the same "
             f"for every input (relative spread < {SPREAD_TOL:g}), and Castin's Thm 3.3 value over sqrt(3n) x truth "
             "= q implies ||A_l|| R^2 <= sqrt((q^2 - 1) n / (4n + 1)) with A_l = W_Q W_K^T / sqrt(d_h): scores then "
             "differ by at most 2 ||A_l|| R^2 across keys.", "",
             "| model | heads with constant attention | largest truth spread over inputs | largest implied "
             "\\|\\|A_l\\|\\| R^2 | inputs per head |", "|---|---|---|---|---|"]
    for m, (k, n) in pm.items():
        s = stats[(stats["model"] == m) & stats["constant"]]
        lines.append(f"| {m} | {k} of {n} ({100 * k / n:.0f} %) | {s['spread'].max():.1e} | {s['ar2'].max():.1e} | "
                     f"{int(s['inputs'].max())} |")
    return lines
