"""Presentation of the Castin experiments (imported only inside figures()/summary(), so editing it re-renders
without recomputing): figures and summaries of castin_sqrt_n, castin_sqrt_n_adversarial,
castin_gamma and castin_magnitude. The radius and mass-splitting ones are in castin/figures/radius.py.
"""
from __future__ import annotations

import math

import numpy as np

from harness import plotting

from experiments.castin.figures.llama import DIFFERS_LLAMA
from experiments.castin.figures.llama import is_rope as _is_rope
from experiments.castin.figures.llama import llama_note as _llama_note
from experiments.castin.figures.llama import llama_vs_gpt2 as _llama_vs_gpt2
from experiments.castin.figures.llama import rope_label as _rope
from experiments.figures.fits import fmt_fit, loglog_fit  # noqa: F401 - the slope fits (experiments/figures/fits.py), also named here


def _ticks(ax):
    """Plain major tick labels on the log n axis, no minor labels (they overlap on short ranges)."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


def _label(model, layer, masked=None, extra="", pretrained=True):
    from experiments.figures.common import layer_name, model_name

    m = "causal mask" if masked else "no mask"
    return f"{model_name(model, pretrained)}, {layer_name(model, layer)}" + ("" if masked is None else f"\n{m}") + \
        (f", {extra}" if extra else "")


def _tol(dtype: str) -> float:
    """The truth's Lanczos tolerance in `dtype` (harness.tolerances.truth_tol)."""
    import torch

    from harness.tolerances import truth_tol

    return truth_tol(getattr(torch, dtype))


def _pre(g) -> str:
    return "" if g["pretrained"].iloc[0] else " (random)"


def _loglog_n(ax, ylabel):
    ax.set_xlabel("sequence length n (tokens)")
    ax.set_ylabel(ylabel)
    _ticks(ax)


MAP_NOTE = {"layer": "map: multi-head attention layer with W^O and biases, no residual / LayerNorm",
            "self": "map: attention.self (heads concatenated, no W^O), as the authors' adversarial code"}


def _map_note(table) -> str:
    maps = list(dict.fromkeys(table["map"])) if "map" in table.columns else []
    return " ".join(f"{MAP_NOTE.get(m, f'map {m}')}." for m in maps)


