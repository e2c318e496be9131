"""Figure, summary and verdict of castin_biases (Castin App. E.3; presentation: reads the result table only)."""
from __future__ import annotations

import numpy as np

from harness import plotting

NULL_TOL = 1e-6  # Remark E.1 holds where removing b_K moves P, f and ||Df|| by at most this (relative for ||Df||)


def _name(g) -> str:
    from experiments.figures.common import model_name

    return model_name(g["model"].iloc[0], bool(g["pretrained"].iloc[0]))


def biases_figure(table, outdir):
    """Per model: ||Df(X)|| with biases, without b_K (on top of it) and bias-free, median over windows vs n, one
    line style per variant and one colour per layer."""
    from experiments.figures.common import setting_note

    models = list(dict.fromkeys(table["model"]))
    fig, axes = plotting.figure(1, len(models), width=4.2 * len(models), height=3.4)
    axes = np.atleast_1d(axes)
    for ax, m in zip(axes, models):
        g = table[table["model"] == m]
        for i, (layer, gl) in enumerate(g.groupby("layer")):
            med = gl.groupby("n")[["lipschitz", "lipschitz_no_bk", "lipschitz_no_bias"]].median()
            col = plotting.plt.cm.viridis(i / max(1, g["layer"].nunique() - 1))
            ax.plot(med.index, med["lipschitz"], color=col, marker="o", label=f"L{layer} with biases")
            ax.plot(med.index, med["lipschitz_no_bk"], color=col, ls="none", marker="x", label=f"L{layer} no b_K")
            ax.plot(med.index, med["lipschitz_no_bias"], color=col, ls=":", label=f"L{layer} bias-free")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("n")
        ax.set_ylabel("||Df(X)|| (median over windows)")
        ax.set_title(_name(g))
    note = ("Lines: with every bias (solid, dots) and bias-free (dotted); crosses: without the key bias b_K alone, "
            "which Remark E.1 says changes nothing (they lie on the dots). " + setting_note(table))
    return plotting.finish(fig, outdir, "castin_biases", "Castin et al. 2024, App. E.3",
                           title="Self-attention with and without biases", note=note)


def biases_verdict(table) -> str:
    """Remark E.1 decided on every row of the models that have a key bias."""
    t = table[table["has_bk"].astype(bool)]
    if not len(t):
        return "Verdict (App. E.3, Remark E.1: the key bias has no effect): **not determined** (no model with b_K)."
    dlip = ((t["lipschitz"] - t["lipschitz_no_bk"]).abs() / t["lipschitz"]).max()
    worst = max(float(t["max_dp"].max()), float(t["rel_df"].max()), float(dlip))
    word = "reproduced" if worst <= NULL_TOL else "not reproduced"
    models = ", ".join(dict.fromkeys(_name(g) for _, g in t.groupby("model")))
    corpus = ", ".join(str(c) for c in dict.fromkeys(t["corpus"])) if "corpus" in t else "real text"
    return (f"Verdict (App. E.3, Remark E.1: the key bias b_K has no influence on self-attention; scope: every head "
            f"and layer, {corpus} windows; models: {models} (the paper discusses BERT's biases)): **{word}**: "
            f"removing b_K moves the attention map by at most {float(t['max_dp'].max()):.1e}, f by "
            f"{float(t['rel_df'].max()):.1e} relative and ||Df(X)|| by {float(dlip):.1e} relative over {len(t)} "
            f"windows x layers (tolerance {NULL_TOL:g}: the Lanczos estimate's).")


def biases_summary(table) -> str:
    out = ["**Biases** (Castin App. E.3). Per model and layer, medians over windows and n: ||Df(X)|| with every "
           "bias, without the key bias b_K, bias-free, and the bias-free / biased ratio (how far the bias-free map "
           "the main theorems bound is from the model's).", "",
           "| model | layer | with biases | without b_K | bias-free | bias-free / with | max abs dP (no b_K) |",
           "|---|---|---|---|---|---|---|"]
    for (m, layer), g in table.groupby(["model", "layer"], sort=False):
        r = (g["lipschitz_no_bias"] / g["lipschitz"]).median()
        out.append(f"| {_name(g)} | {layer} | {g['lipschitz'].median():.4g} | {g['lipschitz_no_bk'].median():.4g} | "
                   f"{g['lipschitz_no_bias'].median():.4g} | {r:.3g} | {g['max_dp'].max():.1e} |")
    r = table["lipschitz_no_bias"] / table["lipschitz"]
    moved = (f"do move the constant: bias-free / with biases ranges {r.min():.3g} to {r.max():.3g}"
             if (r - 1).abs().max() > NULL_TOL else "do not move the constant here (zero biases: random init)")
    out += ["", f"The other biases (b_Q, b_V, b_O) {moved}; the paper says only that biases do not change the "
                "analysis much (Thm E.3 extends Thm 3.3; its formula is not in the text we have, so it is not "
                "evaluated).",
            "", biases_verdict(table)]
    return "\n".join(out)
