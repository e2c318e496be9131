"""What `attnlip analyze` writes and prints: table.csv/.parquet, distribution.csv, heatmap.png, layers.png,
summary.md, report.json, and the compact per-layer table. Reads the DataFrame of harness.analyze.core only."""
from __future__ import annotations

import json
import math
from typing import List, Optional

import numpy as np
import pandas as pd

from harness.store.atomic import staged_files

SHORT = {"truth": "truth", "truth_upper": "KW", "kim": "Kim", "castin": "Castin", "jasmin": "JaSMin",
         "jasmin_g1": "JaSMin-g1", "lofast_fine": "LoF-fine", "lofast_coarse": "LoF-coarse",
         "lofast_sharp": "LoF-sharp", "lofast_refined": "LoF-refined", "lofast_naive": "LoF-naive",
         "naive": "cert-naive", "coarse": "cert-coarse", "fine": "cert-fine", "sharp": "cert-sharp",
         "refined": "cert-refined", "second_order": "cert-2nd-order", "best": "cert-best", "pgd": "PGD"}


def _layer_methods(df) -> List[str]:
    """Layer-scope methods: the bounds on the local constant first (as the table holds them), then the eps-ball
    certificates in the registry's order (naive ... second_order, best, plug-ins), then PGD."""
    d = df[(df["scope"] == "layer") & (df["kind"].isin(["exact", "upper", "lower"]))]
    methods = list(dict.fromkeys(d["method"]))
    ball = set(d.loc[d["bounds"] == "eps-ball", "method"]) if "bounds" in d else set()
    from harness.bounds import registry

    order = {n: i for i, n in enumerate(registry.bound_names(what=["ball_change"]))}
    return [m for m in methods if m not in ball] + sorted(ball, key=lambda m: (m == "pgd", order.get(m, len(order)), m))


def nonfinite_undeclared(df, lower_too: bool = False) -> np.ndarray:
    """Rows whose upper bound (or exact value; every row with lower_too) is not a finite number without being
    declared n/a: a bound not proven for a score map carries NaN and a note "n/a: why"; any other NaN or infinity
    guarantees nothing."""
    value = pd.to_numeric(df["value"], errors="coerce").to_numpy(dtype=float)
    upper = (df["kind"].astype(str) != "lower").to_numpy() if "kind" in df and not lower_too else True
    declared = df["note"].fillna("").astype(str).str.startswith("n/a").to_numpy() if "note" in df else False
    return upper & ~np.isfinite(value) & ~declared


def honest_convergence(df):
    """`df` with `converged` False on lower-bound rows (PGD) whose value is 0 or less at a positive truth: an
    attack that found no change at all has not converged to anything, whatever its iteration said."""
    if "kind" in df and "converged" in df:
        value = pd.to_numeric(df["value"], errors="coerce")
        truth = pd.to_numeric(df["truth"], errors="coerce")
        stuck = (df["kind"].astype(str) == "lower") & (value <= 0) & (truth > 0)
        df.loc[stuck, "converged"] = False
    return df


def unsound(df):
    """Rows that break their guarantee: `sound` False (an upper bound below the truth), or an upper bound or exact
    value that is not a finite number without being declared n/a (a bound not proven for this score map carries
    NaN and a note "n/a: why"; any other NaN or infinity guarantees nothing, e.g. a plug-in returning NaN)."""
    return df[~df["sound"].astype(bool).to_numpy() | nonfinite_undeclared(df)]


def distribution(df):
    """Per (layer, head, method): inputs, median and worst ratio (worst: largest for upper bounds, smallest for
    lower ones), min ratio, median value and truth over the inputs."""
    g = df.groupby(["layer", "head", "method", "kind"], sort=False)
    out = g.agg(inputs=("input", "nunique"), median_ratio=("ratio", "median"), max_ratio=("ratio", "max"),
                min_ratio=("ratio", "min"), median_value=("value", "median"), median_truth=("truth", "median"),
                sound=("sound", "all")).reset_index()
    out["worst_ratio"] = np.where(out["kind"] == "lower", out["min_ratio"], out["max_ratio"])
    return out


