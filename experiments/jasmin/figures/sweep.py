"""Presentation of the JaSMin training sweep (jasmin_sweep, jasmin_heatmaps, jasmin_jacobian_norm,
jasmin_overhead): one colour / hatch per regularizer, the same in every figure (jasmin_sweep's accuracy figure:
accuracy.py); imported only inside figures()/summary()."""
from __future__ import annotations

from typing import Dict, List

import numpy as np

from harness import plotting

from experiments.figures.common import dataset_name, facets, ref

CODES = ("Codes: 'JaSMin k=K lam=L agg' = penalty L x sum over layers and heads of agg_i log g_1(P_i) (k = 0) or "
         "log(g_1 / g_k)(P_i) (k > 0), agg = mean or max over query rows i; 'Specformer(joint|q|k|v, L)' = "
         "Specformer's spectral penalty L on W^Q, W^K, W^V together, or on one of them only.")


def grid_values(table, col: str) -> str:
    """The distinct integer values of a grid column, '/'-joined ('?' when absent): the scale's settings."""
    vals = sorted({int(v) for v in table[col].dropna()}) if col in table else []
    return "/".join(str(v) for v in vals) or "?"


def fine_tuned(table) -> bool:
    """Whether the rows' ViT was fine-tuned from a checkpoint (the paper scale's `vit_init`), not from scratch."""
    return "vit_init" in table.columns and bool(table["vit_init"].notna().any())


def trained_as(table, detail: bool = False) -> str:
    """How the rows' ViT was trained, as one clause read from the table (the figure notes and the summary both say
    it): fine-tuned from a checkpoint at the paper scale, else trained from scratch. detail: also how the checkpoint
    was adapted and what the paper leaves unstated."""
    def joined(c, sep="/"):
        return sep.join(str(v) for v in dict.fromkeys(table[c].dropna())) if c in table.columns else "?"

    if fine_tuned(table):
        lr = "/".join(f"{v:g}" for v in sorted(set(table["lr"].dropna()))) if "lr" in table.columns else "?"
        adapted = ("the checkpoint's patch embedding resampled, positions interpolated, q/k/v biases removed as the "
                   "paper" if detail else "q/k/v biases removed")
        return (f"a ViT fine-tuned from {joined('vit_init', ' / ')} (patch {grid_values(table, 'patch')}: "
                f"{adapted}) for {grid_values(table, 'train_steps')} {joined('optimizer').upper()} steps of batch "
                f"{grid_values(table, 'batch')} (learning rate {lr}{'; the paper states none' if detail else ''}) "
                "without the paper's horizontal flips, CutMix and MixUp")
    return (f"a {grid_values(table, 'vit_depth')}-layer, {grid_values(table, 'vit_heads')}-head, "
            f"d={grid_values(table, 'vit_d')} ViT (patch {grid_values(table, 'patch')}) trained from scratch for "
            f"{grid_values(table, 'train_steps')} Adam steps")


def sweep_note(table, paper: str = "CIFAR-10 / CIFAR-100") -> str:
    """The substitution (model, data, budget) and the method codes. `paper`: the data of the paper's item the figure
    reproduces (Tables 1-4 cover both CIFARs; Figs. 4 and 5 are CIFAR-100 only)."""
    scratch = not fine_tuned(table)
    used = [str(v) for v in table["data_used"].dropna().unique()] if "data_used" in table.columns else []
    why = (["CIFAR-10 planned, unreachable"] if any("(substitute for cifar10)" in v for v in used) else []) \
        + (["no ViT-B checkpoint offline, CPU budget"] if scratch else [])
    return (f"Paper: ViT-B fine-tuned on {paper}. Here: {trained_as(table)} on {dataset_name(table)}"
            + (f" ({'; '.join(why)}). " if why else ". ") + CODES)


def method_order(methods) -> List[str]:
    """Baseline, then Specformer, then JaSMin entries (each family in label order): the same everywhere."""
    rank = lambda m: (0 if m == "Baseline" else 1 if m.startswith("Specformer") else 2, m)  # noqa: E731
    return sorted(dict.fromkeys(str(m) for m in methods), key=rank)


