"""Figure, summary and verdict of jasmin_gamma_one (JaSMin §4 / App. D; presentation: reads the result table only)."""
from __future__ import annotations

from harness import plotting

EQ_TOL = 1e-12  # g_1 = g_k to float64 rounding


def gamma_one_figure(table, outdir):
    """g_1 / g_k of the uniform top-p distributions against p, one line per (n, k), with p = k marked."""
    u = table[table["kind"] == "uniform_top_p"]
    fig, ax = plotting.figure(1, 1, width=5.5, height=3.6)
    for (n, k), g in u.groupby(["n", "k"]):
        ax.plot(g["p"], g["g1"] / g["gk"], marker="o", ms=3, label=f"n = {n}, k = {k}")
        at = g[g["p"] == k]
        ax.plot(at["p"], at["g1"] / at["gk"], ls="none", marker="s", mfc="none", color="black")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("p (uniform on the top p entries)")
    ax.set_ylabel("g_1 / g_k")
    note = ("g_1 / g_k = 1 is gamma = 1 in Proposition 1. Squares: p = k, which §4 counts among the distributions "
            "with g_1 = g_k. p = 1 is the one-hot distribution (g_k = 0 for k > 1: not drawn on the log axis).")
    return plotting.finish(fig, outdir, "jasmin_gamma_one", "JaSMin (Yudin et al.) §4 / App. D",
                           title="Which uniform top-p distributions have g_1 = g_k", note=note)


def gamma_one_verdict(table) -> str:
    u = table[table["kind"] == "uniform_top_p"]
    r = table[table["kind"] == "random"]
    if not len(u):
        return "Verdict: **not determined** (no uniform top-p rows)."
    eq = u["gap"] <= EQ_TOL
    claimed = u[u["in_set"].astype(bool)]
    fail = claimed[claimed["gap"] > EQ_TOL]
    off = u[eq & ~u["in_set"].astype(bool)]
    word = "reproduced" if not len(fail) and not len(off) else "partly reproduced"
    at_k = u[u["p"] == u["k"]]
    at_k_ok = bool((at_k["gap"] <= EQ_TOL).all())
    rnd = (f" No random distribution reaches g_1 = g_k: the smallest g_1 / g_k - 1 over {len(r)} (n, k) settings "
           f"is {float(r['gap'].min()):.2e} (App. D's necessary condition is not contradicted)." if len(r) else "")
    return (f"Verdict (§4 with App. D: g_1 = g_k exactly for the one-hot and for every distribution uniform on its "
            f"top p entries, k <= p <= n; scope: exact g_1, g_k in float64 for n = "
            + ", ".join(str(n) for n in sorted(u["n"].unique())) + ", k = "
            + ", ".join(str(k) for k in sorted(u["k"].unique())) + f"): **{word}**: g_1 = g_k (to {EQ_TOL:g}) at "
            f"{int(eq.sum())} of {len(u)} uniform top-p distributions; of those §4 names, it fails at {len(fail)}"
            + ("" if at_k_ok else f", exactly the p = k ones ({len(at_k)}): uniform on k entries gives g_1 = 1/k "
               "but g_k = (1/k)(1 - 1/k), since x_(k+1) = 0, so the range is k < p <= n (with p = 1)")
            + f"; off that set it holds at {len(off)}." + rnd)


def gamma_one_summary(table) -> str:
    u = table[table["kind"] == "uniform_top_p"]
    lines = ["g_1 / g_k of uniform top-p distributions (exact, float64), at p = k and the nearest p on either side:",
             "", "| n | k | p = k - 1 | p = k | p = k + 1 |", "|---|---|---|---|---|"]
    for (n, k), g in u.groupby(["n", "k"]):
        at = lambda p: g[g["p"] == p]  # noqa: E731
        val = lambda p: (f"{float(at(p)['g1'].iloc[0] / at(p)['gk'].iloc[0]):.6g}" if len(at(p)) and  # noqa: E731
                         float(at(p)["gk"].iloc[0]) > 0 else "-")
        lines.append(f"| {n} | {k} | {val(k - 1)} | {val(k)} | {val(k + 1)} |")
    return "\n".join(lines + ["", gamma_one_verdict(table)])
