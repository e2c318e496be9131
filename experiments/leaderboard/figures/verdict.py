"""bound_leaderboard's verdict on JaSMin Fig. 6's ordering (presentation: reads the result table only).

Fig. 6 (JaSMin App. C) compares the per-head bounds of Kim/Specformer, Castin and JaSMin on one ViT at one sequence
length and finds JaSMin's the tightest. The leaderboard's text models run at several lengths n, and the ordering of
two bounds can change with n (App. C: Thm 3 depends on n through ||X||^2 <= n R^2, worst case O(n), Castin's bound is
O(sqrt(n))), so the verdict judges the ordering pooled over n *and* at every n, and names each n where two of the
paper's bounds swap places.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

PAPER_BOUNDS = ("jasmin", "castin", "kim")  # Fig. 6's bounds: JaSMin Thm 3, Castin Thm 3.3, Kim/Specformer Thm 1
NAMES = {"jasmin": "JaSMin", "castin": "Castin", "kim": "Kim", "lofast_fine": "LoFAST fine"}
PAIRS = (("jasmin", "castin"), ("jasmin", "kim"), ("castin", "kim"))  # the pairs whose order a crossing reports


def ratio_agg(table):
    """median / max / min / count of bound / truth per (model, scope, method), pooled over every n of a model."""
    return table.groupby(["model", "scope", "method"])["ratio"].agg(["median", "max", "min", "count"]).reset_index()


def per_n(table) -> Dict[str, Dict[int, Dict[str, float]]]:
    """model -> {n: {method: median per-head bound / truth}}, only for the models that ran at several n."""
    h = table[table["scope"] == "head"]
    out: Dict[str, Dict[int, Dict[str, float]]] = {}
    for m, g in h.groupby("model", sort=False):
        if g["n"].nunique() < 2:
            continue
        med = g.groupby(["n", "method"])["ratio"].median()
        out[str(m)] = {int(n): {k: float(v) for k, v in med[n].items()} for n in sorted(set(g["n"].astype(int)))}
    return out


def _tighter(vals: Dict[str, float], a: str, b: Optional[str] = None) -> bool:
    """Whether bound `a` is at most every other paper bound (or at most `b` alone) in `vals`."""
    others = [b] if b else [k for k in PAPER_BOUNDS if k != a]
    return all(k in vals for k in [a, *others]) and vals[a] <= min(vals[k] for k in others)


def crossings(pooled: Dict[str, Dict[str, float]], byn) -> List[Tuple[str, int, str, str]]:
    """(model, n, lower, upper) for every n at which two of the paper's bounds are in the opposite order from the
    model's pooled medians: `lower` is below `upper` at that n although it is above it pooled."""
    out = []
    for m, ns in byn.items():
        for a, b in PAIRS:
            if a not in pooled.get(m, {}) or b not in pooled.get(m, {}):
                continue
            pa, pb = pooled[m][a], pooled[m][b]
            for n, v in ns.items():
                if a in v and b in v and (v[a] - v[b]) * (pa - pb) < 0:
                    out.append((m, n, *((a, b) if v[a] < v[b] else (b, a))))
    return out


def _crossing_text(cross, pooled, byn, name=str) -> str:
    """'gpt2 at n = 64: Castin 707 below JaSMin 766 (pooled over n = 16, 64: JaSMin 308 below Castin 524)';
    name(model) writes the model."""
    parts = []
    for m, n, lo, up in cross:
        v, p = byn[m][n], pooled[m]
        first, second = (lo, up) if p[lo] < p[up] else (up, lo)
        parts.append(f"{name(m)} at n = {n}: {NAMES[lo]} {v[lo]:.3g} below {NAMES[up]} {v[up]:.3g} (pooled over n = "
                     f"{', '.join(map(str, byn[m]))}: {NAMES[first]} {p[first]:.3g} below {NAMES[second]} "
                     f"{p[second]:.3g})")
    return "; ".join(parts)