def method_styles(methods) -> Dict[str, dict]:
    """method -> {color, marker, hatch}, distinct for every method, the same in every sweep figure (the
    Baseline keeps its slot even where a table lacks it)."""
    order = method_order(list(methods) + ["Baseline"])
    return dict(zip(order, plotting.styles(len(order))))


def _bars(ax, methods, values, errors=None):
    """One bar per method in its colour / hatch, method names as x tick labels."""
    st = method_styles(methods)
    x = np.arange(len(methods))
    for i, m in enumerate(methods):
        ax.bar(x[i], values[i], 0.8, yerr=None if errors is None else errors[i], color=st[m]["color"],
               hatch=st[m]["hatch"], edgecolor="white", label=m)
    ax.set_xticks(x, methods, rotation=35, ha="right", fontsize=7)
    ax.set_xlabel("training regularizer")


ATTACKS = {"fgsm": "FGSM", "pgd": "PGD", "autoattack": "AutoAttack (APGD)"}


def attack_label(col: str) -> str:
    """'pgd 4/255' -> 'PGD l_inf 4/255', 'pgd l2=0.5' -> 'PGD l2 0.5': every group names its norm."""
    attack, _, budget = str(col).partition(" ")
    if not budget:
        return col
    name = ATTACKS.get(attack, attack)
    if budget.startswith("l2="):
        return f"{name} l2 {budget[3:]}"
    return f"{name} l_inf {budget}" if budget.endswith("/255") else f"{name} {budget}"


def images_note(table) -> str:
    """' Images: ...' where AutoAttack ran on fewer test images than the other attacks (its bars are not on the
    same images, so one may sit above a weaker attack's); '' otherwise."""
    if "n_images" not in table or "attack" not in table:
        return ""
    n = table.groupby("attack")["n_images"].max()
    aa, rest = n.get("autoattack"), n.drop("autoattack", errors="ignore")
    if aa is None or rest.empty or aa >= rest.min():
        return ""
    return (f" Images: AutoAttack on the first {int(aa)} test images, the other attacks on {int(rest.max())}: "
            "its bars are on fewer images, so they can sit above a weaker attack's.")


HEAT_QUANTITIES = (("g1_mean", "jasmin_sweep_g1_heatmaps", "Regularized quantity g_1 per layer and head, per training "
                   "regularizer", "mean over rows and images of g_1(P_i)"),
                  ("log_g1_over_g10", "jasmin_sweep_log_g1_g10_heatmaps", "JaSMin k=10's regularized quantity "
                   "log(g_1 / g_10) per layer and head, per training regularizer",
                   "mean over rows and images of ln(g_1 / g_10)(P_i)"))


def heatmaps_figure(table, outdir) -> List:
    """Fig. 5 analogue: per layer and head, one panel per method (training seed 0), the regularized quantity of each
    JaSMin variant: mean g_1(P_i) (k = 0) and mean log(g_1 / g_10)(P_i) (k = 10), one image each, one colour
    scale per image (from 0)."""
    h = seed_zero(table)
    order = {m: i for i, m in enumerate(method_order(h["method"]))}
    h = h.assign(_rank=h["method"].map(order)).sort_values("_rank", kind="stable")
    paths = []
    for col, stem, title, label in HEAT_QUANTITIES:
        if col not in h.columns:
            continue
        # the colour scale ends at the 95th percentile, so that one outlying cell does not flatten the rest; the
        # cells above it carry their value
        vals = h[col].dropna()
        vmax = float(np.percentile(vals, 95)) if len(vals) else 1.0
        vmax = vmax if vmax > 0 else float(vals.max()) if len(vals) and vals.max() > 0 else 1.0
        ims = []

        def draw(ax, k, sub, col=col, vmax=vmax, ims=ims):
            M = np.full((int(sub["layer"].max()) + 1, int(sub["head"].max()) + 1), np.nan)
            M[sub["layer"].astype(int), sub["head"].astype(int)] = sub[col]
            ims.append(ax.imshow(M, vmin=0, vmax=vmax, cmap="viridis"))
            for i, j in zip(*np.nonzero(np.nan_to_num(M, nan=-np.inf) > vmax)):
                ax.text(j, i, f"{M[i, j]:.3g}", ha="center", va="center", fontsize=7, color="black")
            ax.set_xticks(range(M.shape[1]))
            ax.set_yticks(range(M.shape[0]))
            ax.set_xlabel("head")
            ax.set_ylabel("layer")
            ax.set_title(k[0], loc="left", fontsize=8)
            ax.grid(False)

        above = vals.max() > vmax if len(vals) else False

        def colorbar(fig, axes, ims=ims, label=label, above=above):
            fig.colorbar(ims[-1], ax=axes, shrink=0.8, label=label, extend="max" if above else "neither")

        clip = (f"Colour scale 0 to {vmax:.3g} (the 95th percentile of all cells); cells above it are labelled with "
                "their value. ") if above else ""
        paths += facets(h, ["method"], outdir, stem, draw, title, note="Training seed 0 of each setting. " + clip
                        + heatmap_note(h) + sweep_note(table, "CIFAR-100 (Fig. 5: CIFAR-100 only)"),
                        after=colorbar, panel=(2.6, 2.4))
    return paths


