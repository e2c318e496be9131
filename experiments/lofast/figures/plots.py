"""Presentation of the lofast_* experiments (figures and summary tables from result tables only). Imported
only inside figures()/summary(), so editing it re-renders without recomputing any cell."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.bounds import registry as _registry
from harness.models.certify import BOUNDS  # noqa: E402 - the certificates' bounds (registry order)

# legend label and table column of every certificate, from the registry (a plug-in ball-change bound included)
BOUND_LABELS = {b: _registry.labels()[b] for b in BOUNDS}
_PALETTE = [dict(color="#999999", linestyle=":"), dict(color="#0072B2", linestyle="--"),
            dict(color="#0072B2", linestyle="-"), dict(color="#56B4E9", linestyle="-"),
            dict(color="#D55E00", linestyle="-"), dict(color="#009E73", linestyle="-."),
            dict(color="#CC79A7", linestyle="-.")]
BOUND_STYLE = {b: _PALETTE[i % len(_PALETTE)] for i, b in enumerate(BOUNDS)}
BOUND_STYLE.update(pgd=dict(color="#555555", linestyle="-", marker="x"),
                   pgd_plain=dict(color="#AAAAAA", linestyle="-", marker="."))
COLUMN = {**{b: f"bound_{b}" for b in BOUNDS}, "pgd": "pgd", "pgd_plain": "pgd_plain"}


def config_label(t) -> "pd.Series":
    """'L2-h8-c0.5' per row from the layers / heads / vo_norm columns ('L2-h8-c0.5-p4' where the table holds
    several patch sizes, LoFAST Fig. 2's patch-size axis)."""
    lab = ("L" + t.layers.astype(int).astype(str) + "-h" + t.heads.astype(int).astype(str) + "-c"
           + t.vo_norm.map(lambda v: f"{float(v):g}"))
    if "patch" in t and t.patch.nunique() > 1:
        lab = lab + "-p" + t.patch.astype(int).astype(str)
    return lab


CONFIG_NOTE = ("Panel 'a layers, h heads, c': a Lipschitz transformer with a layers and h heads whose W^V and W^O "
               "are each constrained to spectral norm <= c (tables write it L<a>-h<h>-c<c>, with -p<patch> for the "
               "patch size where several are shown; 28x28 images: patch 4, 7, 14 give 49, 16, 4 patches).")


def _config_title(t) -> str:
    r = t.iloc[0]
    a = int(r.layers)
    patch = f", patch {int(r.patch)}" if "patch" in t else ""
    return f"{a} layer{'s' * (a != 1)}, {int(r.heads)} heads, c = {float(r.vo_norm):g}{patch}"


def plot_certified(table, outdir: Path, stem: str, xlabel: str, paper: str, ours: str):
    """Certified accuracy vs eps per config (4 bounds + PGD + clean) and the radius distributions."""
    from harness import plotting

    from experiments.figures.common import facets

    table = table.assign(config=config_label(table)).sort_values("config", kind="stable")
    curves = table[table.kind == "curve"]
    note = (f"Paper: {paper}. Here: {ours}, {int(curves.n_points.iloc[0])} test points (CPU budget). "
            + CONFIG_NOTE)

    def draw_curves(ax, k, t):
        for b in (b for b in BOUNDS if (t.bound == b).any()):
            s = t[t.bound == b].sort_values("eps")
            ax.plot(s.eps, s.certified_acc, label=f"certified, {BOUND_LABELS[b]}", **BOUND_STYLE[b])
        s = t[t.bound == "fine"].sort_values("eps")
        ax.plot(s.eps, s.pgd_acc, label="PGD accuracy (empirical upper limit)", **BOUND_STYLE["pgd"])
        ax.axhline(float(s.clean_acc.iloc[0]), color="#000000", lw=0.7, ls="--", label="clean accuracy")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("accuracy (fraction of test points)")
        ax.set_ylim(0, 1)
        plotting.caption(ax, _config_title(t))

    def draw_radius(ax, k, t):
        for b in (b for b in BOUNDS if (t.bound == b).any()):
            r = np.sort(t[t.bound == b].radius.to_numpy())
            ax.plot(r, 1 - np.arange(len(r)) / max(len(r), 1), label=f"certified, {BOUND_LABELS[b]}",
                    **BOUND_STYLE[b])
        ax.set_xlabel("certified l2 radius r")
        ax.set_ylabel("fraction of points with radius >= r")
        plotting.caption(ax, _config_title(t))

    paths = facets(curves, ["config"], outdir, f"{stem}_curves", draw_curves, "Certified and empirical "
                   "accuracy vs perturbation size", note=note, ncols=3)
    return paths + facets(table[table.kind == "radius"], ["config"], outdir, f"{stem}_radius", draw_radius,
                          "Distribution of certified radii", note=note, ncols=3)


def certified_summary(table, eps_ref: float) -> str:
    """Markdown table: clean / certified / PGD accuracy at eps_ref, radii, ||M||/xi, soundness violations."""
    table = table.assign(config=config_label(table))
    curves = table[table.kind == "curve"]
    rad = table[table.kind == "radius"]
    shown = [b for b in BOUNDS if (curves.bound == b).any()]  # tables made before "refined" existed lack it
    radii = [b for b in shown if b != "naive"]
    lines = [f"| config | clean acc (full test) | certified acc at eps={eps_ref:g}: {' / '.join(shown)} | "
             f"PGD acc at eps={eps_ref:g} | median radius {' / '.join(radii)} | largest grid eps with cert > 0 (sharp) | "
             "mean ||M||/xi | violations |", "|---|---|---|---|---|---|---|---|"]
    for cfgname in sorted(curves.config.unique()):
        t = curves[curves.config == cfgname]
        sel = lambda b: t[(t.bound == b) & np.isclose(t.eps, eps_ref)]  # noqa: E731
        r = rad[rad.config == cfgname]
        med = {b: float(r[r.bound == b].radius.median()) for b in radii}
        f = t[(t.bound == "sharp") & (t.certified_acc > 0)]
        cert = [sel(b).certified_acc for b in shown]
        pgd = sel("fine").pgd_acc
        fmt = lambda c: f"{float(c.iloc[0]):.3f}" if len(c) else "-"  # noqa: E731
        lines.append(f"| {cfgname} | {t.clean_acc.iloc[0]:.3f} ({t.test_acc_full.iloc[0]:.3f}) | "
                     + " / ".join(fmt(c) for c in cert) + f" | {fmt(pgd)} | "
                     + " / ".join(f"{med[b]:.3f}" for b in radii) + " | "
                     f"{f.eps.max() if len(f) else 0:.2f} | {t.m_over_xi_mean.iloc[0]:.3f} | "
                     f"{int(t[t.bound.isin(shown)].violations.sum())} |")
    lines += ["", f"Certificates computed in {table.certificate_dtype.iloc[0]} whatever --dtype says (soundness); "
              "clean margins and PGD in the run's dtype.", "", guarantee_line(curves)]
    if "refined" in radii:
        lines += ["", refined_gain_line(rad)]
    plug = plugin_lines(table, eps_ref)
    return "\n".join(lines + (["", plug] if plug else []))


def plugin_lines(table, eps_ref: float) -> str:
    """One line per plug-in ball-change bound (a `bound` outside the registry's built-in certificates): certified
    accuracy at eps_ref, median radius, and whether PGD broke a point it certified (UNSOUND)."""
    curves, rad = table[table.kind == "curve"], table[table.kind == "radius"]
    out = []
    for b in (b for b in curves.bound.unique() if b not in BOUNDS):
        c = curves[(curves.bound == b) & np.isclose(curves.eps, eps_ref)]
        v = int(curves[curves.bound == b].violations.sum())
        out.append(f"Plug-in bound {b}: certified acc at eps={eps_ref:g} {float(c.certified_acc.mean()):.3f} (mean "
                   f"over configs), median radius {float(rad[rad.bound == b].radius.median()):.3f}, "
                   + (f"UNSOUND: {v} certified points broken by PGD" if v else "0 certified points broken by PGD"))
    return "\n".join(out)


def refined_gain_line(rad) -> str:
    """Median certified radius of the per-ball softmax constant against c = 1/2 ("sharp"), over every config."""
    med = {b: float(rad[rad.bound == b].radius.median()) for b in ("sharp", "refined")}
    gain = med["refined"] / med["sharp"] - 1 if med["sharp"] > 0 else float("nan")
    return (f"Per-ball softmax constant (refined, docs/math.md §1): median certified radius {med['refined']:.3f} "
            f"against {med['sharp']:.3f} with c = 1/2 (sharp), {gain:+.1%}; same estimates, same guarantee as sharp.")


def guarantee_line(curves) -> str:
    """What the certified accuracies above rest on: the largest per-input failure probability per bound (column
    `guarantee`: a union bound over the Kuczynski-Wozniakowski estimates of zeta and ||M_l|| a bound uses)."""
    if "guarantee" not in curves:
        return "Failure probability of the certificates: not recorded in this table (column `guarantee` missing)."
    from harness.bounds.lofast import FAIL_PROB
    from harness.models.certify import CERTIFY_EPS

    g = {b: float(curves[curves.bound == b].guarantee.max()) for b in BOUNDS if (curves.bound == b).any()}
    parts = [f"{b} {'0 (deterministic)' if v == 0 else f'{v:.1e}'}" for b, v in g.items()]
    return ("Guarantee: certificates use certified upper estimates of zeta (coarse, fine, sharp, refined) and of "
            "||M_l|| (fine, sharp, refined): "
            "Lanczos from a seeded Gaussian start long enough for the Kuczynski-Wozniakowski bound with relative "
            f"eps {CERTIFY_EPS:g} on the squared norm, each estimate failing with probability <= {FAIL_PROB:g} over the "
            "start. A point certified here is robust with probability >= 1 - p, where p (a union bound over the "
            "estimates of every layer; the worst configuration) is: "
            + ", ".join(parts) + ".")


def certified_verdict(table, eps_ref: float) -> str:
    """One line on Fig. 2's claims that carry over to other data: non-zero certified accuracy with the coarse bound,
    the clean vs certified trade-off along ||W^V||, ||W^O|| (c), eq. 9 far weaker, and no certified point broken."""
    t = table[(table.kind == "curve") & np.isclose(table.eps, eps_ref)]
    if not len(t):
        return ""
    by = t.assign(config=config_label(t)).pivot_table(index="config", columns="bound", values="certified_acc")
    nonzero = bool((by["coarse"] > 0).all())
    base = t[(t.layers == t.layers.max()) & (t.heads == t.heads.max())]
    if "patch" in base:
        base = base[base.patch == base.patch.mode().iloc[0]]
    cs = sorted(base.vo_norm.unique())
    clean = [float(base[base.vo_norm == c].test_acc_full.iloc[0]) for c in cs]
    cert = [float(base[(base.vo_norm == c) & (base.bound == "coarse")].certified_acc.iloc[0]) for c in cs]
    trade = (len(cs) > 1 and all(a <= b for a, b in zip(clean, clean[1:]))
             and all(a >= b for a, b in zip(cert, cert[1:])))
    naive_gap = float((by["coarse"] - by["naive"]).max())
    viol = int(table[(table.kind == "curve") & table.bound.isin(BOUNDS)].violations.sum())
    word = "partly reproduced" if nonzero and trade and viol == 0 else "not reproduced"
    lead = "what carries over to Fashion-MNIST holds" if word.startswith("partly") else "on Fashion-MNIST"
    return (f"Verdict (Fig. 2): **{word}**: {lead}: the paper's coarse bound "
            f"certifies {'every' if nonzero else 'not every'} configuration at eps = {eps_ref:g}; along c = "
            + " / ".join(f"{c:g}" for c in cs) + " clean accuracy " + " / ".join(f"{v:.3f}" for v in clean)
            + " and certified accuracy " + " / ".join(f"{v:.3f}" for v in cert)
            + f" ({'the paper' + chr(39) + 's trade-off' if trade else 'no monotone trade-off'}); eq. 9 (naive) "
            f"certifies up to {100 * naive_gap:.0f} points less; {viol} certified points broken by PGD. The levels "
            "(CIFAR-10, non-zero up to 36/255) are not comparable: other data, models and training.")


def patch_verdict(table, eps_ref: float) -> str:
    """LoFAST Fig. 2's patch-size axis: clean and certified (sharp, fine) accuracy at eps_ref per patch size of the
    configuration trained at several patch sizes (empty when the table has one patch size)."""
    if "patch" not in table:
        return ""
    t = table[table.kind == "curve"]
    multi = t.groupby(["layers", "heads", "vo_norm"]).patch.nunique()
    if not (multi > 1).any():
        return ""
    key = multi[multi > 1].index[0]
    t = t[(t.layers == key[0]) & (t.heads == key[1]) & (t.vo_norm == key[2])]
    parts = []
    for p in sorted(t.patch.unique()):
        s = t[(t.patch == p) & np.isclose(t.eps, eps_ref)]
        get = lambda b: (float(s[s.bound == b].certified_acc.iloc[0])  # noqa: E731
                         if len(s[s.bound == b]) else float("nan"))
        n_tok = (28 // int(p)) ** 2
        parts.append(f"patch {int(p)} ({n_tok} patches): clean {float(t[t.patch == p].clean_acc.iloc[0]):.3f}, "
                     f"certified at eps={eps_ref:g} fine {get('fine'):.3f} / sharp {get('sharp'):.3f}")
    return (f"Patch size (LoFAST Fig. 2 varies it too), L{int(key[0])}-h{int(key[1])}-c{float(key[2]):g}: "
            + "; ".join(parts) + ". The paper reports the trade-off, not a per-patch number to compare against.")


def input_norm_ratios(table):
    """Mean bound / pgd per (source, input_scale, eps > 0): columns ratio_<bound>."""
    shown = [v for v in BOUNDS if COLUMN[v] in table]  # tables made before "refined" existed lack it
    cols = [COLUMN[v] for v in shown]
    g = table[table.eps > 0].groupby(["source", "input_scale", "eps"])[cols + ["pgd"]].mean()
    for v, c in zip(shown, cols):
        g[f"ratio_{v}"] = g[c] / g["pgd"]
    return g.reset_index()


SOURCES = {"vit": "LipViT, layer 0", "minilm": "MiniLM-L6, layer 0"}


def plot_input_norm(table, outdir: Path):
    """Fig. 4: bound / PGD at the largest eps vs the input scale per source, and bound and PGD vs eps per scale."""
    from experiments.figures.common import facets, lipvit_name, ref

    r = input_norm_ratios(table)
    e = r.eps.max()
    note = (f"Inputs: unit-norm token rows scaled by s. Layer 0 of the {lipvit_name(table)} (2 layers, 8 heads, "
            "c = 0.5) and of pretrained MiniLM-L6 (biases dropped; SST-2 tokens). Paper: a CIFAR-10 ViT layer.")

    def draw_ratio(ax, k, t):
        t = t.sort_values("input_scale")
        for v in (v for v in BOUNDS if f"ratio_{v}" in t):
            ax.plot(t.input_scale, t[f"ratio_{v}"], marker="o", label=BOUND_LABELS[v], **BOUND_STYLE[v])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.axhline(1.0, color="#555555", lw=0.7, label="ratio 1 (bound = PGD)")
        ax.set_xlabel("input scale s (rows of norm s)")
        ax.set_ylabel(f"bound / PGD at eps = {e:.3g}")
        ax.set_title(SOURCES.get(k[0], k[0]), loc="left")

    def draw_curves(ax, k, t):
        for v in (v for v in list(BOUNDS) + ["pgd_plain", "pgd"] if COLUMN[v] in t):  # older tables: no refined
            m = t.groupby("eps")[COLUMN[v]].mean()
            m = m[m > 0]  # log axis: eps = 0 has no change
            ax.plot(m.index, m.values, label={"pgd": "PGD + Lemma 1 start", "pgd_plain": "PGD (random starts)"}
                    .get(v) or BOUND_LABELS[v], **BOUND_STYLE[v])
        ax.set_yscale("log")
        ax.set_xlabel("perturbation size eps (Frobenius norm)")
        ax.set_ylabel("||F(X') - F(X)||_F (mean)")
        ax.set_title(f"{SOURCES.get(k[0], k[0])}, input scale s = {k[1]:g}", loc="left")

    first = table[table.source == sorted(table.source.unique())[0]].sort_values("input_scale")
    return (facets(r[np.isclose(r.eps, e)].sort_values("source"), ["source"], outdir, "lofast_input_norm_ratio",
                   draw_ratio, "Bound / PGD ratio vs input norm", note=note, ncols=2, ref_text=ref(table))
            + facets(first, ["source", "input_scale"], outdir, "lofast_input_norm_curves", draw_curves,
                     "Upper bounds and PGD lower bounds vs eps, by input scale", note=note, ncols=3))


TIGHTNESS_LABELS = {("delta21", "fine"): "delta21^(1) exact ||M||", ("delta21", "coarse"): "delta21^(2) xi",
                    ("delta21", "sharp"): "delta21^(1), softmax 1/2 (ours)", ("delta21", "pgd"): "PGD",
                    ("delta22", "fine"): "delta22^(1) (eq. 15)", ("delta22", "naive"): "delta22^(2) naive",
                    ("delta22", "pgd"): "PGD",
                    ("delta", "coarse"): "eq. 23 (zeta, xi)", ("delta", "fine"): "eq. 23 exact ||M|| (ours)",
                    ("delta", "sharp"): "exact ||M||, softmax 1/2 (ours)", ("delta", "naive"): "eq. 23 with eq. 9 (naive)",
                    ("delta", "pgd"): "PGD + Lemma 1 start", ("delta", "pgd_plain"): "PGD (random starts)"}


VARIANT_LABELS = {"naive": "naive: delta22^(2) / eq. 23 with eq. 9", "coarse": "paper, xi: delta21^(2) / eq. 23",
                  "fine": "exact ||M||: delta21^(1), delta22^(1) (eq. 15), eq. 23 (ours)",
                  "sharp": "exact ||M||, softmax 1/2 (ours)", "pgd": "PGD lower bound (delta: + Lemma 1 start)",
                  "pgd_plain": "PGD lower bound, random starts"}


def readable(model: str) -> str:
    """'LipViT L2-h8-c0.5 layer 0' -> 'LipViT (2 layers, 8 heads, c = 0.5), layer 0'."""
    import re

    s = re.sub(r"L(\d+)-h(\d+)-c([\d.]+)", r"(\1 layers, \2 heads, c = \3),", str(model))
    return s.replace("all-MiniLM-L6-v2", "MiniLM-L6").replace(" (biases dropped)", ", no biases")


def plot_quantities(table, outdir: Path, stem: str):
    """One panel per (source, quantity): each bound and lower bound vs eps (means over samples)."""
    from harness import plotting

    from experiments.figures.common import facets, lipvit_name

    names = {"delta21": "single head, delta_21", "delta22": "single head, delta_22",
             "delta": "multi-head layer, delta (eq. 23)"}

    def draw(ax, k, t):
        src, q = k
        for v in ["naive", "coarse", "fine", "sharp", "pgd_plain", "pgd"]:
            s = t.groupby("eps")[COLUMN[v]].mean().dropna()
            if len(s) and (q, v) in TIGHTNESS_LABELS:
                ax.plot(s.index, s.values, label=VARIANT_LABELS[v], **BOUND_STYLE[v])
        ax.set_xlabel("perturbation size eps (Frobenius norm)")
        ax.set_ylabel(f"{q} (mean over samples)")
        plotting.caption(ax, f"{readable(t.model.iloc[0]) if 'model' in t else src}\n{names.get(q, q)}")

    t = table.assign(qo=table.quantity.map({"delta21": 0, "delta22": 1, "delta": 2})).sort_values(["source", "qo"])
    return facets(t, ["source", "quantity"], outdir, stem, draw, "Theorem 1's terms: upper bounds vs PGD lower "
                  "bounds", ncols=3, note="Paper: one layer of a CIFAR-10 ViT (4 patches). Here: layer 0 of the "
                  f"{lipvit_name(table)} (2 layers, 8 heads, c = 0.5; 16 patches) and of pretrained MiniLM-L6 "
                  "(biases dropped) on SST-2 tokens; unit-norm token rows. 'ours': bounds added here.")


def tightness_summary(table) -> str:
    lines = ["| source | eps | delta21 fine / coarse / sharp / PGD | delta22 ours / naive / PGD | "
             "delta naive / coarse / fine / sharp / PGD (random starts) / PGD (+ Lemma 1 start) | "
             "Delta_1 = zeta eps (exact) | eq.23 / PGD |", "|---|---|---|---|---|---|---|"]
    for src in sorted(table.source.unique()):
        t = table[table.source == src]
        e = t.eps.max()
        cols = [c for c in COLUMN.values() if c in t]  # tables made before "refined" existed lack its column
        g = t[np.isclose(t.eps, e)].groupby("quantity")[cols].mean()
        f = lambda q, vs: " / ".join(f"{g.loc[q, COLUMN[v]]:.4g}" for v in vs)  # noqa: E731
        lines.append(f"| {src} ({t.model.iloc[0]}) | {e:.2f} | {f('delta21', ['fine', 'coarse', 'sharp', 'pgd'])} | "
                     f"{f('delta22', ['fine', 'naive', 'pgd'])} | "
                     f"{f('delta', ['naive', 'coarse', 'fine', 'sharp', 'pgd_plain', 'pgd'])} | "
                     f"{float(t[np.isclose(t.eps, e) & (t.quantity == 'delta')].zeta.mean()) * e:.4g} | "
                     f"{g.loc['delta', 'bound_coarse'] / g.loc['delta', 'pgd']:.3f} |")
    conv = table[table.quantity == "delta"].converged.astype(bool)
    lines += ["", f"Unconverged Lanczos values (end-to-end rows): {int((~conv).sum())} of {len(conv)}.", "",
              "Means over the samples at the largest eps; H = 0 as in eq. 23. 'PGD (+ Lemma 1 start)' also evaluates "
              "X +- eps v with v the exact maximizer of Delta_1 (a feasible point, so still a lower bound). Paper: for "
              "||X|| controlled and small eps the end-to-end bound is tight (Delta_1 dominates, zeta is exact) while "
              "delta_21 has a visible gap to PGD that matters little because it is O(eps^2). Differences: the paper's "
              "layer comes from a CIFAR-10 ViT with 4 patches; ours from the Fashion-MNIST LipViT (16 patches) and "
              "MiniLM (SST-2 tokens). The paper says ||X||_F = 4 = number of patches *and* unit-projected rows; these "
              "disagree for n > 1 (unit rows give ||X||_F = sqrt(n)); we use unit rows (the model's LayerProject(1) "
              "regime). **Verdict: partly.** At unit rows the end-to-end bound is not tight here (the eq.23 / PGD "
              "column); lofast_tightness_regime finds where it is: at eps = 1e-3 within 10 % once token norms are "
              "<= 0.25 with 4 tokens or <= 0.1 with 16 (ViT within 10 % there for every eps up to 0.1; MiniLM up to "
              "1.26x at eps = 0.1). Delta_2's terms are linear, not quadratic, in eps as eps -> 0, so shrinking eps "
              "alone does not make the bound tight."]
    return "\n".join(lines)
