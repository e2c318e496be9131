"""bound_leaderboard's figures (bound / truth per model, layer and head), summary and verdict on JaSMin Fig. 6's
ordering (presentation: reads the result table only)."""
from __future__ import annotations

from typing import Dict, List, Optional

from experiments.figures.common import model_name

PLUGIN_LABELS = {"jasmin_appc": "JaSMin App. C (sqrt(N) order, plug-in)"}


def _labels(table) -> Dict[str, str]:
    """method -> label, registry order first, then any other method in the table (e.g. a plug-in)."""
    from harness.bounds import registry

    lab = {k: v for k, v in registry.labels().items() if k != "truth"}
    for m in dict.fromkeys(table["method"]):
        lab.setdefault(m, PLUGIN_LABELS.get(m, m))
    return {k: v for k, v in lab.items() if k in set(table["method"])}


# the regularizer of JaSMin Fig. 6's model (App. E: JaSMin k = 10, lambda = 1e-2; its aggregation is not stated)
FIG6_TRAINING = "JaSMin k=10 lam=1e-2"
COINCIDE_RTOL = 0.08  # series closer than this at every n look like one line on the vs-n figure's log axis


def fig6_model(models) -> Optional[str]:
    """The model of the table closest to JaSMin Fig. 6's (a ViT trained with JaSMin k = 10, lambda = 1e-2; mean
    aggregation first, as the sweep's default), or None where the table has none (the test scale)."""
    cands = [str(m) for m in models if str(m).startswith(f"vit ({FIG6_TRAINING}")]
    return next((m for m in cands if m.endswith(" mean)")), cands[0] if cands else None)


def fig6_note(fig6: Optional[str]) -> str:
    """What JaSMin Fig. 6 plots and which panel of bound_leaderboard.png corresponds to it."""
    out = ("JaSMin Fig. 6 (App. C) plots, per layer and head of a ViT-B fine-tuned on CIFAR-100 with JaSMin k = 10, "
           "lambda = 1e-2, heat maps of log10 of the bound values themselves (Kim/Specformer, Castin, JaSMin; each "
           "averaged over the CIFAR-100 validation set) beside 'Exact' (the true constant, averaged over 100 images); "
           "here each box is log10 of bound / true per input instead.")
    if fig6 is None:
        return out + " No model of this table has Fig. 6's training (JaSMin k=10 lam=1e-2)."
    return out + (f" The framed panel ({model_name(fig6)}, per head) is Fig. 6's setting on our small ViT: its boxes "
                  "correspond to Fig. 6's bound maps minus its 'Exact' map (log10), the ratio taken per input before "
                  "pooling (the paper does not state its model's aggregation, mean or max).")


def _gap(a, b) -> float:
    """Largest relative distance |a - b| / b of two series over their points."""
    import numpy as np

    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.abs(b)))


def _same(la: str, lb: str) -> str:
    """'JaSMin Thm 3: exact = g_1' for two labels with a common part before ' (', else 'A = B'."""
    pa, _, ra = la.partition(" (")
    pb, _, rb = lb.partition(" (")
    return f"{pa}: {ra[:-1]} = {rb[:-1]}" if pa == pb and ra.endswith(")") and rb.endswith(")") else f"{la} = {lb}"


def _apart(gap: float) -> str:
    """'identical' or 'at most 6.2 % apart' for a relative gap."""
    return "identical" if gap < 5e-4 else f"at most {100 * gap:.1f} % apart"


def _crossings_note(table) -> str:
    """'Crossing: ...' for every n at which two of JaSMin Fig. 6's bounds swap places (the summary's verdict names
    them too); '' where none does."""
    from experiments.leaderboard.figures.verdict import crossing_text

    text = crossing_text(table, model_name)
    return f"Crossing of the paper's bounds: {text}. " if text else ""