def seed_zero(table):
    """The rows of training seed 0 (the heat maps show one trained model per setting)."""
    return table[table["train_seed"] == 0] if "train_seed" in table.columns else table


def heatmap_note(table) -> str:
    """What a one-hot or uniform layer looks like in these maps, with the numbers of any JaSMin k=0 model (seed 0)."""
    h = seed_zero(table)
    out = ("g_1 is 0 on a one-hot row and 1/n on a uniform one (max weight 1/n); log(g_1/g_10) is near 0 on both. ")
    k0 = h[h["method"].astype(str).str.startswith("JaSMin k=0")] if "p_max_mean" in h.columns else h.iloc[:0]
    if len(k0):
        by = k0.groupby("layer")[["p_max_mean", "g1_mean"]].mean()
        hot = by[by["p_max_mean"] > 0.99]
        if len(hot):
            rest = by.drop(hot.index)
            n = int(k0["n_tokens"].iloc[0]) if "n_tokens" in k0.columns else 0
            out += (f"JaSMin k=0 (penalty on log g_1, unbounded below) made layer{'s' if len(hot) > 1 else ''} "
                    f"{', '.join(str(int(l)) for l in hot.index)} one-hot (mean max weight "
                    f"{hot['p_max_mean'].min():.3f}, g_1 {hot['g1_mean'].max():.1e})"
                    + (f" and the other layers near uniform (max weight {rest['p_max_mean'].min():.3f}-"
                       f"{rest['p_max_mean'].max():.3f}" + (f", 1/n = {1 / n:.3f})" if n else ")") if len(rest) else "")
                    + ": driving one layer's rows to one-hot lowers the penalty without bound. ")
    return out


def jacobian_norm_figure(table, outdir) -> List:
    """Fig. 4 analogue: distribution of the whole model's Jacobian norm per method."""
    methods = method_order(table["method"])
    st = method_styles(methods)
    fig, ax = plotting.figure(1, 1, width=max(6.0, 0.55 * len(methods) + 2), height=4.0)
    bp = ax.boxplot([table[table["method"] == m]["jacobian_norm"].to_numpy() for m in methods], showfliers=True,
                    patch_artist=True, positions=range(len(methods)), medianprops=dict(color="black"))
    for patch, m in zip(bp["boxes"], methods):
        patch.set(facecolor=st[m]["color"], hatch=st[m]["hatch"], alpha=0.7)
    seeds = "train_seed" if "train_seed" in table.columns else None
    labels, dots = [], []
    for i, m in enumerate(methods):
        t = table[table["method"] == m]
        k = t[seeds].nunique() if seeds else 1
        labels.append(f"{m}\n({k} seed{'s' if k != 1 else ''} x {len(t) // max(k, 1)} images)")
        if seeds:  # each training seed's median, beside the pooled box
            med = t.groupby(seeds)["jacobian_norm"].median().to_numpy()
            dots += ax.plot(i + 0.26 + 0.07 * np.arange(len(med)), med, "D", color="black", ms=3.5, zorder=3,
                            label="median of one training seed")  # seeds side by side: close medians stay apart
    ax.set_xticks(range(len(methods)), labels, rotation=35, ha="right", fontsize=7)
    ax.set_xlabel("training regularizer")
    ax.set_yscale("log")
    ax.set_ylabel("||J|| of blocks + head, per image (log)")
    if dots:
        ax.legend(handles=dots[:1], loc="best", fontsize=7)
    return plotting.finish(fig, outdir, "jasmin_sweep_jacobian_norm", ref(table), "Whole-model Jacobian spectral "
                           "norm per training regularizer", note="Box: quartiles over the evaluation images of every "
                           "training seed, pooled; whiskers 1.5 IQR, circles beyond; diamonds: each seed's median, "
                           "seeds in order left to right. "
                           + sweep_note(table, "CIFAR-100 (Fig. 4: CIFAR-100 only)"), legend=False)


