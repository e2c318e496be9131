"""Presentation of the JaSMin experiments (imported only inside figures()/summary(), so plot edits never
invalidate computed cells)."""
from __future__ import annotations

from typing import Dict, List


def _labels(table) -> Dict[str, str]:
    """method -> label, registry order first, then any other method in the table (e.g. a plug-in)."""
    from harness.bounds import registry

    lab = {k: v for k, v in registry.labels().items() if k != "truth"}
    for m in dict.fromkeys(table["method"]):
        lab.setdefault(m, m)
    return {k: v for k, v in lab.items() if k in set(table["method"])}


def leaderboard_figures(table, outdir) -> List:
    import numpy as np

    from harness import plotting

    labels = _labels(table)
    methods = list(labels)
    r = table.dropna(subset=["ratio"])
    r = r[r["ratio"] > 0]
    models = list(dict.fromkeys(table["model"]))
    fig, axes = plotting.figure(2, len(models), width=3.0 * len(models) + 1, height=6.0, squeeze=False)
    for j, m in enumerate(models):
        for i, scope in enumerate(("head", "layer")):
            ax = axes[i, j]
            sel = r[(r["model"] == m) & (r["scope"] == scope)]
            data = [np.log10(sel[sel["method"] == k]["ratio"].to_numpy()) for k in methods]
            keep = [k for k, dd in enumerate(data) if len(dd)]
            if keep:
                bp = ax.boxplot([data[k] for k in keep], positions=[k + 1 for k in keep], orientation="horizontal",
                                showfliers=False, patch_artist=True)
                for patch, k in zip(bp["boxes"], keep):
                    patch.set_facecolor(plotting.color("bound_" + methods[k]))
                    patch.set_alpha(0.6)
            ax.set_yticks(range(1, len(methods) + 1), [labels[k] for k in methods] if j == 0 else [""] * len(methods),
                          fontsize=6)
            ax.set_ylim(0.5, len(methods) + 0.5)
            ax.axvline(0, color="black", lw=0.8)
            ax.set_xlabel("log10(bound / true local Lipschitz)")
            ax.set_title(f"{m}, per {scope}")
    paths = plotting.save(fig, outdir, "bound_leaderboard")

    t = r[(r["scope"] == "head") & (r["model"] != "vit")]  # ratio vs n (text models, per head, median)
    if len(t):
        tm = list(dict.fromkeys(t["model"]))
        fig, axes = plotting.figure(1, len(tm), squeeze=False)
        for j, m in enumerate(tm):
            ax = axes[0, j]
            for k in methods:
                s = t[(t["model"] == m) & (t["method"] == k)].groupby("n")["ratio"].median()
                if len(s):
                    ax.plot(s.index, s.values, marker="o", label=labels[k], color=plotting.color("bound_" + k))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sequence length n")
            ax.set_ylabel("median bound / true (per head)")
            ax.set_title(m)
        axes[0, 0].legend(fontsize=5)
        paths += plotting.save(fig, outdir, "bound_leaderboard_vs_n")
    return paths


def leaderboard_summary(table) -> str:
    labels = _labels(table)
    g = table.groupby(["model", "scope", "method"])["ratio"]
    agg = g.agg(["median", "max", "min", "count"]).reset_index()
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
    return "\n".join(lines)
