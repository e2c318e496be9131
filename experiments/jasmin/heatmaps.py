"""JaSMin (Yudin et al.) Fig. 5: the regularized quantity per layer and head of the sweep's ViTs.

Per layer/head, means over eval images and query rows of g_1(P_i), the exact ||J_sm(P_i)||, max_i g_1, the
JaSMin_0 row term log g_1 and the JaSMin_10 row term log(g_1 / g_10) (harness.bounds.jasmin.row_penalty), and
the mean max attention weight, from the model's attention maps in the run's dtype. One cell per sweep entry.
"""
from __future__ import annotations

from typing import Any, Dict, List

from experiments.jasmin import common
from experiments.jasmin import grids
from harness.catalog import Context, experiment


@experiment
class JasminHeatmaps(common.LayersExperiment):
    """JaSMin Fig. 5: mean g_1(P_i) (and the penalty terms) per layer/head for every regularizer."""

    name = "jasmin_heatmaps"
    figures_ref = ["JaSMin (Yudin et al.) Fig. 5 (regularized quantity per layer/head)"]
    # CIFAR-10 at patch 8, else Fashion-MNIST at patch 7 (experiments/jasmin/grids.py)
    grid, quick, test = grids.on_cifar10(common.sweep_grids({"n_heat": [64]}, {"n_heat": [64]}, {"n_heat": [8]}))
    substitutes = (grids.SUBSTITUTE,)
    # --scale paper: the sweep's ViT-B models on CIFAR-100 as Fig. 5 (jasmin.common.VIT_PAPER_C100), averaged over
    # 1,000 test images
    paper = common.sweep_paper({"n_heat": [1000]}, cifar100_only=True)
    # x the full run's cell time (the models trained by jasmin_sweep): a ViT-B forward pass costs ~1,600x the
    # FLOPs of the d = 64 ViT's per image, 16x the images, on a GPU (~100x a 2-core CPU)
    paper_cost = 250

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        import torch

        from harness.bounds.jasmin import row_penalty
        from harness.kernels.softmax import g_k, jsm_norm

        model = common.trained_vit(ctx, cell).to(dtype=ctx.torch_dtype).eval()
        base = common.sweep_columns(cell, model)
        x, _ = common.eval_images(cell, int(cell["n_heat"]), ctx)
        with torch.no_grad():
            _, Ps, _ = model(x.to(ctx.torch_dtype), return_attn=True)
        rows = []
        for l, P in enumerate(Ps):  # (B, h, n, n)
            g1, ex, pmax = g_k(P, 1), jsm_norm(P), P.amax(-1)  # (B, h, n)
            pen0 = row_penalty(P, 0)  # log g_1 (JaSMin_0 row term)
            pen10 = row_penalty(P, min(10, P.shape[-1]))  # log(g_1 / g_10) (JaSMin_10 row term)
            for h in range(P.shape[1]):
                rows.append(dict(base, layer=l, head=h, g1_mean=float(g1[:, h].mean()),
                                 g1_max=float(g1[:, h].amax(-1).mean()), jsm_mean=float(ex[:, h].mean()),
                                 log_g1_mean=float(pen0[:, h].mean()), log_g1_over_g10=float(pen10[:, h].mean()),
                                 p_max_mean=float(pmax[:, h].mean()), n_tokens=int(P.shape[-1])))
        return rows

    def figures(self, table, outdir):
        from experiments.jasmin.figures import sweep as sweep_figures

        return sweep_figures.heatmaps_figure(table, outdir)

    def summary(self, table) -> str:
        g = table.groupby("method")[["g1_mean", "jsm_mean", "log_g1_over_g10"]].mean()
        lines = ["| method | mean g_1 | mean exact ||J_sm|| | mean log(g_1/g_10) |", "|---|---|---|---|"]
        for m in dict.fromkeys(table["method"]):
            r = g.loc[m]
            lines.append(f"| {m} | {r.g1_mean:.4f} | {r.jsm_mean:.4f} | {r.log_g1_over_g10:.3f} |")
        lines += ["", "Fig. 5 of the paper shows JaSMin lowering the regularized quantity across heads of a ViT-B; "
                  "here the means over heads, eval images and query rows of our Fashion-MNIST ViTs."]
        from experiments.jasmin.figures.sweep import heatmap_note

        lines += ["", heatmap_note(table).strip()]
        base = [m for m in g.index if str(m).lower().startswith("baseline")]
        jas = [m for m in g.index if str(m).startswith("JaSMin")]
        if base and jas:
            b = float(g.loc[base[0], "g1_mean"])
            low = [m for m in jas if float(g.loc[m, "g1_mean"]) < b]
            word = "reproduced" if len(low) == len(jas) else "partly reproduced" if low else "not reproduced"
            listed = ", ".join(f"{m} {float(g.loc[m, 'g1_mean']):.4f}" for m in jas)
            lines += ["", f"Verdict (Fig. 5: JaSMin lowers the mean g_1 it regularizes, across heads, against the "
                      f"baseline; scope: every layer and head at test images; stand-in: the 4-layer ViTs trained "
                      f"here on Fashion-MNIST (or CIFAR-10 where it resolves) for the paper's ViT-B on CIFAR-100): "
                      f"**{word}**: baseline {b:.4f}; lower with {len(low)} of {len(jas)} JaSMin settings "
                      f"({listed})."]
        return "\n".join(lines)