def leaderboard_figures(table, outdir) -> List:
    import numpy as np

    from harness import plotting

    from experiments.leaderboard.figures import heads
    from experiments.figures.common import models_note, paper_note, ref, setting_note, within

    labels = _labels(table)
    methods = list(labels)
    style = dict(zip(methods, plotting.styles(len(methods))))
    r = table.dropna(subset=["ratio"])
    r = r[r["ratio"] > 0]
    models = list(dict.fromkeys(table["model"]))
    fig6 = fig6_model(models)
    stats = heads.head_stats(r)
    const = heads.per_model(stats)
    r = r.assign(constant=(r["scope"] == "head") & heads.constant_mask(r, stats))
    note = ("Each box: log10 of (upper bound / true local Lipschitz constant ||J(X)||, Lanczos) over inputs x heads "
            "(per head) or inputs x layers (per layer; layer bound = sum over heads); box = quartiles, line = median, "
            "whiskers = min and max, line = the median of the ratios as the summary gives it; inputs of every "
            "sequence length pooled (a two-length model can be bimodal); 0 = exact. Only the bounds defined at a scope "
            "are listed there (LoFAST naive is a layer bound). One x-range for every panel. " + fig6_note(fig6)
            + " LoFAST's eps -> 0 limit added ('sharpened, c=1/2': "
            "exact ||M|| with the softmax constant 1/2 of JaSMin Cor. 1, the bound the LoFAST figures call "
            "'softmax 1/2' and their tables 'sharp')."
            + " " + setting_note(table, models))
    if const:
        note += (" Constant attention: heads whose truth is the same for every input and whose Castin value implies "
                 "||W_Q W_K^T|| R^2 / sqrt(d_h) < 1e-2 (softmax uniform, head linear, every bound exact: ratio 1); "
                 "x = median without them. ")
    per_row = min(3, len(models))  # models side by side: at most three, so that the figure fits a page width
    groups = [models[i:i + per_row] for i in range(0, len(models), per_row)]
    fig, axes = plotting.figure(2 * len(groups), per_row, width=3.2 * per_row + 1.6, height=4.8 * len(groups) + 0.6,
                                squeeze=False)
    for ax in axes[len(groups) * 2 - 2:, len(groups[-1]):].flat:  # the last group's empty places
        ax.set_visible(False)
    for i, scope in enumerate(("head", "layer")):
        rows = [k for k in methods if ((r["scope"] == scope) & (r["method"] == k)).any()]  # no empty rows
        for g, group in enumerate(groups):
            for j, m in enumerate(group):
                ax = axes[2 * g + i, j]
                sel = r[(r["model"] == m) & (r["scope"] == scope)]
                data = [np.log10(sel[sel["method"] == k]["ratio"].to_numpy()) for k in rows]
                keep = [k for k, dd in enumerate(data) if len(dd)]
                if keep:  # the median line is log10 of the linear median, the summary's (not the median of logs)
                    meds = [float(np.log10(np.median(10.0 ** data[k]))) for k in keep]
                    bp = ax.boxplot([data[k] for k in keep], positions=[k + 1 for k in keep], orientation="horizontal",
                                    showfliers=False, patch_artist=True, whis=(0, 100), usermedians=meds,
                                    medianprops=dict(color="black", lw=1.4))
                    for patch, k in zip(bp["boxes"], keep):
                        patch.set_facecolor(style[rows[k]]["color"])
                        patch.set_alpha(0.6)
                title = f"{model_name(m)}\nper {scope}"
                if scope == "head" and m == fig6:  # framed: the panel a reader compares with the paper's figure
                    title += "\n= JaSMin Fig. 6's setting (as bound / true)"
                    for sp in ax.spines.values():
                        sp.set(visible=True, color="black", linewidth=2.0)
                if scope == "head" and m in const:
                    c, n = const[m]
                    title += f"\n{c} of {n} heads: constant attention"
                    rest = sel[~sel["constant"]].groupby("method")["ratio"].median()
                    pos = [(np.log10(rest[k]), p + 1) for p, k in enumerate(rows) if k in rest.index]
                    ax.plot([x for x, _ in pos], [y for _, y in pos], "x", color="black", ms=5,
                            label="median without the constant-attention heads")
                ax.set_yticks(range(1, len(rows) + 1), [labels[k] for k in rows] if j == 0 else [""] * len(rows),
                              fontsize=7)
                ax.set_ylim(0.5, len(rows) + 0.5)
                ax.axvline(0, color="black", lw=0.8)
                ax.set_xlabel("log10(bound / true local Lipschitz)")
                ax.set_title(title, loc="left")
    plotting.share_x(fig, [ax for ax in axes.flat if ax.get_visible()])
    fig.supylabel("upper bound (box: quartiles over inputs and heads / layers)", fontsize=8)
    where = (f"framed panel '{model_name(fig6)}, per head'" if fig6 else
             "no JaSMin k=10 lam=1e-2 ViT in this table")
    paths = plotting.finish(fig, outdir, "bound_leaderboard", ref(table), "How far each upper bound sits above "
                            "the true local Lipschitz constant: log10(bound / true) per input\nJaSMin Fig. 6 plots "
                            f"log10 of the bound values, averaged per head; its setting here: {where}", note=note)

    t = r[(r["scope"] == "head") & ~r["model"].astype(str).str.startswith("vit")]  # text models: n varies
    if len(t):
        tm = list(dict.fromkeys(t["model"]))
        fig, axes = plotting.grid(len(tm), ncols=min(3, len(tm)), panel=(4.6, 3.6))
        growth, coincide = [], []  # per model: the fastest-growing ratio; the series lying on another
        for ax, m in zip(axes, tm):
            drawn = []
            for i, k in enumerate(methods):
                s = t[(t["model"] == m) & (t["method"] == k)].groupby("n")["ratio"].median()
                if len(s):
                    st = style[k]
                    # later series dashed and with smaller markers, so one lying on another stays visible
                    ax.plot(s.index, s.values, marker=st["marker"], color=st["color"], label=labels[k],
                            ls=("-", "--", ":", "-.")[i % 4], ms=max(3.0, 7.0 - 0.5 * i))
                    drawn.append((k, s))
            ns = sorted(set(t.loc[t["model"] == m, "n"].astype(int)))
            series = {k: sv for k, sv in drawn}
            same = within({k: sv.values for k, sv in drawn}, rtol=COINCIDE_RTOL)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length n (tokens)")
            ax.set_ylabel("median bound / true (per head)")
            # the panel names its series drawn on top of each other, so none is taken for missing
            ax.set_title(model_name(m) + f"\nn = {', '.join(map(str, ns))}"
                         + (f"\ndrawn on top of each other (within {100 * COINCIDE_RTOL:.0f} %):" if same else "")
                         + "".join(f"\n  {_same(labels[a], labels[b])}" for a, b in same), loc="left", fontsize=8)
            if same:
                coincide.append(f"{model_name(m)}: " + ", ".join(
                    f"{labels[a]} = {labels[b]} ({_apart(_gap(series[a], series[b]))})" for a, b in same))
            grow = [(float(sv.iloc[-1] / sv.iloc[0]), k) for k, sv in drawn if len(sv) > 1]
            if grow:
                f, k = max(grow)
                growth.append(f"{model_name(m)}: {labels[k]} x{f:.3g} from n = {ns[0]} to {ns[-1]}")
        head = ref(table, 1) or f"Extends {ref(table)} to sequence length n"
        paths += plotting.finish(fig, outdir, "bound_leaderboard_vs_n", head, "Bound / true ratio vs sequence "
                                 "length (not in the paper: its Fig. 6 is one ViT at one n)",
                                 note="y: median over inputs and heads of a per-head upper bound over "
                                 "the true local Lipschitz constant (Lanczos), dimensionless, 1 = exact; x: tokens "
                                 "per Alice in Wonderland window. Fastest-growing ratio: " + "; ".join(growth)
                                 + " (a bound loosening with n: the true constant grows slower than it). "
                                 + (f"Series within {100 * COINCIDE_RTOL:.0f} % of each other at every n, drawn on "
                                    "top of each other on this log axis: " + "; ".join(coincide) + ". "
                                    if coincide else "")
                                 + _crossings_note(t)
                                 + models_note(tm, table)
                                 + paper_note(table, " ViT rows (in bound_leaderboard.png): "))
    return paths


