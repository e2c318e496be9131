"""Figures of jasmin_attention_maps, jasmin_jsm_rows and jasmin_g1_ratio: attention maps, exact ||J_sm|| against
g_1 per (layer, head) row, and the g_1 / exact ratio (presentation: read result tables only)."""
from __future__ import annotations

import math
from typing import List


def _layer_head_rows(ax, M, L, H, label):
    """Heat map with one row per (layer, head), layers separated and named on the y axis."""
    im = ax.imshow(M, aspect="auto", cmap="viridis", interpolation="nearest")
    ax.set_yticks([r * H + (H - 1) / 2 for r in range(L)], [f"L{r}" for r in range(L)])
    for r in range(1, L):
        ax.axhline(r * H - 0.5, color="white", lw=0.6)
    ax.set_ylabel(f"layer, then head 0-{H - 1} within it")
    ax.grid(False)
    ax.figure.colorbar(im, ax=ax, shrink=0.9, label=label)
    return im


def _pairs(m, col):
    """(L, H, (L*H) x n matrix of `col` by (layer, head) row and query/key column)."""
    import numpy as np

    L, H = int(m["layer"].max()) + 1, int(m["head"].max()) + 1
    idx = "key" if "key" in m.columns and col == "attn" else "query"
    n = int(m[idx].max()) + 1
    M = np.full((L * H, n), np.nan)
    M[(m["layer"] * H + m["head"]).astype(int), m[idx].astype(int)] = m[col]
    return L, H, M


