"""lofast_certified's verdict on LoFAST §5's constraint claim (presentation: reads the result table only): without
W^V, W^O constrained to a fraction of 1, "no meaningful certified robust accuracy could be achieved"."""
from __future__ import annotations

import numpy as np

NEAR_ZERO = 0.05  # "no meaningful certified accuracy": at most 5 points certified at the reference radius


def constraint_verdict(table, eps_ref: float) -> str:
    """Certified accuracy (fine bound) at eps_ref of the configurations with ||W^V||, ||W^O|| <= c >= 1 against the
    same architecture (layers, heads, patch) at c < 1; '' when the table has no c >= 1 configuration."""
    t = table[(table["kind"] == "curve") & (table["bound"] == "fine") & np.isclose(table["eps"], eps_ref)]
    keys = ["layers", "heads"] + (["patch"] if "patch" in t else [])
    free = t[t["vo_norm"] >= 1]
    if not len(free):
        return ""
    parts, lower, zero = [], 0, 0
    for _, row in free.iterrows():
        same = t[(t["vo_norm"] < 1) & np.logical_and.reduce([t[k] == row[k] for k in keys])]
        if not len(same):
            continue
        best = same.loc[same["certified_acc"].idxmax()]
        lower += int(row["certified_acc"] < best["certified_acc"])
        zero += int(row["certified_acc"] <= NEAR_ZERO)
        parts.append(f"c = {row['vo_norm']:g}: {row['certified_acc']:.3f} certified (clean {row['clean_acc']:.3f}) "
                     f"against {best['certified_acc']:.3f} (clean {best['clean_acc']:.3f}) at c = {best['vo_norm']:g}, "
                     f"L{int(row['layers'])}-h{int(row['heads'])}")
    if not parts:
        return ""
    word = ("reproduced" if zero == len(parts) else "partly reproduced" if lower else "not reproduced")
    return (f"Verdict (§5: without W^V, W^O constrained to a fraction of 1 no meaningful certified accuracy; scope: "
            f"the whole certified ViT at eps = {eps_ref:g}, fine bound; stand-in: c = 1, i.e. W^V, W^O only "
            f"1-Lipschitz, for the paper's unconstrained weights, which this certifiable LipViT cannot have; "
            f"'no meaningful' read as at most {100 * NEAR_ZERO:.0f} points): **{word}**: " + "; ".join(parts)
            + f". Lower than the constrained model in {lower} of {len(parts)}, near zero in {zero}.")