def layer_table(df) -> str:
    """Compact per-layer text table: truth and the ratio of each layer-scope bound (median over inputs;
    'median/worst' when several inputs)."""
    d = df[df["scope"] == "layer"]
    methods = [m for m in _layer_methods(df) if m != "truth"]
    many = d["input"].nunique() > 1
    head = ["layer", "n", "truth"] + [SHORT.get(m, m) for m in methods]
    lines = []
    for l, dl in d.groupby("layer"):
        t = dl[dl["method"] == "truth"]
        row = [str(l), str(int(t["n_tokens"].median())), f"{t['value'].median():.4g}"]
        for m in methods:
            r = dl[dl["method"] == m]["ratio"]
            kind = dl[dl["method"] == m]["kind"].iloc[0]
            worst = r.min() if kind == "lower" else r.max()
            cell = f"{r.median():.3g}" + (f"/{worst:.3g}" if many else "")
            if r.isna().all():
                cell = "n/a"  # not proven for this layer's map; the reason is listed under the table
            if not dl[dl["method"] == m]["sound"].all():
                cell += "!"
            row.append(cell)
        lines.append(row)
    w = [max(len(h), *(len(r[i]) for r in lines)) for i, h in enumerate(head)]
    fmt = lambda r: "  ".join(c.rjust(w[i]) for i, c in enumerate(r))
    note = "ratio = bound / true ||J|| of the layer" + (" (median/worst over inputs)" if many else "")
    na = d[d["note"].str.startswith("n/a")] if "note" in d else d.iloc[:0]
    why = [f"n/a {SHORT.get(m, m)}: {g['note'].iloc[0][5:]}" for m, g in na.groupby("method", sort=False)
           if m in methods]
    return "\n".join([note + "; '!' = below the truth somewhere (unsound)", fmt(head), *map(fmt, lines), *why])


def _log_ticks(lo: float, hi: float) -> List[float]:
    """Colour-bar ticks for a log scale on [lo, hi]: the values 1, 2, 5 x 10^k inside (at most ~6 of them), else
    4 geometrically spaced values (a narrow range such as 1.07-1.09)."""
    e0, e1 = math.floor(math.log10(lo)), math.ceil(math.log10(hi))
    for subs in ((1, 2, 5), (1, 3), (1,)):
        t = [k * 10.0 ** e for e in range(e0, e1 + 1) for k in subs if lo <= k * 10.0 ** e <= hi]
        if 2 <= len(t) <= 6:
            return t
    if len(t) > 6:
        step = math.ceil(len(t) / 6)
        return t[::step]
    return list(np.geomspace(lo, hi, 4))


def _distinct_labels(values: List[float]) -> List[str]:
    """Tick labels with as many significant digits as it takes for neighbours to differ (3 to 8)."""
    for digits in range(3, 9):
        labels = [f"{x:.{digits}g}" for x in values]
        if len(set(labels)) == len(labels):
            return labels
    return labels