def overhead_figure(table, outdir) -> List:
    """Regularizer cost: median extra time per training step over training seeds (bars), each seed a dot."""
    rows = table[table["source"] == "interleaved"]
    o = rows.groupby("method")["overhead"].median()
    o = o.reindex(method_order(o.index))
    fig, ax = plotting.figure(1, 1, width=max(6.0, 0.55 * len(o) + 2), height=4.0)
    _bars(ax, list(o.index), 100 * o.to_numpy())
    dots = []
    for i, m in enumerate(o.index):
        v = 100 * rows.loc[rows["method"] == m, "overhead"].to_numpy()
        dots += ax.plot(np.full(len(v), i), v, "o", color="black", ms=3.5, zorder=3, label="one training seed")
    ax.axhline(0.0, color="grey", lw=0.6)
    ax.legend(handles=dots[:1], loc="best", fontsize=7)
    ax.set_ylabel("extra time per training step (%)")
    return plotting.finish(fig, outdir, "jasmin_overhead", "Measures the regularizer cost of JaSMin (Yudin et al.) "
                           "§5 (no figure in the paper)", "Regularizer overhead (batch 128): median over training seeds "
                           "(bars), each seed's interleaved timing (dots)", note=sweep_note(table), legend=False)


def seed_note(table) -> str:
    """What the training seeds say about Fig. 4's differences: per setting, the median Jacobian norm of each seed's
    model against the baseline's seed range, and the clean accuracy where a regularizer costs it."""
    if not {"train_seed", "jacobian_norm", "method"} <= set(table.columns):
        return ""
    per = table.groupby(["method", "train_seed"]).agg(norm=("jacobian_norm", "median"),
                                                       acc=("test_acc_1000", "first"))
    base = [m for m in per.index.get_level_values(0).unique() if str(m).lower().startswith("baseline")]
    if not base:
        return ""
    b = per.loc[base[0]]
    lo, hi, acc0 = float(b.norm.min()), float(b.norm.max()), float(b.acc.mean())
    lines = []
    for m in per.index.get_level_values(0).unique():
        if m == base[0]:
            continue
        s = per.loc[m]
        where = ("below every baseline seed" if s.norm.max() < lo else "above every baseline seed"
                 if s.norm.min() > hi else "inside the baseline's seed range" if s.norm.min() >= lo
                 and s.norm.max() <= hi else "overlapping the baseline's seed range")
        cost = acc0 - float(s.acc.mean())
        lines.append(f"| {m} | {len(s)} | " + ", ".join(f"{v:.3g}" for v in s.norm) + f" | {where} | "
                     + (f"{100 * cost:+.1f}" if abs(cost) >= 0.005 else "0") + " |")
    return (f"\n**What the seeds say.** Per training seed, the median whole-model Jacobian norm of its model; the "
            f"baseline's {len(b)} seeds give " + ", ".join(f"{v:.3g}" for v in b.norm)
            + f" (range {lo:.3g}-{hi:.3g}), so a setting whose seeds fall inside that range is not distinguishable "
            "from the baseline at this number of seeds. Accuracy cost: baseline's mean clean accuracy (1,000 test "
            "images) minus the setting's, in points.\n\n| setting | seeds | median norm per seed | against the "
            "baseline | accuracy cost |\n|---|---|---|---|---|\n" + "\n".join(lines) + "\n\nA setting that costs "
            "many points of accuracy (an under-fitted model) says little about the regularizer at equal accuracy; "
            "single-seed settings can only be placed against the baseline's range.")