def leaderboard_summary(table) -> str:
    from experiments.leaderboard.figures import heads
    from experiments.leaderboard.figures.verdict import (leaderboard_verdict, per_head_verdict, ratio_agg,
                                                         without_constant)

    labels = _labels(table)
    agg = ratio_agg(table)
    fig6 = fig6_model(dict.fromkeys(table["model"]))
    lines = ["Ratio bound / true local Lipschitz constant (median, worst = max, and min, which must be >= 1 where "
             "the bound is guaranteed), pooled over a model's sequence lengths n (the verdict below gives the "
             "paper's three bounds at every n).", "",
             "| model | scope | method | median | worst (max) | min | points |", "|---|---|---|---|---|---|---|"]
    order = {k: i for i, k in enumerate(labels)}
    agg["o"] = agg["method"].map(order)
    for a in agg.sort_values(["model", "scope", "o"]).itertuples():
        lines.append(f"| {a.model} | {a.scope} | {labels.get(a.method, a.method)} | {a.median:.3g} | {a.max:.3g} | "
                     f"{a.min:.3g} | {a.count} |")
    up = table[table["kind"] == "upper"]
    viol = int((~up["sound"].astype(bool)).sum())
    ng = int((~up["guaranteed"].astype(bool)).sum())
    bad = sorted(set(up[~up["sound"].astype(bool)]["method"]))
    lines += ["", f"Guaranteed upper bounds below the Lanczos truth: {viol} of {len(up)} (must be 0)"
              + (f": {', '.join(bad)}." if bad else "."),
              f"Points outside a bound's guaranteed regime (Kim's condition, not counted above): {ng}.",
              "The paper's Fig. 6 (App. C) shows heat maps of log10 of the Kim/Specformer, Castin and JaSMin bounds "
              "(and of the exact constant) per layer and head of a ViT-B fine-tuned on CIFAR-100 with JaSMin k = 10, "
              "lambda = 1e-2, and finds JaSMin's tightest; here every bound is divided by the truth per input, "
              + (f"the closest setting is model '{fig6}', scope head, " if fig6 else "no model has that training, ")
              + "and LoFAST's eps -> 0 limit (not in that paper) is added, on MiniLM, random GPT-2 and small ViTs, "
              "per head and per layer. For causal GPT-2 LoFAST uses our causal option of harness.bounds.lofast "
              "(masked P in zeta; not in the LoFAST paper)."]
    lines += ["", leaderboard_verdict(table)] + (["", per_head_verdict(table)] if per_head_verdict(table) else [])
    stats = heads.head_stats(table)
    lines += heads.summary_lines(table, stats)
    const = heads.per_model(stats)
    if const:
        rest = table[~((table["scope"] == "head") & heads.constant_mask(table, stats))]
        lines += ["", without_constant(table, rest, const)]
    return "\n".join(lines)
