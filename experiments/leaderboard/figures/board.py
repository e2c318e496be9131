"""bound_leaderboard's figures (bound / truth per model, layer and head), summary and verdict on JaSMin Fig. 6's
ordering (presentation: reads the result table only)."""
from __future__ import annotations

from typing import Dict, List


PLUGIN_LABELS = {"jasmin_appc": "JaSMin App. C (sqrt(N) order, plug-in)"}


def _labels(table) -> Dict[str, str]:
    """method -> label, registry order first, then any other method in the table (e.g. a plug-in)."""
    from harness.bounds import registry

    lab = {k: v for k, v in registry.labels().items() if k != "truth"}
    for m in dict.fromkeys(table["method"]):
        lab.setdefault(m, PLUGIN_LABELS.get(m, m))
    return {k: v for k, v in lab.items() if k in set(table["method"])}


def leaderboard_figures(table, outdir) -> List:
    import numpy as np

    from harness import plotting

    from experiments.leaderboard.figures import heads
    from experiments.figures.common import model_name, models_note, paper_note, ref, setting_note, within

    labels = _labels(table)
    methods = list(labels)
    style = dict(zip(methods, plotting.styles(len(methods))))
    r = table.dropna(subset=["ratio"])
    r = r[r["ratio"] > 0]
    models = list(dict.fromkeys(table["model"]))
    stats = heads.head_stats(r)
    const = heads.per_model(stats)
    r = r.assign(constant=(r["scope"] == "head") & heads.constant_mask(r, stats))
    note = ("Each box: log10 of (upper bound / true local Lipschitz constant ||J(X)||, Lanczos) over inputs x heads "
            "(per head) or inputs x layers (per layer; layer bound = sum over heads); box = quartiles, line = median, "
            "whiskers = min and max, line = the median of the ratios as the summary gives it; inputs of every "
            "sequence length pooled (a two-length model can be bimodal); 0 = exact. Only the bounds defined at a scope are listed there "
            "(LoFAST naive is a layer bound). One x-range for every panel. Fig. 6: Kim/Specformer, Castin and JaSMin "
            "per head on a JaSMin-trained ViT-B (CIFAR-100); LoFAST's eps -> 0 limit added ('sharpened, c=1/2': "
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
    paths = plotting.finish(fig, outdir, "bound_leaderboard", ref(table), "How far each upper bound sits above "
                            "the true local Lipschitz constant", note=note)

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
            same = within({k: sv.values for k, sv in drawn}, rtol=0.03)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length n (tokens)")
            ax.set_ylabel("median bound / true (per head)")
            ax.set_title(model_name(m) + f"\nn = {', '.join(map(str, ns))}", loc="left", fontsize=8)
            if same:
                coincide.append(f"{model_name(m)}: " + ", ".join(f"{labels[a]} = {labels[b]}" for a, b in same))
            grow = [(float(sv.iloc[-1] / sv.iloc[0]), k) for k, sv in drawn if len(sv) > 1]
            if grow:
                f, k = max(grow)
                growth.append(f"{model_name(m)}: {labels[k]} x{f:.3g} from n = {ns[0]} to {ns[-1]}")
        paths += plotting.finish(fig, outdir, "bound_leaderboard_vs_n", ref(table), "Bound / true ratio vs sequence "
                                 "length", note="y: median over inputs and heads of a per-head upper bound over "
                                 "the true local Lipschitz constant (Lanczos), dimensionless, 1 = exact; x: tokens "
                                 "per Alice in Wonderland window. Fastest-growing ratio: " + "; ".join(growth)
                                 + " (a bound loosening with n: the true constant grows slower than it). "
                                 + ("Series within 3 % of each other (drawn on top of each other): "
                                    + "; ".join(coincide) + ". " if coincide else "")
                                 + models_note(tm, table)
                                 + paper_note(table, " ViT rows (in bound_leaderboard.png): "))
    return paths


def leaderboard_summary(table) -> str:
    from experiments.leaderboard.figures import heads

    labels = _labels(table)
    agg = _ratio_agg(table)
    lines = ["Ratio bound / true local Lipschitz constant (median, worst = max, and min, which must be >= 1 where "
             "the bound is guaranteed).", "",
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
              "The paper's Fig. 6 compares Kim/Specformer, Castin and JaSMin heat maps per head for a JaSMin-trained "
              "ViT-B on CIFAR-100 and finds JaSMin's tightest; here LoFAST's eps -> 0 limit (not in that paper) is "
              "added, on MiniLM, random GPT-2 and a small Fashion-MNIST ViT, per head and per layer. For causal GPT-2 "
              "LoFAST uses our causal option of harness.bounds.lofast (masked P in zeta; not in the LoFAST paper)."]
    lines += ["", leaderboard_verdict(agg)]
    stats = heads.head_stats(table)
    lines += heads.summary_lines(table, stats)
    const = heads.per_model(stats)
    if const:
        rest = table[~((table["scope"] == "head") & heads.constant_mask(table, stats))]
        lines += ["", _without_constant(agg, _ratio_agg(rest), const)]
    return "\n".join(lines)


def _without_constant(agg, rest, const) -> str:
    """Does Fig. 6's verdict change when the constant-attention heads (ratio 1 for every bound) are left out?"""
    before, after = (leaderboard_verdict(a).split("**")[1] for a in (agg, rest))
    med = rest[rest["scope"] == "head"].set_index(["model", "method"])["median"]
    parts = []
    for m, (k, n) in const.items():
        if all((m, x) in med.index for x in ("jasmin", "castin", "kim")):
            lo = f", LoFAST fine {med[(m, 'lofast_fine')]:.3g}" if (m, "lofast_fine") in med.index else ""
            parts.append(f"{m} on its {n - k} other heads: JaSMin {med[(m, 'jasmin')]:.3g} vs Castin "
                         f"{med[(m, 'castin')]:.3g} vs Kim {med[(m, 'kim')]:.3g}{lo}")
    word = f"is still **{after}**" if before == after else f"becomes **{after}** (with them: {before})"
    return (f"Without the heads with constant attention the per-head verdict {word}: "
            + "; ".join(parts) + ".")


def _ratio_agg(table):
    """median / max / min / count of bound / truth per (model, scope, method)."""
    return table.groupby(["model", "scope", "method"])["ratio"].agg(["median", "max", "min", "count"]).reset_index()


def leaderboard_verdict(agg) -> str:
    """Fig. 6's claim (JaSMin Thm 3 is the tightest of Kim/Specformer, Castin and JaSMin per head, on a JaSMin-trained
    ViT) checked on every model by median ratio, plus App. C (the sqrt(N)-order plug-in) against Thm 3."""
    head = agg[agg["scope"] == "head"].set_index(["model", "method"])["median"]
    models = list(dict.fromkeys(m for m, _ in head.index))
    have = [m for m in models if all((m, k) in head.index for k in ("kim", "castin", "jasmin"))]
    ok = [m for m in have if head[(m, "jasmin")] <= min(head[(m, "kim")], head[(m, "castin")])]
    trained = [m for m in have if "JaSMin" in m]
    trained_ok = bool(trained) and set(trained) <= set(ok)
    word = ("reproduced" if trained_ok and len(ok) == len(have)
            else "partly reproduced" if ok else "not reproduced")
    parts = [f"{m}: JaSMin {head[(m, 'jasmin')]:.3g} vs Castin {head[(m, 'castin')]:.3g} vs Kim "
             f"{head[(m, 'kim')]:.3g}" for m in have]
    out = (f"Verdict (Fig. 6: JaSMin's Thm 3 the tightest of the paper's three bounds per head, median bound / truth; "
           f"paper: JaSMin-trained ViT-B on CIFAR-100): **{word}** on {len(ok)} of {len(have)} models"
           + (" including the JaSMin-trained ViT" if trained_ok else "") + ". " + "; ".join(parts) + ".")
    lo = [m for m in have if (m, "lofast_fine") in head.index and head[(m, "lofast_fine")] < head[(m, "jasmin")]]
    if lo:
        out += (f" Beyond the paper: LoFAST's exact eps -> 0 limit is tighter still on {len(lo)} of {len(have)} "
                "models.")
    ac = [m for m in have if (m, "jasmin_appc") in head.index]
    if ac:
        r = [head[(m, "jasmin_appc")] / head[(m, "jasmin")] for m in ac]
        out += (f" JaSMin App. C's sqrt(N)-order bound (plug-in) over Thm 3, median ratio per model: "
                f"{min(r):.2f}-{max(r):.2f} (below 1: tighter; App. C claims the better order in N).")
    return out
