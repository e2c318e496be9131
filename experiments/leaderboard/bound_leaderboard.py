"""The bound leaderboard (JaSMin Fig. 6, extended): every bound of harness.bounds.registry against the true local
Lipschitz constant of self-attention, on real inputs, per head and per multi-head layer.

Models: pretrained MiniLM and random-init GPT-2 (causal) on Alice in Wonderland windows of several lengths n,
and the Fashion-MNIST ViTs trained here (n = their token count): the jasmin_sweep baseline and, as JaSMin's Fig. 6
shows its bound on a JaSMin-trained model, the sweep's JaSMin (k = 10, lambda = 1e-2, mean) and Specformer
(joint, 1e-2) models (same cached artifacts as jasmin_sweep; column `trained_with`, and `model` reads
"vit (<regularizer>)"). Truth: ||J(X)|| by Lanczos
on the layer Jacobian operator (harness.kernels.layer; every head at once for the per-head truth; no residual).
Bounds: every registered bound (Kim/Specformer, Castin Thm 3.3, JaSMin Thm 3 exact and g_1, LoFAST's eps -> 0
limit fine / coarse / sharpened / naive, and any plug-in registered with register_bound). Layer values of
per-head bounds are the sum over heads. One row per (model, n, layer, sample, scope, head, method): value,
truth, ratio, converged, guaranteed (False where a bound only holds in some regime and X is outside it: Kim),
sound (False only for a guaranteed upper bound below the truth).
JaSMin App. C's sqrt(N)-order bound (harness.bounds.jasmin_appc) is listed in `plugins` by default.
Plug-in bounds: the grid key `plugins` lists "module:function" specs (registry.register_plugin: fn(X, w, causal)
-> (..., h) per head, or (...,) per layer with the attribute scope = "layer"; `bound_name` renames it; ball-change
plug-ins certify in lofast_certified / lofast_text instead), e.g. `run_all.py bound_leaderboard --set 'plugins=[["mypkg.bounds:my_bound"]]'`; they join
the table beside the published ones and the summary names any that falls below the truth.
"""
from __future__ import annotations

from typing import Any, Dict, List

from experiments.jasmin import common
from experiments.jasmin import grids
from harness.catalog import Context, experiment

MINILM_LAYERS, GPT2_LAYERS, VIT_LAYERS = list(range(6)), list(range(12)), list(range(4))
# JaSMin App. C's sharper sqrt(N)-order bound joins through the plug-in path (its source is keyed like any plug-in)
APPC = ["harness.bounds.jasmin_appc:jasmin_appc"]
# regularized ViTs of the jasmin_sweep grid (entries present at full and quick scale, seed 0)
REGULARIZED = [{"method": ["jasmin"], "k": [10], "lam": [1e-2], "agg": ["mean"], "train_seed": [0]},
               {"method": ["specformer"], "variant": ["joint"], "lam": [1e-2], "train_seed": [0]}]


def _layers(cell: Dict[str, Any], ctx) -> tuple:
    """(model label, trained_with, [(layer, X, w, causal)]): text models and the baseline ViT through
    jasmin.common.model_layers; a regularized ViT (cell has `method`) from its jasmin_sweep artifact."""
    if cell["model"] != "vit" or "method" not in cell:
        return cell["model"], ("baseline" if cell["model"] == "vit" else "pretrained/random init"), \
            common.model_layers(cell, ctx, offset=100)
    from harness.models.regularizers import method_label

    model = common.trained_vit(ctx, cell)
    x, _ = common.eval_images(cell, int(cell["count"]), ctx, offset=100)
    label = method_label(**common.regularizer_args(cell))
    return f"vit ({label})", label, common.vit_layers(model, x, list(cell["layers"]), ctx)