def attention_map_figures(table, outdir) -> List:
    """JaSMin Fig. 2: the attention row of the query of interest per layer/head, and full maps (MiniLM)."""
    import matplotlib.patches
    from matplotlib.colors import PowerNorm
    import numpy as np

    from harness import plotting

    from experiments.figures.common import model_name, ref, setting_note

    paths = []
    for name in sorted(set(table["model"])):
        t = table[table["model"] == name]
        m = t[t["map"] == "query"]
        qrows = m[m["key"] == 0].sort_values(["layer", "head"])
        L, H = int(m["layer"].max()) + 1, int(m["head"].max()) + 1
        n, q0 = int(m["n"].iloc[0]), int(m["query"].iloc[0])
        title = f"{model_name(name)}: attention of query {q0} (mean over samples), exact ||J_sm|| vs g_1"
        if name == "vit" and L * H <= plotting.MAX_PANELS:
            side = int(round(math.sqrt(n - 1)))
            fig, axes = plotting.grid(L * H, ncols=H, panel=(2.0, 2.0))
            vmax = float(m.loc[m["key"] != 0, "attn"].max())  # one colour scale for every panel (patch keys)
            for ax, ((r, c), g) in zip(axes, m.groupby(["layer", "head"])):
                im = ax.imshow(g.sort_values("key")["attn"].to_numpy()[1:].reshape(side, side), cmap="viridis",
                               vmin=0.0, vmax=vmax)
                ax.add_patch(matplotlib.patches.Rectangle(((q0 - 1) % side - 0.5, (q0 - 1) // side - 0.5), 1, 1,
                                                          fill=False, ec="red", lw=1.2, label="query patch"))
                qq = qrows[(qrows["layer"] == r) & (qrows["head"] == c)]
                ax.set_title(f"L{r} head {c}: {qq['jsm_exact'].iloc[0]:.3f} / {qq['g1'].iloc[0]:.3f}", fontsize=7)
                ax.set_xlabel("patch column")
                ax.set_ylabel("patch row")
                ax.grid(False)
            fig.colorbar(im, ax=axes, shrink=0.6, label="attention weight")
            note = ("Panel title: exact ||J_sm(P_q)|| / g_1(P_q). Token 0 is CLS, so query q is patch q - 1 (red "
                    "box). One colour scale for all panels; the CLS key (the row's remaining weight) is not drawn. "
                    + setting_note(table, [name]))
        else:
            fig, axes = plotting.figure(1, 2, width=10.0, height=max(4.0, 0.075 * L * H + 1.5), squeeze=False,
                                        gridspec_kw=dict(width_ratios=[3, 1.4]))
            a, b = axes[0]
            _layer_head_rows(a, _pairs(m, "attn")[2], L, H, f"attention weight P[{q0}, j]")
            a.axvline(q0, color="red", lw=0.8, label=f"query position {q0}")
            a.set_xlabel("key token j")
            rows = np.arange(len(qrows))
            b.plot(qrows["g1"], rows, "o", ms=3, color=plotting.color("g1"), label="g_1(P_q) (JaSMin bound)")
            b.plot(qrows["jsm_exact"], rows, "x", ms=3, color=plotting.color("exact"), label="exact ||J_sm(P_q)||")
            b.set_ylim(len(rows) - 0.5, -0.5)
            b.set_yticks(a.get_yticks(), [])
            b.set_ylabel("same rows")
            b.set_xlabel("softmax Jacobian norm")
            note = "Text: one Alice window per sample. " + setting_note(table, [name])
        paths += plotting.finish(fig, outdir, f"attention_maps_{name}", ref(table), title, note=note)

        fm = t[t["map"] == "full"]
        if len(fm):
            layers = sorted(set(fm["layer"].astype(int)))
            fig, axes = plotting.grid(len(layers), ncols=3, panel=(3.0, 2.9))
            for ax, lay in zip(axes, layers):
                s = fm[fm["layer"] == lay]
                M = np.zeros((n, n))
                M[s["query"].astype(int), s["key"].astype(int)] = s["attn"]
                im = ax.imshow(M, cmap="viridis", norm=PowerNorm(0.5, vmin=0, vmax=1))  # weights ~1/n visible
                ax.set_title(f"layer {lay}, head 0", loc="left")
                ax.set_xlabel("key token j")
                ax.set_ylabel("query token i")
                ax.grid(False)
            fig.colorbar(im, ax=axes, shrink=0.7, label="attention weight P[i, j] (square-root scale)")
            paths += plotting.finish(fig, outdir, f"attention_full_{name}", ref(table),
                                     f"{model_name(name)}: head 0's full attention map in each layer, one Alice "
                                     f"window (n = {n})",
                                     note="Colour on a square-root scale, so that weights near the uniform 1/n "
                                     f"= {1 / n:.3f} stay visible beside the sink column 0 ([CLS]) that takes "
                                     "most of the weight in several layers. " + setting_note(table, [name]))
    return paths


def jsm_rows_figures(table, outdir) -> List:
    """JaSMin Fig. 2 (curves): exact ||J_sm(P_i)|| and g_1(P_i) per query row, every layer/head: heat maps of all
    (layer, head) rows, then the curves of at most 16 of them (per layer the loosest and the tightest head)."""
    from harness import plotting

    from experiments.figures.common import facets, model_name, ref, setting_note

    paths = []
    for name in sorted(set(table["model"])):
        q = table[table["model"] == name]
        L, H, ex = _pairs(q, "jsm_exact")
        g1 = _pairs(q, "g1")[2]
        fig, axes = plotting.figure(1, 2, width=10.0, height=max(4.0, 0.075 * L * H + 1.5), squeeze=False)
        _layer_head_rows(axes[0, 0], ex, L, H, "exact ||J_sm(P_i)||")
        ratio = _pairs(q, "ratio_mean")[2] if "ratio_mean" in q.columns else g1 / ex
        _layer_head_rows(axes[0, 1], ratio, L, H, "g_1(P_i) / ||J_sm(P_i)||, mean over samples (>= 1)")
        for ax, t in zip(axes[0], ("(a) exact softmax Jacobian norm", "(b) looseness of the g_1 bound")):
            ax.set_xlabel("query token i")
            plotting.caption(ax, t)
        title = f"{model_name(name)}: per query row, exact ||J_sm(P_i)|| and g_1(P_i) (mean over samples)"
        note = setting_note(table, [name])
        paths += plotting.finish(fig, outdir, f"jsm_vs_g1_{name}", ref(table), title, note=note)

        mean = q.assign(r=q["g1"] / q["jsm_exact"]).groupby(["layer", "head"])["r"].mean()
        pick = list(mean.index) if len(mean) <= plotting.MAX_PANELS else \
            sorted({(lay, h) for lay in range(L) for h in (mean[lay].idxmax(), mean[lay].idxmin())})
        sel = q.set_index(["layer", "head"]).loc[list(pick)].reset_index()

        def draw(ax, k, s):
            s = s.sort_values("query")
            ax.plot(s["query"], s["g1"], color=plotting.color("g1"), lw=0.9, label="g_1(P_i) (JaSMin bound)")
            ax.plot(s["query"], s["jsm_exact"], color=plotting.color("exact"), lw=0.9, ls="--",
                    label="exact ||J_sm(P_i)||")
            ax.set_xlabel("query token i")
            ax.set_ylabel("||J_sm|| (norm)")
            tag = ""
            if len(pick) < len(mean):  # per layer the loosest and the tightest head: say which this is
                tag = " (loosest)" if k[1] == mean[k[0]].idxmax() else " (tightest)"
            plotting.caption(ax, f"L{k[0]} h{k[1]}{tag}: g_1/exact {mean[k]:.2f}")

        few = "" if len(pick) == len(mean) else ", per layer the loosest and the tightest head"
        note_rows = ("Panel title: mean over query rows of g_1 / exact, both per row the mean over samples. " + note)
        paths += facets(sel, ["layer", "head"], outdir, f"jsm_vs_g1_{name}_rows", draw, title + few,
                        note=note_rows, panel=(3.0, 2.3))
    return paths


def ratio_hist_figure(table, outdir) -> List:
    """JaSMin Fig. 3: histogram of g_1(P_i) / ||J_sm(P_i)|| over every row of every sample."""
    from harness import plotting

    from experiments.figures.common import facets, model_name, setting_note

    def draw(ax, k, s):
        ax.bar(s["bin_lo"], s["count"], width=(s["bin_hi"] - s["bin_lo"]), align="edge",
               color=plotting.color("g1"), label="attention rows")
        ax.axvline(1.0, color="black", lw=0.8, label="ratio 1 (g_1 exact)")
        ax.set_yscale("log")
        ax.set_xlabel("g_1(P_i) / ||J_sm(P_i)||")
        ax.set_ylabel("number of attention rows (log)")
        ax.set_title(model_name(k[0]), loc="left")

    return facets(table, ["model"], outdir, "ratio_hist", draw, "How loose JaSMin's g_1 is, row by row",
                  ncols=3, note=setting_note(table))
