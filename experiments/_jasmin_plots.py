"""Presentation of the JaSMin experiments (imported only inside figures()/summary(), so plot edits never
invalidate computed cells)."""
from __future__ import annotations

import math
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


def attention_map_figures(table, outdir) -> List:
    """JaSMin Fig. 2: the attention row of the query of interest per layer/head, and full maps (MiniLM)."""
    import numpy as np

    from harness import plotting

    paths = []
    for name in sorted(set(table["model"])):
        t = table[table["model"] == name]
        m = t[t["map"] == "query"]
        qrows = m[m["key"] == 0]
        L, H = int(m["layer"].max()) + 1, int(m["head"].max()) + 1
        n = int(m["n"].iloc[0])
        q0 = int(m["query"].iloc[0])
        fig, axes = plotting.figure(L, H, width=1.25 * H + 0.5, height=1.3 * L + 0.4, squeeze=False)
        for r in range(L):
            for c in range(H):
                ax = axes[r, c]
                row = m[(m["layer"] == r) & (m["head"] == c)].sort_values("key")["attn"].to_numpy()
                qq = qrows[(qrows["layer"] == r) & (qrows["head"] == c)]
                if name == "vit":
                    side = int(round(math.sqrt(n - 1)))
                    ax.imshow(row[1:].reshape(side, side), cmap="viridis")
                    qi = q0 - 1
                    ax.add_patch(__import__("matplotlib").patches.Rectangle(
                        (qi % side - 0.5, qi // side - 0.5), 1, 1, fill=False, ec="black", lw=1.2))
                else:
                    ax.bar(np.arange(n), row, width=1.0, color=plotting.color("exact"))
                    ax.axvline(q0, color=plotting.color("jasmin"), lw=0.8)
                ax.set_xticks([])
                ax.set_yticks([])
                ax.grid(False)
                if len(qq):
                    ax.set_title(f"{qq['jsm_exact'].iloc[0]:.3f} / {qq['g1'].iloc[0]:.3f}", fontsize=6)
                if c == 0:
                    ax.set_ylabel(f"layer {r}", fontsize=6)
        fig.suptitle(f"{name}: attention of query {q0} (mean over samples); title = exact ||J_sm|| / g_1",
                     fontsize=8)
        paths += plotting.save(fig, outdir, f"attention_maps_{name}")

        fm = t[t["map"] == "full"]
        if len(fm):
            Ls = sorted(set(fm["layer"].astype(int)))
            fig, axes = plotting.figure(1, len(Ls), width=1.8 * len(Ls), height=2.0, squeeze=False)
            for i, l in enumerate(Ls):
                s = fm[fm["layer"] == l]
                M = np.zeros((n, n))
                M[s["query"].astype(int), s["key"].astype(int)] = s["attn"]
                axes[0, i].imshow(M, cmap="viridis")
                axes[0, i].set_title(f"layer {l}, head 0", fontsize=7)
                axes[0, i].grid(False)
                axes[0, i].set_xticks([])
                axes[0, i].set_yticks([])
            fig.suptitle(f"{name}: full attention maps of one Alice window (n = {n})", fontsize=8)
            paths += plotting.save(fig, outdir, f"attention_full_{name}")

    return paths


def jsm_rows_figures(table, outdir) -> List:
    """JaSMin Fig. 2 (curves): exact ||J_sm(P_i)|| and g_1(P_i) per query row, every layer/head."""
    from harness import plotting

    paths = []
    for name in sorted(set(table["model"])):
        qrows = table[table["model"] == name]
        L, H = int(qrows["layer"].max()) + 1, int(qrows["head"].max()) + 1
        fig, axes = plotting.figure(L, H, width=1.25 * H + 0.5, height=1.1 * L + 0.4, squeeze=False, sharey=True)
        for r in range(L):
            for c in range(H):
                ax = axes[r, c]
                s = qrows[(qrows["layer"] == r) & (qrows["head"] == c)].sort_values("query")
                ax.plot(s["query"], s["g1"], color=plotting.color("g1"), lw=0.8, label="g_1")
                ax.plot(s["query"], s["jsm_exact"], color=plotting.color("exact"), lw=0.8, ls="--", label="exact")
                ax.set_xticks([])
                ax.tick_params(labelsize=5)
                if c == 0:
                    ax.set_ylabel(f"layer {r}", fontsize=6)
        axes[0, 0].legend(fontsize=5)
        fig.suptitle(f"{name}: per query row, exact ||J_sm(P_i)|| (dashed) and g_1(P_i) (mean over samples)",
                     fontsize=8)
        paths += plotting.save(fig, outdir, f"jsm_vs_g1_{name}")

    return paths


def ratio_hist_figure(table, outdir) -> List:
    """JaSMin Fig. 3: histogram of g_1(P_i) / ||J_sm(P_i)|| over every row of every sample."""
    from harness import plotting

    h = table
    models = sorted(set(h["model"]))
    fig, axes = plotting.figure(1, len(models), squeeze=False)
    for i, name in enumerate(models):
        s = h[h["model"] == name]
        ax = axes[0, i]
        ax.bar(s["bin_lo"], s["count"], width=(s["bin_hi"] - s["bin_lo"]), align="edge",
               color=plotting.color("g1"))
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_yscale("log")
        ax.set_xlabel("g_1(P_i) / ||J_sm(P_i)||")
        ax.set_ylabel("rows")
        ax.set_title(f"{name} (Fig. 3 analogue)")
    return plotting.save(fig, outdir, "ratio_hist")

