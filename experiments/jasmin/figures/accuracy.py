"""jasmin_sweep's accuracy figure (JaSMin Tables 1-4 analogue): the paper's columns first, then ours beyond them,
split by a dashed line, with the PGD and AutoAttack steps here against the paper's (presentation: reads the result
table only; imported only inside figures())."""
from __future__ import annotations

from typing import List

import numpy as np

from harness import plotting

from experiments.figures.common import dataset_name, ref
from experiments.jasmin.figures.sweep import attack_label, images_note, method_order, method_styles, sweep_note
from experiments.jasmin.figures.sweep_report import PAPER_COLS

PAPER_PGD_STEPS = 4  # JaSMin Tables 1-4 (their captions and §5): PGD with 4 steps, AutoAttack with 10


def attack_steps(table, attack: str) -> str:
    """The iterations `attack` ran with (the table's `steps` column), '/'-joined; '?' when not recorded."""
    v = table.loc[table["attack"] == attack, "steps"].dropna() if "steps" in table.columns else []
    return "/".join(str(int(x)) for x in sorted(set(v))) or "?"


def steps_note(table, paper_cols, extra) -> str:
    """Which columns are the paper's Tables 1-4 and which ours beyond them, and the PGD / AutoAttack steps here
    against the paper's."""
    steps = lambda attack: attack_steps(table, attack)  # noqa: E731
    labels = lambda cs: ", ".join(attack_label(c) for c in cs)  # noqa: E731
    out = (f"Columns left of the dashed line are the paper's Tables 1-4 ({labels(paper_cols)}); right of it, ours "
           f"beyond them: {labels(extra)}. " if paper_cols and extra else
           "Every column is one of the paper's Tables 1-4. " if paper_cols else "No column is one of the paper's. ")
    pgd = steps("pgd")
    if pgd == str(PAPER_PGD_STEPS):
        out += f"PGD here: {pgd} steps, as in the paper. "
    elif pgd != "?":
        out += (f"PGD here: {pgd} steps, the paper's tables: {PAPER_PGD_STEPS} steps, so our PGD bars are not its "
                "attack at the same budget. ")
    if "autoattack" in set(table["attack"]):
        out += (f"AutoAttack here: APGD-CE + APGD-T with {steps('autoattack')} steps (the paper: AutoAttack, 10 "
                "steps). ")
    return out


def accuracy_figure(table, acc, outdir, stem: str = "jasmin_sweep_accuracy") -> List:
    """Tables 1-4 analogue: mean accuracy (+- std over training seeds) per attack and budget, per method; the paper's
    columns first, then ours beyond them (other budgets, l2), split by a dashed line."""
    methods = method_order(table["method"])
    st = method_styles(methods)
    present = set(acc["col"])
    paper_cols = [c for c in PAPER_COLS if c in present]
    extra = [c for c in [f"{k} {e}/255" for k in ("fgsm", "pgd") for e in (2, 4, 8, 16)] if c in present
             and c not in paper_cols]
    extra += sorted(present - set(paper_cols) - set(extra))
    cols = paper_cols + extra
    fig, ax = plotting.figure(1, 1, width=max(7.0, 1.1 * len(cols) + 2), height=3.8)
    w = 0.84 / max(len(methods), 1)
    for i, m in enumerate(methods):
        sub = acc[acc["method"] == m].set_index("col")
        vals = [sub["mean"].get(c, np.nan) for c in cols]
        err = np.nan_to_num([sub["std"].get(c, np.nan) for c in cols])
        one = "seeds" in sub and int(sub["seeds"].max()) == 1  # a single training seed: no spread to show
        ax.bar(np.arange(len(cols)) + (i - (len(methods) - 1) / 2) * w, vals, w, yerr=None if one else err,
               color=st[m]["color"], hatch=st[m]["hatch"], edgecolor="black" if one else "white",
               linewidth=0.6 if one else 0.3, linestyle=":" if one else "-", alpha=0.6 if one else 1.0,
               error_kw=dict(lw=0.6), label=m + (" (1 seed)" if one else ""))
    ax.set_xticks(np.arange(len(cols)), [attack_label(c) for c in cols], rotation=20, ha="right")
    ax.set_xlabel("attack, its norm and budget eps (pixels in [0, 1]: l_inf eps in 1/255, l2 eps over the whole "
                  "image)")
    ax.set_ylabel("test accuracy (%)")
    head = ref(table)
    if paper_cols and extra:  # the paper's columns | ours beyond them, each group headed above its bars
        ax.axvline(len(paper_cols) - 0.5, color="black", ls="--", lw=0.9)
        ax.set_ylim(0, 112)
        ax.set_yticks(range(0, 101, 20))
        pgd = attack_steps(table, "pgd")
        differ = ("" if pgd in ("?", str(PAPER_PGD_STEPS)) else
                  f" (PGD: {pgd} steps here, {PAPER_PGD_STEPS} in the paper)")
        for x, text in (((len(paper_cols) - 1) / 2, f"the paper's Tables 1-4 columns{differ}"),
                        (len(paper_cols) + (len(extra) - 1) / 2, "beyond the paper (ours only)")):
            ax.text(x, 106, text, ha="center", va="center", fontsize=8, fontweight="bold")
        head = f"{head} (left of the dashed line; right of it: beyond the paper)"
    seeds = int(acc["seeds"].max()) if "seeds" in acc else 1
    return plotting.finish(fig, outdir, stem, head, f"Accuracy under attack per training regularizer on "
                           f"{dataset_name(table)} (bars: mean, whiskers: std over up to {seeds} training seeds; "
                           "pale dotted bars rest on one seed)",
                           note=steps_note(table, paper_cols, extra) + sweep_note(table) + images_note(table), ncol=4)