# ---- castin_sqrt_n (real data) -------------------------------------------------------------------------------
def sqrt_n_real_figure(table, outdir):
    """Fig. 1 analogue on real data, log-log: the true constant and the paper's estimator on the panel's own
    y-range (their slopes are the point), Castin's Thm 3.3 bound (2-4 decades higher) in an inset with the true
    median for scale; one panel per (model, layer, mask, corpus[, map])."""
    from experiments.figures.common import facets, setting_note

    def draw(ax, k, g):
        med = g.groupby("n").median(numeric_only=True)
        ax.scatter(g["n"], g["lipschitz"], s=4, color=plotting.color("lipschitz"), alpha=0.5)
        plotting.loglog(ax, med.index, med["lipschitz"], "||Df(X)||, true (dots: windows)",
                        key="lipschitz", markersize=2)
        ax.scatter(g["n"], g["paper_estimator"], s=4, color=plotting.color("paper"), alpha=0.5)
        plotting.loglog(ax, med.index, med["paper_estimator"], "paper's estimator sqrt(||J^T F(X)||)", key="paper",
                        markersize=2)
        lo, hi = ax.get_ylim()
        ax.set_ylim(lo, hi * (hi / lo) ** 0.75)  # headroom: the inset sits above the curves
        ax.plot([], [], color=plotting.color("castin"), linestyle="--",
                label="Thm 3.3 bound (inset; black: true)")
        if np.isfinite(med["bound_castin"]).any():
            from matplotlib.ticker import NullFormatter

            ins = ax.inset_axes([0.1, 0.6, 0.42, 0.36])
            ins.loglog(med.index, med["bound_castin"], color=plotting.color("castin"), linestyle="--")
            ins.loglog(med.index, med["lipschitz"], color=plotting.color("lipschitz"), lw=1.0)
            ins.tick_params(labelsize=5, pad=1)
            for axis in (ins.xaxis, ins.yaxis):
                axis.set_minor_formatter(NullFormatter())
            ins.set_title(f"Thm 3.3 / true at n max: {(med['bound_castin'] / med['lipschitz']).iloc[-1]:.2g}",
                          fontsize=6, pad=2)
            ins.grid(False)
        else:
            ax.text(0.03, 0.95, "Thm 3.3 bound: not defined for this map", transform=ax.transAxes, fontsize=6,
                    va="top")
        fl, fp = loglog_fit(g["n"], g["lipschitz"]), loglog_fit(g["n"], g["paper_estimator"])
        extra = k[3] + (f", map {k[4]}" if len(k) > 4 else "") + (_rope(g) and f"\n{_rope(g)}")
        plotting.caption(ax, _label(k[0], k[1], k[2], extra, g["pretrained"].iloc[0])
                         + f"\nslope {fl['slope']:.2f}; the paper's estimator here: {fp['slope']:.2f}")
        _loglog_n(ax, "||Df(X)|| (spectral norm)")

    return facets(table, ["model", "layer", "masked", "corpus", "map"], outdir, "castin_sqrt_n_real", draw,
                  "Local Lipschitz constant of attention vs sequence length, real text (log-log)",
                  note="y: spectral norm of the attention map's Jacobian at a text window X of n tokens (Lanczos; "
                  "dimensionless, output norm per input norm), line = median over windows; the paper's estimator on "
                  "the same windows; Thm 3.3 (Castin et al.) in the inset. "
                  + setting_note(table) + _llama_note(table) + " "
                  + (_map_note(table) or MAP_NOTE["layer"] + ".") + " Slopes: least squares in log-log.", ncols=3)


def _paper_models(table) -> str:
    """'pretrained BERT-base and random-init GPT-2 (pretrained weights unreachable)': how the paper's models ran in
    this table (experiments.figures.common.weights_note), '' when the table has neither."""
    from experiments.figures.common import weights_note

    have = set(map(str, table["model"])) if "model" in table.columns else set()
    return " and ".join(weights_note(table, m) for m in ("bert-base-uncased", "gpt2") if m in have)


def differs_models(table) -> str:
    """The 'Models' / 'Map' bullets of "what differs from the paper", from what ran (the table)."""
    ran = _paper_models(table)
    random = "random-init" in ran
    return (f"- *Models*: the paper measures pretrained BERT-base and GPT-2 (and random GPT-2); here: "
            f"{ran or 'neither'}"
            + ("; the random ones are their architectures with HF init (std 0.02): on real text their attention "
               "is close to uniform, so their real-data constant is nearly flat in n" if random else "")
            + ". MiniLM-L6 (all-MiniLM-L6-v2, BERT family, d = 384, 12 heads, pretrained) is measured beside them."
            + "\n- *Map*: we measure the self-attention layer (with its biases, output projection included) without "
              "residual or LayerNorm; the paper's BERT runs included them.")