def heatmap(df, path, meta: Optional[dict] = None) -> None:
    """Layers x heads, ratio bound / true ||J_head|| (median over inputs) per head-scope upper bound, each panel on
    its own log colour scale and colour bar: one scale shared by bounds 1e1 and 1e9 x the truth would paint every
    tight bound the same colour. Panel titles give the median and the range of the ratio."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LogNorm

    d = df[(df["scope"] == "head") & (df["kind"] == "upper")]
    methods = list(dict.fromkeys(d["method"]))
    if not methods:
        return
    cols = min(4, len(methods))
    rows = math.ceil(len(methods) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols + 0.5, 2.9 * rows + 0.8), squeeze=False,
                             constrained_layout=True)
    med = d.groupby(["method", "layer", "head"])["ratio"].median()
    for ax, m in zip(axes.flat, methods):
        t = med[m].unstack("head")
        v = t.values.astype(float)
        fin = v[np.isfinite(v) & (v > 0)]
        name = SHORT.get(m, m)
        if not len(fin):
            ax.set_title(f"{name}: no finite ratio", fontsize=9)
            ax.axis("off")
            continue
        lo, hi = float(fin.min()), float(fin.max())
        if hi < lo * 1.02:  # (near) constant: widen so the colour bar has a range
            lo, hi = lo / 1.01, hi * 1.01
        im = ax.imshow(np.ma.masked_invalid(np.where(v > 0, v, np.nan)), aspect="auto", cmap="viridis",
                       norm=LogNorm(vmin=lo, vmax=hi))
        ax.set_title(f"{name}: median {np.median(fin):.3g}x ({fin.min():.3g}-{fin.max():.3g})", fontsize=9)
        ax.set_xlabel("head")
        ax.set_ylabel("layer")
        ax.set_yticks(range(len(t.index)), [str(i) for i in t.index])
        step = max(1, math.ceil(len(t.columns) / 12))  # whole heads only
        ax.set_xticks(range(0, len(t.columns), step), [str(c) for c in list(t.columns)[::step]])
        cb = fig.colorbar(im, ax=ax)
        ticks = _log_ticks(lo, hi)
        cb.set_ticks(ticks, labels=_distinct_labels(ticks), minor=False)
        cb.set_label("bound / true ||J_head||", fontsize=8)
        cb.ax.minorticks_off()
        cb.ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(methods):]:
        ax.axis("off")
    many = "input" in df and df["input"].nunique() > 1
    fig.suptitle("Per-head tightness: bound / true local Lipschitz constant of the head ("
                 + ("median over inputs; " if many else "") + "log colour scale, one per panel)\n" + _about(df, meta),
                 fontsize=10)
    layer_only = [m for m in dict.fromkeys(df.loc[(df["scope"] == "layer") & (df["kind"] == "upper")
                                                  & (df.get("bounds", "local") == "local"), "method"])
                  if m not in methods and m != "truth_upper"]
    gloss = _glossary(methods, int(15 * fig.get_figwidth()))
    if layer_only:
        gloss += "\nNot per head (bounds of the whole layer only): " + ", ".join(SHORT.get(m, m) for m in layer_only)
    foot = _footnote(fig, gloss)
    fig.get_layout_engine().set(rect=(0, foot, 1, 1 - foot))  # (left, bottom, width, height)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _styles(k: int) -> List[dict]:
    """k distinct styles: 20 colours (tab20, pairs split apart), then the marker and line style change as well."""
    import matplotlib

    tab = matplotlib.colormaps["tab20"].colors
    colours = tab[0::2] + tab[1::2]  # the strong ten first
    marks, lines = "osD^vP*Xh<", ("-", "--", ":", "-.")
    return [dict(color=colours[i % 20], marker=marks[i % 10], ls=lines[(i // 10) % 4], ms=4) for i in range(k)]


def _coincident(series: dict, rtol: float = 0.10) -> dict:
    """method -> (the earlier method it is drawn on, its largest relative distance from it) for the series within
    rtol of an earlier one at every layer: on a log axis spanning decades, 10 % is a pixel or two, so such series
    hide each other and the legend must say so (distance 0 within 1e-9: equal)."""
    same, seen = {}, []
    for m, s in series.items():
        for other in seen:
            o = series[other]
            if not o.index.equals(s.index):
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                dist = float(np.max(np.abs(s.values - o.values) / np.abs(o.values)))
            if dist <= rtol:  # relative to the earlier series, as the label states it
                same[m] = (same[other][0] if other in same else other, 0.0 if dist <= 1e-9 else dist)
                break
        seen.append(m)
    return same


def _label(m: str) -> str:
    """What a method's short name stands for: the registry's label, or analyze's own (state.EXTRA)."""
    from harness.analyze.state import EXTRA
    from harness.bounds import registry

    if m in EXTRA:
        return EXTRA[m][3]
    for scope in ("layer", "head"):
        try:
            return registry.get(m, scope).label
        except (KeyError, ValueError):
            continue
    return m


