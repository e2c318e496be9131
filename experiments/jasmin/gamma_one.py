"""JaSMin (Yudin et al.) §4 and App. D: the corner case gamma = 1 of Proposition 1, g_1(x) = g_k(x).

App. D: g_1 = g_k forces x_(1) = 1 or x_(1) = ... = x_(k); §4 then says any uniform distribution on its top p
entries, k <= p <= n, fulfils g_1 = g_k. Both are checked exactly (float64, harness.kernels.softmax.g_k): every
uniform top-p distribution (p = 1 is the one-hot) for each (n, k), and `samples` random distributions per (n, k)
(uniform on the simplex), whose g_1 / g_k - 1 says whether g_1 = g_k happens off that set.
"""
from __future__ import annotations

from typing import Any, Dict, List

from harness.catalog import Context, Experiment, experiment


@experiment
class JasminGammaOne(Experiment):
    """JaSMin App. D: which distributions have g_1 = g_k (gamma = 1 in Proposition 1)."""

    name = "jasmin_gamma_one"
    figures_ref = ["JaSMin (Yudin et al.) §4 / App. D (gamma = 1: g_1 = g_k)"]
    description = "Where g_1 = g_k: uniform top-p distributions (p = 1..n) and random ones, exact in float64"
    grid = {"n": [[4, 8, 16, 64]], "k": [[2, 5, 10]], "samples": [2000]}
    quick = {"n": [[4, 8, 16]], "k": [[2, 5]], "samples": [500]}
    test = {"n": [[4]], "k": [[2]], "samples": [20]}
    dtypes = ("float64",)
    dtype_note = "g_1 = g_k is an equality, decided to rounding"
    # --scale paper: App. D is a proof with no sizes; the full grid is its setting here
    paper = grid
    paper_cost = 1

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        """One row per (n, k, uniform top-p) and one per (n, k) for the random distributions (their minimum)."""
        import torch

        from harness.kernels.softmax import g_k

        gen = torch.Generator().manual_seed(int(ctx.seed))
        rows = []
        for n in map(int, cell["n"]):
            for k in [int(k) for k in cell["k"] if int(k) < n]:
                for p in range(1, n + 1):
                    x = torch.zeros(n, dtype=torch.float64)
                    x[:p] = 1.0 / p
                    g1, gk = float(g_k(x, 1)), float(g_k(x, k))
                    rows.append(dict(n=n, k=k, kind="uniform_top_p", p=p, g1=g1, gk=gk,
                                     gap=abs(g1 - gk), in_set=p == 1 or p >= k))
                x = _dirichlet(n, int(cell["samples"]), gen)
                g1, gk = g_k(x, 1), g_k(x, k)
                rel = g1 / gk - 1
                rows.append(dict(n=n, k=k, kind="random", p=None, g1=float(g1[rel.argmin()]),
                                 gk=float(gk[rel.argmin()]), gap=float(rel.min()), in_set=False))
        return rows

    def figures(self, table, outdir):
        from experiments.jasmin.figures.gamma_one import gamma_one_figure

        return gamma_one_figure(table, outdir)

    def summary(self, table) -> str:
        from experiments.jasmin.figures.gamma_one import gamma_one_summary

        return gamma_one_summary(table)


def _dirichlet(n: int, count: int, gen):
    """`count` uniform points of the simplex in R^n (sorted Exp(1) draws, normalized), float64."""
    import torch

    e = -torch.log(torch.rand(count, n, generator=gen, dtype=torch.float64).clamp_min(1e-300))
    return e / e.sum(-1, keepdim=True)