def sqrt_n_real_summary(table) -> str:
    """Slopes (95 % CI) per panel next to the paper's, and what differs."""
    out = ["**Real data** (slope of log ||Df|| vs log n over all sequences, 95 % CI; paper: ~0.25 with its "
           "estimator on pretrained BERT / random GPT-2)\n",
           "| model | layer | mask | corpus | n | slope ours | slope paper estimator | slope Thm 3.3 | "
           "median Lip at n max | median paper est. at n max | Thm 3.3 / Lip at n max | R mean |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    slopes = []  # (pretrained, estimator slope, true slope, RoPE) per panel, for the verdict
    for k, g in table.groupby(["model", "layer", "masked", "corpus"], sort=False):
        nmax = g["n"].max()
        top = g[g["n"] == nmax]
        f_lip, f_est = loglog_fit(g["n"], g["lipschitz"]), loglog_fit(g["n"], g["paper_estimator"])
        slopes.append((bool(g["pretrained"].iloc[0]), f_est["slope"], f_lip["slope"], _is_rope(g)))
        ratio = "n/a (RoPE)" if _is_rope(g) else f"{(top['bound_castin'] / top['lipschitz']).median():.3g}"
        out.append(f"| {k[0]}{_pre(g)} | {k[1]} | {'causal' if g['causal'].iloc[0] else 'none'} | {k[3]} | "
                   f"{g['n'].min()}-{nmax} | {fmt_fit(f_lip)} | {fmt_fit(f_est)} | "
                   f"{fmt_fit(loglog_fit(g['n'], g['bound_castin']))} | {top['lipschitz'].median():.3g} | "
                   f"{top['paper_estimator'].median():.3g} | "
                   f"{ratio} | {g['radius_mean'].mean():.1f} |")
    out.append("\n" + _real_verdict(slopes) + _llama_vs_gpt2(table))
    out.append(f"\nConverged: {100 * table['converged'].mean():.1f} % of {len(table)} estimates (Lanczos, relative "
               f"Ritz residual on sigma^2 < {_tol('float32'):g} in float32, {_tol('float64'):g} in float64); "
               f"median {table['iters'].median():.0f} J^T J products per batch of sequences; "
               f"{table['cpu_s'].sum():.0f} CPU s in the estimator.\n")
    llama = "\n" + DIFFERS_LLAMA if _is_rope(table) else ""
    out.append(f"""
**What differs from the paper and why.**
{differs_models(table)}{llama}
- *Estimator*: the paper's code takes `jvp(...)[0]` = F(X), so it reports sqrt(||J^T F(X)||), which grows with
  ||F(X)||_F ~ sqrt(n) even where ||J|| does not: its slope (column "paper estimator") is the number to hold
  against the published ~0.25; our column is the true ||Df(X)||.
- *Mask*: 'causal' panels mask the measured map and run the whole model as a decoder (is_decoder=True) to
  get the inputs; the paper's decoder runs passed no mask to the measured map.
""")
    return "\n".join(out)


def _real_verdict(slopes) -> str:
    """One line: the published ~n^0.25 (the authors' estimator) against our estimator and true slopes.
    slopes: (pretrained, estimator slope, true slope) per panel."""
    e = [s[1] for s in slopes if s[0]]
    t = [s[2] for s in slopes if s[0]]
    if not e:
        return "Verdict: not determined (no pretrained model in this run)."
    word = "partly reproduced" if min(e) <= 0.25 <= max(e) else "not reproduced"
    out = (f"Verdict (paper: ~n^0.25 on real data, with its estimator): **{word}**. On the pretrained model the "
           f"authors' estimator grows as n^{min(e):.2f} to n^{max(e):.2f} over the panels, the true ||Df(X)|| as "
           f"n^{min(t):.2f} to n^{max(t):.2f}: the growth is real in the last layer but smaller than the estimator "
           "says (castin_sqrt_n_block: on the authors' LN(X + attn(X)) map the published slope is the estimator's).")
    er, tr = [s[1] for s in slopes if not s[0] and not s[3]], [s[2] for s in slopes if not s[0] and not s[3]]
    if er:
        out += (f" Random-weight BERT-base / GPT-2 (near-uniform attention): true n^{min(tr):.2f} to "
                f"n^{max(tr):.2f}, estimator n^{min(er):.2f} to n^{max(er):.2f}.")
    return out


def _adversarial_verdict(panels) -> str:
    """One line: Prop. 3.4's sqrt(n) at its adversarial inputs, for the head alone (the proposition's map) and the
    whole layer. panels: per unmasked panel, (layer slope, head-alone slope, lower-bound slope, min head / LB) of
    the head with the largest gamma (the ratio over all heads)."""
    if not panels:
        return "Verdict: not determined (no unmasked panel)."
    lay, head, lb, ratios = (list(c) for c in zip(*panels))
    ratio = min(ratios)
    word = "reproduced" if min(head) >= 0.45 and ratio >= 1 - 1e-9 else "partly reproduced"
    return (f"Verdict (paper: ~n^0.5 at Prop. 3.4's inputs): **{word}** for the proposition's map (one head, no "
            f"bias): slopes {min(head):.2f} to {max(head):.2f} over the unmasked panels, its lower bound "
            f"{min(lb):.2f} to {max(lb):.2f}, the head never below it (min ratio {ratio:.3g}). The whole multi-head "
            f"layer at the same inputs grows as n^{min(lay):.2f} to n^{max(lay):.2f} (other heads and W^O dilute "
            "the chosen head), so the paper's sqrt(n) is a per-head statement.")


# ---- castin_sqrt_n_adversarial ---------------------------------------------------------------------------------
def sqrt_n_adversarial_figure(table, outdir):
    """Fig. 1 analogue at Prop. 3.4's inputs: the map and the head alone, lower and upper bounds; one image per
    measured map (column `map`, where present) and at most 16 panels each."""
    from experiments.figures.common import facets, setting_note

    def draw(ax, k, g):
        best = int(g.loc[g["gamma"].idxmax(), "head"])
        for _, gh in g.groupby("head"):
            ax.loglog(gh["n"], gh["lipschitz"], color=plotting.color("lipschitz"), alpha=0.25, lw=0.7,
                      label="||Df(X)|| at each head's input (thin)")
        gb = g[g["head"] == best]
        plotting.loglog(ax, gb["n"], gb["lipschitz"], "||Df(X)||, input of the head with max gamma",
                        key="lipschitz", markersize=2)
        plotting.loglog(ax, gb["n"], gb["lipschitz_head"], "||Df_l(X)||, that head alone", key="ours",
                        markersize=2)
        plotting.loglog(ax, gb["n"], gb["lower_bound"], "Prop 3.4 lower bound (no mask only)", key="lower",
                        linestyle=":", marker=None)
        plotting.loglog(ax, gb["n"], gb["paper_estimator"], "paper's estimator", key="paper", markersize=2)
        plotting.loglog(ax, gb["n"], gb["bound_castin"], "Thm 3.3 upper bound", key="castin", linestyle="--",
                        marker=None)
        f = loglog_fit(gb["n"], gb["lipschitz"])
        plotting.caption(ax, _label(k[0], k[1], k[2], f"R = {g['radius'].iloc[0]:.1f} ({k[3]:g}x mean)",
                                    g["pretrained"].iloc[0]) + f"\nhead {best}: slope {f['slope']:.2f}")
        _loglog_n(ax, "||Df(X)|| (log)")

    return facets(table, ["model", "layer", "masked", "radius_factor"], outdir, "castin_sqrt_n_adversarial", draw,
                  "Local Lipschitz constant vs n at Prop. 3.4's adversarial inputs (log-log)", split="map",
                  split_title=lambda m: MAP_NOTE.get(m, f"map {m}").split(" (")[0].replace("map: ", ""),
                  note=lambda value, part: "Inputs: Prop. 3.4's adversarial sequence for each head with a real "
                  "eigenvalue of A_c; R = factor x mean token radius of the layer's real Alice inputs. "
                  + setting_note(part) + " " + (_map_note(part) or MAP_NOTE["layer"] + "."))


MAPS = {"layer": "W^O", "self": "self (authors')"}


def sqrt_n_adversarial_summary(table) -> str:
    out = ["**Adversarial inputs** (Prop. 3.4 per head; paper: ~n^0.5, constants 4.39 and 5.73 for pretrained "
           "BERT at R = 15.5 and 21.5)\n",
           "| model | layer | mask | map | R (x mean) | heads | median gamma R^2 | slope layer (head max gamma) | "
           "slope layer, median over heads | slope head alone (no bias; Prop 3.4's map) | slope Prop 3.4 LB | "
           "C in C sqrt(n) layer / head alone | slope paper estimator | min Lip_head / Prop 3.4 LB |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    table = table.assign(map=table["map"]) if "map" in table else table.assign(map="layer")
    unmasked = []  # per unmasked panel: (layer, head-alone, lower-bound slope, min head / LB), for the verdict
    for k, g in table.groupby(["model", "layer", "masked", "radius_factor", "map"], sort=False):
        best = int(g.loc[g["gamma"].idxmax(), "head"])
        gb = g[g["head"] == best]
        per_head = [loglog_fit(gh["n"], gh["lipschitz"])["slope"] for _, gh in g.groupby("head")]
        fb, fh = loglog_fit(gb["n"], gb["lipschitz"]), loglog_fit(gb["n"], gb["lipschitz_head"])
        flb = loglog_fit(gb["n"], gb["lower_bound"])
        if not bool(k[2]):
            unmasked.append((fb["slope"], fh["slope"], flb["slope"],
                             float((g["lipschitz_head"] / g["lower_bound"]).min())))
        lb_ratio = "n/a (LB is for the unmasked map)" if bool(k[2]) else f"{unmasked[-1][3]:.3g}"
        out.append(f"| {k[0]}{_pre(g)} | {k[1]} | {'causal' if k[2] else 'none'} | {MAPS.get(k[4], k[4])} | "
                   f"{g['radius'].iloc[0]:.1f} "
                   f"({k[3]:g}x) | {g['head'].nunique()} | {g['gamma_R2'].median():.3g} | {fmt_fit(fb)} | "
                   f"{np.nanmedian(per_head):.2f} | {fmt_fit(fh)} | "
                   f"{fmt_fit(flb)} | "
                   f"{fb['const_sqrt']:.3g} / {fh['const_sqrt']:.3g} | "
                   f"{fmt_fit(loglog_fit(gb['n'], gb['paper_estimator']))} | {lb_ratio} |")
    out.append("\n" + _adversarial_verdict(unmasked))
    out.append(f"""
**What differs from the paper and why.**
{differs_models(table)}
- *Adversarial R*: factor x the mean token radius of the layer's real inputs, not the paper's 15.5 / 21.5 / 100.
- *Map* column: "W^O" = the self-attention layer with its output projection and biases (ours); "self" = Hugging
  Face's `attention.self` (heads concatenated, no W^O), the map the authors' adversarial code measured.
- *Masked rows* (ours): Prop. 3.4's input fed to the causally masked map (Thm 4.3 keeps the Thm 3.3 bound).
  Prop. 3.4's lower bound is proved for the unmasked map, so it is n/a there; the head-alone slope under the
  mask is the number to hold against sqrt(n).
""")
    return "\n".join(out)


# ---- castin_gamma ------------------------------------------------------------------------------------------------
def gamma_figure(table, outdir):
    from experiments.figures.common import facets, model_name, setting_note

    def draw(ax, k, g):
        for _, gl in g.groupby("layer"):
            ax.scatter(gl["layer"] + (gl["head"] - gl["head"].mean()) * 0.03, gl["gamma_R2"], s=8,
                       color=plotting.color("castin"), label="one head")
        med = g.groupby("layer")["gamma_R2"].median()
        ax.plot(med.index, med.values, color="black", lw=1, label="median over heads")
        ax.axhline(math.log(512), color="#888888", ls="--", lw=0.8, label="gamma R^2 = ln 512 (n* = 512)")
        ax.set_yscale("log")
        ax.set_xlabel("layer index")
        ax.set_ylabel("gamma R^2 (R = mean token radius)")
        plotting.caption(ax, model_name(k[0], g["pretrained"].iloc[0]))

    return facets(table, ["model"], outdir, "castin_gamma", draw, "gamma R^2 of every head (Prop. 3.4's constant)",
                  ncols=3, note="App. C.5: 5 Alice extracts. " + setting_note(table)
                  + " Above the dashed line n* = e^{gamma R^2} > 512: the sqrt(n) regime covers every usual length.")


def gamma_summary(table) -> str:
    out = ["| model | layers x heads | gamma R^2 median | min | max | heads with n* = e^{gamma R^2} > 512 | "
           "median gamma R^2 with R = max radius | median with biases folded in | median with R = RMS radius "
           "(authors' code) |",
           "|---|---|---|---|---|---|---|---|---|"]
    for m, g in table.groupby("model", sort=False):
        v = g["gamma_R2"].dropna()
        out.append(f"| {m}{_pre(g)} | {g['layer'].nunique()} x {g['head'].nunique()} | {v.median():.3g} | "
                   f"{v.min():.3g} | {v.max():.3g} | {(v > math.log(512)).mean() * 100:.0f} % | "
                   f"{g['gamma_R2_max'].median():.3g} | {g['gamma_R2_biased'].median():.3g} | "
                   f"{g['gamma_R2_rms'].median() if 'gamma_R2_rms' in g else float('nan'):.3g} |")
    for m, g in table.groupby("model", sort=False):
        per_layer = g.groupby("layer")["gamma_R2"].median()
        out.append(f"\n{m}: median gamma R^2 per layer " + ", ".join(f"L{l}: {v:.3g}" for l, v in per_layer.items())
                   + "; mean token radius per layer " +
                   ", ".join(f"{v:.1f}" for v in g.groupby("layer")["radius_mean"].first().values) + ".")
    pre = table[table["pretrained"].astype(bool)] if "pretrained" in table else table.iloc[:0]
    if len(pre):
        frac = float((pre["gamma_R2"] > math.log(512)).mean())
        word = "reproduced" if frac >= 0.9 else "partly reproduced" if frac >= 0.5 else "not reproduced"
        out.append(f"\nVerdict (App. C.5: e^{{gamma R^2}} beyond practical n, so Prop. 3.4's sqrt(n) regime is "
                   f"reachable): **{word}** on the pretrained model: n* = e^{{gamma R^2}} > 512 for "
                   f"{100 * frac:.0f} % of its heads (median gamma R^2 {pre['gamma_R2'].median():.3g} with the mean "
                   f"radius, {pre['gamma_R2_rms'].median() if 'gamma_R2_rms' in pre else float('nan'):.3g} with the "
                   "authors' RMS radius).")
    out.append(f"""
**Versus the paper.** The paper (pretrained BERT-base, App. C.5) finds gamma R^2 large enough that
e^{{gamma R^2}} exceeds any practical n, so Prop. 3.4's sqrt(n) growth is reachable at realistic lengths; the
table gives the same check for {_paper_models(table) or 'the models of this grid'} and pretrained MiniLM-L6
(random-init architectures use std-0.02 weights; their LayerNorm outputs have radius ~ sqrt(d) ~ 27.7 as the
paper reports for random GPT-2, so gamma R^2 is not small there either). gamma uses the bias-free
A_c as Prop. 3.4 states; the 'biases folded in' column uses the augmented weights of JaSMin Remark 2 with
radius sqrt(R^2 + 1). gamma is computed from the dh x dh factor wq^T wk / sqrt(dh) (same nonzero spectrum as
A_c, plus 0; harness.bounds.castin.prop34_choice), in float64, checked against the dense d x d eigenproblem in
the tests. R is the mean token norm as the paper's text defines it; the authors' code takes the RMS token norm
sqrt(mean ||x_i||^2) >= mean, shown in the last column (column gamma_R2_rms of the table).
""")
    return "\n".join(out)


# ---- castin_magnitude --------------------------------------------------------------------------------------------
def magnitude_figure(table, outdir):
    from experiments.figures.common import models_note, ref

    groups = list(table.groupby(["model", "layer"], sort=False))
    fig, axes = plotting.figure(2, len(groups), squeeze=False)
    for j, (k, g) in enumerate(groups):
        med = g.groupby("n").median(numeric_only=True)
        ax = axes[0, j]
        ax.scatter(g["n"], g["radius_mean"], s=4, color=plotting.color("ours"), alpha=0.5)
        ax.plot(med.index, med["radius_mean"], color=plotting.color("ours"), label="mean ||x_i|| (dots: sequences)")
        ax.plot(med.index, med["radius_max"], color=plotting.color("paper"), label="max ||x_i||")
        ax.set_xscale("log")
        _loglog_n(ax, "token norm ||x_i||")
        plotting.caption(ax, _label(k[0], k[1], pretrained=g["pretrained"].iloc[0]) + "\ntoken magnitude")
        ax = axes[1, j]
        plotting.loglog(ax, med.index, med["lipschitz"], "||Df(X)||", key="lipschitz", markersize=2)
        plotting.loglog(ax, med.index, med["lipschitz_rescaled"], "||Df(X)||, token magnitude equalized",
                        key="castin", markersize=2)
        f1, f2 = loglog_fit(g["n"], g["lipschitz"]), loglog_fit(g["n"], g["lipschitz_rescaled"])
        plotting.caption(ax, f"slope {f1['slope']:.2f}, equalized {f2['slope']:.2f}")
        _loglog_n(ax, "||Df(X)|| (median)")
    return plotting.finish(fig, outdir, "castin_magnitude", ref(table), "Token magnitude vs n and its share of the "
                           "growth of ||Df||", note="Paper: pretrained GPT-2 (learned positions). "
                           + models_note(table["model"], table) + " MiniLM-L6 also has learned absolute positions.")


def magnitude_summary(table) -> str:
    from experiments.castin.figures.radius import _magnitude_verdict

    out = ["| model | layer | mean ||x|| at n min -> n max | slope of mean ||x|| vs n | slope ||Df|| | "
           "slope with magnitude equalized | difference |", "|---|---|---|---|---|---|---|"]
    diffs = {}  # (model label, layer) -> slope change the magnitude drift explains
    for k, g in table.groupby(["model", "layer"], sort=False):
        med = g.groupby("n")["radius_mean"].median()
        fr = loglog_fit(g["n"], g["radius_mean"])
        f1, f2 = loglog_fit(g["n"], g["lipschitz"]), loglog_fit(g["n"], g["lipschitz_rescaled"])
        diffs[(f"{k[0]}{_pre(g)}", k[1])] = f1["slope"] - f2["slope"]
        out.append(f"| {k[0]}{_pre(g)} | {k[1]} | {med.iloc[0]:.2f} -> {med.iloc[-1]:.2f} | {fmt_fit(fr)} | "
                   f"{fmt_fit(f1)} | {fmt_fit(f2)} | {f1['slope'] - f2['slope']:+.3f} |")
    gpt2 = _paper_models(table[table["model"].astype(str) == "gpt2"]) if "model" in table.columns else ""
    here = (f"Here GPT-2 ran as {gpt2}" if gpt2 else "This grid has no GPT-2")
    random = ("; random weights' position embeddings carry no learned structure (their magnitudes are fixed by "
              "ln_1, ~ sqrt(d))" if "random-init" in gpt2 else "")
    out.append(f"""
**Versus the paper.** App. E.2 attributes pretrained GPT-2's faster-than-n^0.25 growth to token magnitudes
that depend on n through learned position embeddings. {here}{random}; MiniLM-L6 (learned absolute positions,
post-LN) is measured beside it as a pretrained model. The last column is the slope change explained by the
magnitude drift alone.
""")
    out.append(_magnitude_verdict(diffs))
    return "\n".join(out)