def _glossary(methods, width: int) -> str:
    """'KW = ...; Kim = ...' for the short names a figure shows, wrapped to `width` characters."""
    import textwrap

    return "\n".join(textwrap.wrap("; ".join(f"{SHORT.get(m, m)} = {_label(m)}" for m in methods), width))


def _footnote(fig, text: str) -> float:
    """Write `text` small at the bottom of `fig`; returns the figure fraction its lines take (plus one line of
    margin), which the layout must keep free."""
    fig.text(0.01, 0.005, text, fontsize=7, va="bottom", ha="left")
    return 0.12 * (text.count("\n") + 2) / fig.get_figheight()


def _about(df, meta: Optional[dict]) -> str:
    """'model: 1 input of 25 tokens, float64': what a figure was computed on."""
    meta = meta or {}
    k = int(df["input"].nunique()) if "input" in df else 0
    toks = "/".join(str(int(t)) for t in sorted(set(df["n_tokens"]))) if "n_tokens" in df else "?"
    return f"{meta.get('model', 'model')}: {k} input{'s' if k != 1 else ''} of {toks} tokens, {meta.get('dtype', '')}"


def layer_plot(df, path, meta: Optional[dict] = None) -> None:
    """Ratio bound / true ||J_F(X)|| per layer (median over inputs) of every layer-scope method, log scale, in two
    panels: bounds on the local constant (the same numbers as layer_table and the README's table), and the eps-ball
    certificates delta(X, eps) / eps with PGD. Every series has its own colour and marker; a series within 10 % of
    an earlier one (or of the truth line) is drawn with a large open marker and labelled "(= that one)" or "(~ that
    one, within x %)", so coincident bounds stay visible. The title names the model and inputs (meta), a footnote
    what each short name stands for."""
    import matplotlib.pyplot as plt

    d = df[df["scope"] == "layer"]
    methods = [x for x in _layer_methods(df) if x != "truth"]
    kinds = d.drop_duplicates("method").set_index("method")["bounds"] if "bounds" in d else pd.Series(dtype=str)
    panels = [("local", [m for m in methods if kinds.get(m) != "eps-ball"]),
              ("eps-ball", [m for m in methods if kinds.get(m) == "eps-ball"])]
    panels = [p for p in panels if p[1]] or [("local", [])]
    fig, axes = plt.subplots(1, len(panels), figsize=(7.2 * len(panels) + 1.5, 4.4), squeeze=False)
    shown: List[str] = []
    for ax, (what, ms) in zip(axes[0], panels):
        ax.axhline(1.0, color="black", lw=2.5, label="truth (= 1)")
        series = {}
        for m in ms:
            s = d[d["method"] == m].groupby("layer")["ratio"].median()
            s = s[np.isfinite(s) & (s > 0)]
            if len(s):
                series[m] = s
        same = _coincident({"truth": pd.Series(1.0, index=next(iter(series.values())).index), **series}
                           if series else {})
        for st, (m, s) in zip(_styles(len(series)), series.items()):
            label = SHORT.get(m, m)
            if m in same:
                other, dist = same[m]
                st = dict(st, ms=9, mfc="none", mew=1.4, ls="none")
                label += (f" (= {SHORT.get(other, other)})" if not dist
                          else f" (~ {SHORT.get(other, other)}, within {100 * dist:.2g} %)")
            ax.plot(s.index, s.values, label=label, **st)
        shown += [m for m in series if m not in shown]
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_xticks(sorted(set(d["layer"])))
        ax.grid(True, which="major", axis="y", alpha=0.3)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7)
        if what == "eps-ball":
            eps = df.attrs.get("eps")
            ax.set_ylabel("delta(X, eps) / eps / true ||J_F(X)||")
            ax.set_title("eps-ball certificates" + (f" at eps = {eps:g}" if eps else "") + " and PGD", fontsize=10)
        else:
            ax.set_ylabel("bound / true ||J_F(X)|| (median over inputs)")
            ax.set_title("Bounds on the local Lipschitz constant", fontsize=10)
    fig.suptitle("Attention layers: each bound as a multiple of the true local Lipschitz constant\n"
                 + _about(df, meta), fontsize=11)
    fig.tight_layout(rect=(0, _footnote(fig, _glossary(shown, int(16 * fig.get_figwidth()))), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def summary_md(df, meta: dict) -> str:
    bad = unsound(df)
    dist = distribution(df)
    lines = [f"# attnlip analyze: {meta.get('model')}", "",
             f"- weights: `{meta.get('source')}` ({meta.get('architecture')}, causal={meta.get('causal')})",
             f"- inputs: {df['input'].nunique()}, tokens per input: {sorted(set(df['n_tokens']))}",
             f"- layers: {meta.get('layers')}, dtype {meta.get('dtype')}, device {meta.get('device')}, "
             f"eps = {meta.get('eps')}, fail_prob = {meta.get('fail_prob')}",
             f"- wall time: {meta.get('total_s', float('nan')):.1f} s"]
    lines += [f"- note: {n}" for n in meta.get("notices") or []] + [""]
    if len(bad):
        names = sorted(set(bad["method"]))
        lines += [f"## UNSOUND: {', '.join(names)}", "",
                  f"{len(bad)} row(s) below the truth (upper bounds) or above their reference (lower bounds):", "",
                  "| method | input | layer | head | value | truth |", "|---|---|---|---|---|---|"]
        lines += [f"| {r.method} | {r.input} | {r.layer} | {r.head} | {r.value:.6g} | {r.truth:.6g} |"
                  for r in bad.head(50).itertuples()]
        lines.append("")
    else:
        lines += ["All bounds sound at every input (upper bounds >= the truth, lower bounds <= their reference).", ""]
    lines += ["## Tightness per method (ratio = value / truth over every input, layer and head)", "",
              "| method | scope | kind | bounds | median ratio | worst ratio |", "|---|---|---|---|---|---|"]
    for (m, sc), g in df[df["kind"] != "info"].groupby(["method", "scope"], sort=False):
        kind, bounds = g["kind"].iloc[0], g["bounds"].iloc[0]
        worst = g["ratio"].min() if kind == "lower" else g["ratio"].max()
        lines.append(f"| {m} | {sc} | {kind} | {bounds} | {g['ratio'].median():.4g} | {worst:.4g} |")
    lines += ["", "## Per layer", "", "```", layer_table(df), "```", "",
              f"Per-head distribution over inputs: distribution.csv ({len(dist)} rows). "
              "Figures: heatmap.png (layers x heads, ratio per head-level bound, one log colour scale per panel), "
              "layers.png (the ratios of the table above per layer)."]
    return "\n".join(lines) + "\n"


def write(df, outdir, meta: dict) -> dict:
    """Write every output into `outdir`; returns the report dict (also report.json). All are written into a temp
    folder first and then moved into place (store.atomic.staged_files): a failed write (a full disk) leaves the
    files `outdir` held before, complete, and no partial one."""
    bad = unsound(df)
    rep = dict(meta, sound=bool(len(bad) == 0), unsound_methods=sorted(set(bad["method"])),
               inputs=int(df["input"].nunique()), rows=int(len(df)),
               methods={m: dict(median_ratio=float(g["ratio"].median()), max_ratio=float(g["ratio"].max()),
                                min_ratio=float(g["ratio"].min()), sound=bool(g["sound"].all()))
                        for m, g in df[df["scope"] == "layer"].groupby("method")})
    with staged_files(outdir) as out:
        df.to_csv(out / "table.csv", index=False)
        df.to_parquet(out / "table.parquet", index=False)
        distribution(df).to_csv(out / "distribution.csv", index=False)
        heatmap(df, out / "heatmap.png", meta)
        layer_plot(df, out / "layers.png", meta)
        (out / "summary.md").write_text(summary_md(df, meta))
        (out / "report.json").write_text(json.dumps(rep, indent=2, default=str))
    return rep