@experiment
class BoundLeaderboard(common.LayersExperiment):
    """JaSMin Fig. 6 extended: every registered bound (harness.bounds.registry) vs the truth, per head and layer."""

    name = "bound_leaderboard"
    # [0]: bound_leaderboard.png (Fig. 6's per-head comparison, as bound / truth); [1]: bound_leaderboard_vs_n.png,
    # a sequence-length axis that Fig. 6 (one ViT, one n) does not have
    figures_ref = ["JaSMin (Yudin et al.) Fig. 6 (App. C; extended to all bounds and models)",
                   "Extends JaSMin (Yudin et al.) Fig. 6 to sequence length n (the paper's figure has no n axis)"]
    grid = grids.on_cifar10([
        {"model": ["minilm"], "n": [16, 32, 64, 128], "count": [4], "layers": [MINILM_LAYERS], "plugins": [APPC]},
        {"model": ["gpt2"], "n": [16, 64], "count": [2], "layers": [GPT2_LAYERS], "plugins": [APPC]},
        {"model": ["vit"], "count": [8], "layers": [VIT_LAYERS], "plugins": [APPC], **common.VIT_FULL},
        *[dict(r, model=["vit"], count=[8], layers=[VIT_LAYERS], plugins=[APPC], **common.VIT_FULL) for r in REGULARIZED]])
    quick = grids.on_cifar10([
        {"model": ["minilm"], "n": [16, 32], "count": [2], "layers": [MINILM_LAYERS], "plugins": [APPC]},
        {"model": ["gpt2"], "n": [16], "count": [1], "layers": [[0, 11]], "plugins": [APPC]},
        {"model": ["vit"], "count": [4], "layers": [VIT_LAYERS], "plugins": [APPC], **common.VIT_QUICK},
        *[dict(r, model=["vit"], count=[4], layers=[VIT_LAYERS], plugins=[APPC], **common.VIT_QUICK) for r in REGULARIZED]])
    # the ViT rows on CIFAR-10 at patch 8, else Fashion-MNIST at patch 7 (experiments/jasmin/grids.py); the GPT-2 rows
    # are random init by design (jasmin.common.text_layers), so no model substitute is declared for them
    substitutes = (grids.SUBSTITUTE,)
    test = [{"model": ["minilm"], "n": [8], "count": [1], "layers": [[0]], "plugins": [APPC]},
            {"model": ["vit"], "count": [1], "layers": [[0]], "plugins": [APPC], **common.VIT_TEST}]
    # --scale paper (JaSMin Fig. 6 / App. C): every head of the paper-scale ViT-B models of jasmin_sweep (baseline,
    # JaSMin k = 10 and Specformer joint at lambda = 1e-2, seed 0; CIFAR-100 as the paper's figure,
    # jasmin.common.VIT_PAPER_C100), "Exact"
    # averaged over 100 test images as in the paper's figure; the text rows as at full scale
    paper = [*[g for g in grid if g["model"] != ["vit"]],
             {"model": ["vit"], "count": [100], "layers": [list(range(12))], "plugins": [APPC], **common.VIT_PAPER_C100},
             *[dict(r, model=["vit"], count=[100], layers=[list(range(12))], plugins=[APPC], **common.VIT_PAPER_C100)
               for r in REGULARIZED]]
    # x the full run's cell time: the ViT rows take 144 heads of 65 tokens x 768 instead of 16 of 17 x 64, on 12x
    # the images, on a GPU (~100x a 2-core CPU); the text rows cost what they cost at full scale
    paper_cost = 10

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        import torch

        from harness.bounds import registry

        rows: List[Dict[str, Any]] = []
        plugins = [b.name for spec in cell.get("plugins", []) for b in registry.register_plugin(spec)]
        names = [n for n in registry.bound_names(what=registry.LOCAL)
                 if n != "truth" and (not registry.get_any(n).user or n in plugins)]
        model, trained_with, layers = _layers(cell, ctx)
        for l, X, w, causal in layers:
            ev = registry.evaluate(X, w, causal=causal, names=names)
            xn = torch.linalg.matrix_norm(X, ord=2).reshape(-1).tolist()  # (B,)
            R = X.norm(dim=-1).amax(-1).reshape(-1).tolist()  # (B,)
            for r in ev.rows(model=model, trained_with=trained_with, n=X.shape[-2], layer=l, causal=causal,
                             heads=w.h, d=w.d):
                if r["method"] != "truth":
                    rows.append(dict(r, x_spec=xn[r["sample"]], radius=R[r["sample"]]))
        return rows

    # ------------------------------------------------------------------------------------------- outputs
    def figures(self, table, outdir):
        from experiments.leaderboard.figures import board

        return board.leaderboard_figures(table, outdir)

    def summary(self, table) -> str:
        from experiments.leaderboard.figures import board

        return board.leaderboard_summary(table)