def crossing_text(table, name=str) -> str:
    """The per-n crossings of the paper's bounds in `table` (head scope), as text; '' where there is none."""
    agg = ratio_agg(table)
    head = agg[agg["scope"] == "head"]
    pooled = {str(m): dict(zip(g["method"], g["median"])) for m, g in head.groupby("model", sort=False)}
    byn = per_n(table)
    return _crossing_text(crossings(pooled, byn), pooled, byn, name)


def leaderboard_verdict(table) -> str:
    """Fig. 6's claim (JaSMin Thm 3 is the tightest of Kim/Specformer, Castin and JaSMin per head, on a JaSMin-trained
    ViT) checked on every model by median ratio, pooled over n and at every n of a model that ran at several (a
    model counts only where it holds at each n), with every per-n crossing of two of the paper's bounds named;
    plus LoFAST's eps -> 0 limit and App. C (the sqrt(N)-order plug-in) against Thm 3."""
    agg = ratio_agg(table)
    head = agg[agg["scope"] == "head"]
    pooled = {str(m): dict(zip(g["method"], g["median"])) for m, g in head.groupby("model", sort=False)}
    byn = per_n(table)
    have = [m for m in pooled if all(k in pooled[m] for k in PAPER_BOUNDS)]
    everywhere = lambda m, a, b=None: _tighter(pooled[m], a, b) and all(  # noqa: E731
        _tighter(v, a, b) for v in byn.get(m, {}).values() if all(k in v for k in PAPER_BOUNDS))
    ok = [m for m in have if everywhere(m, "jasmin")]
    trained = [m for m in have if "JaSMin" in m]
    trained_ok = bool(trained) and set(trained) <= set(ok)
    word = ("reproduced" if trained_ok and len(ok) == len(have)
            else "partly reproduced" if ok else "not reproduced")
    fmt = lambda v: f"JaSMin {v['jasmin']:.3g} vs Castin {v['castin']:.3g} vs Kim {v['kim']:.3g}"  # noqa: E731
    parts = [f"{m}{' (pooled over n = ' + ', '.join(map(str, byn[m])) + ')' if m in byn else ''}: {fmt(pooled[m])}"
             for m in have]
    out = (f"Verdict (Fig. 6: JaSMin's Thm 3 the tightest of the paper's three bounds per head, median bound / truth, "
           f"pooled over n and at every n; paper: JaSMin-trained ViT-B on CIFAR-100): **{word}** on {len(ok)} of "
           f"{len(have)} models" + (" including the JaSMin-trained ViT" if trained_ok else "")
           + (f" (not on {', '.join(m for m in have if m not in ok)})" if len(ok) < len(have) else "") + ". "
           + "; ".join(parts) + ".")
    multi = [m for m in have if m in byn]
    if multi:
        out += (" Per n (median per head, JaSMin / Castin / Kim): " + "; ".join(
            f"{m} " + ", ".join(f"n = {n}: {v['jasmin']:.3g} / {v['castin']:.3g} / {v['kim']:.3g}"
                                for n, v in byn[m].items() if all(k in v for k in PAPER_BOUNDS)) for m in multi) + ".")
        cross = crossings(pooled, {m: byn[m] for m in multi})
        why = (", consistent with JaSMin App. C: Thm 3's worst case grows like n, Castin's like sqrt(n)"
               if any({lo, up} == {"jasmin", "castin"} for _, _, lo, up in cross) else "")
        out += (f" Order of two of the paper's bounds changes with n: {_crossing_text(cross, pooled, byn)}{why}."
                if cross else " No two of the paper's bounds change order with n.")
    lo = [m for m in have if "lofast_fine" in pooled[m] and everywhere(m, "lofast_fine", "jasmin")
          and pooled[m]["lofast_fine"] < pooled[m]["jasmin"]]
    if lo:
        out += (f" Beyond the paper: LoFAST's exact eps -> 0 limit is tighter still on {len(lo)} of {len(have)} "
                "models (pooled and at every n).")
    ac = [m for m in have if "jasmin_appc" in pooled[m]]
    if ac:
        r = [pooled[m]["jasmin_appc"] / pooled[m]["jasmin"] for m in ac]
        out += (f" JaSMin App. C's sqrt(N)-order bound (plug-in) over Thm 3, median ratio per model: "
                f"{min(r):.2f}-{max(r):.2f} (below 1: tighter; App. C claims the better order in N).")
    return out


def without_constant(table, rest, const) -> str:
    """Does Fig. 6's verdict change when the constant-attention heads (ratio 1 for every bound) are left out? `rest`:
    the table without them; `const`: model -> (constant heads, heads)."""
    before, after = (leaderboard_verdict(t).split("**")[1] for t in (table, rest))
    agg = ratio_agg(rest)
    med = agg[agg["scope"] == "head"].set_index(["model", "method"])["median"]
    parts = []
    for m, (k, n) in const.items():
        if all((m, x) in med.index for x in PAPER_BOUNDS):
            lo = f", LoFAST fine {med[(m, 'lofast_fine')]:.3g}" if (m, "lofast_fine") in med.index else ""
            parts.append(f"{m} on its {n - k} other heads: JaSMin {med[(m, 'jasmin')]:.3g} vs Castin "
                         f"{med[(m, 'castin')]:.3g} vs Kim {med[(m, 'kim')]:.3g}{lo}")
    word = f"is still **{after}**" if before == after else f"becomes **{after}** (with them: {before})"
    return (f"Without the heads with constant attention the per-head verdict {word}: "
            + "; ".join(parts) + ".")


def per_head_verdict(table) -> str:
    """JaSMin App. E: the JaSMin-trained ViT's exact local Lipschitz constant is lower than the baseline's in each
    self-attention head (Fig. 6's truth panel). Decided per (layer, head) on the median over inputs of the `truth`
    column (the exact per-head constant) of the JaSMin-trained ViT against the unregularized one; '' when the table
    lacks either model."""
    t = table[(table["scope"] == "head") & (table["kind"] == "upper")] if "kind" in table else table
    t = t.drop_duplicates(["model", "layer", "head", "sample"] + (["n"] if "n" in t else []))
    models = list(dict.fromkeys(t["model"]))
    jas = next((m for m in models if str(m).startswith("vit (JaSMin")), None)
    if jas is None or "vit" not in models:
        return ""
    med = t.groupby(["model", "layer", "head"])["truth"].median()
    b, j = med.loc["vit"], med.loc[jas]
    both = b.index.intersection(j.index)
    lower = int((j[both] < b[both]).sum())
    word = "reproduced" if lower == len(both) else "partly reproduced" if lower else "not reproduced"
    spec = next((m for m in models if str(m).startswith("vit (Specformer")), None)
    extra = (f" For context (no claim of the paper): the Specformer-trained ViT's median is "
             f"{float(med.loc[spec].median()):.3g}." if spec is not None else "")
    ratio = j[both] / b[both]
    return (f"Verdict (JaSMin App. E: training with JaSMin lowers the exact local Lipschitz constant of each "
            f"self-attention head; scope: per head, the exact constant at {t['sample'].nunique()} test images; "
            f"stand-in: the 4-layer ViTs trained here on {_data(t)}, {jas} against the unregularized 'vit', for "
            f"the paper's ViT-B on CIFAR-100): **{word}**: lower in {lower} of {len(both)} heads (median over "
            f"heads {float(j[both].median()):.3g} against {float(b[both].median()):.3g}; per head the ratio JaSMin / "
            f"baseline ranges {float(ratio.min()):.2f} to {float(ratio.max()):.2f}).{extra}")


def _data(t) -> str:
    """'Fashion-MNIST' / 'CIFAR-10': the ViT rows' training data, as the figures name it."""
    from experiments.figures.common import dataset_name

    return dataset_name(t[t["model"].astype(str).str.startswith("vit")])
