"""The bound leaderboard (JaSMin Fig. 6, extended): every bound of harness.bounds.registry against the true local
Lipschitz constant of self-attention, on real inputs, per head and per multi-head layer.

Models: pretrained MiniLM and random-init GPT-2 (causal) on Alice in Wonderland windows of several lengths n,
and the Fashion-MNIST ViT trained here (jasmin_sweep baseline, n = its token count). Truth: ||J(X)|| by Lanczos
on the layer Jacobian operator (harness.kernels.layer; every head at once for the per-head truth; no residual).
Bounds: every registered bound (Kim/Specformer, Castin Thm 3.3, JaSMin Thm 3 exact and g_1, LoFAST's eps -> 0
limit fine / coarse / sharpened / naive, and any plug-in registered with register_bound). Layer values of
per-head bounds are the sum over heads. One row per (model, n, layer, sample, scope, head, method): value,
truth, ratio, converged, guaranteed (False where a bound only holds in some regime and X is outside it: Kim),
sound (False only for a guaranteed upper bound below the truth).
Plug-in bounds: the grid key `plugins` lists "module:function" specs (registry.register_bound: fn(X, w, causal)
-> (..., h) per head), e.g. `run_all.py bound_leaderboard --set 'plugins=[["mypkg.bounds:my_bound"]]'`; they join
the table beside the published ones and the summary names any that falls below the truth.
"""
from __future__ import annotations

from typing import Any, Dict, List

from experiments import _jasmin_common as C
from harness.registry import Context, Experiment, experiment

MINILM_LAYERS, GPT2_LAYERS, VIT_LAYERS = list(range(6)), list(range(12)), list(range(4))


@experiment
class BoundLeaderboard(Experiment):
    """JaSMin Fig. 6 extended: every registered bound (harness.bounds.registry) vs the truth, per head and layer."""

    name = "bound_leaderboard"
    figures_ref = ["JaSMin (Yudin et al.) Fig. 6 (extended to all bounds and models)"]
    grid = [{"model": ["minilm"], "n": [16, 32, 64, 128], "count": [4], "layers": [MINILM_LAYERS], "plugins": [[]]},
            {"model": ["gpt2"], "n": [16, 64], "count": [2], "layers": [GPT2_LAYERS], "plugins": [[]]},
            {"model": ["vit"], "count": [8], "layers": [VIT_LAYERS], "plugins": [[]], **C.VIT_FULL}]
    quick = [{"model": ["minilm"], "n": [16, 32], "count": [2], "layers": [MINILM_LAYERS], "plugins": [[]]},
             {"model": ["gpt2"], "n": [16], "count": [1], "layers": [[0, 11]], "plugins": [[]]},
             {"model": ["vit"], "count": [4], "layers": [VIT_LAYERS], "plugins": [[]], **C.VIT_QUICK}]
    test = [{"model": ["minilm"], "n": [8], "count": [1], "layers": [[0]], "plugins": [[]]},
            {"model": ["vit"], "count": [1], "layers": [[0]], "plugins": [[]], **C.VIT_TEST}]

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        import torch

        from harness.bounds import registry

        rows: List[Dict[str, Any]] = []
        plugins = [b.name for spec in cell.get("plugins", []) for b in registry.register_bound(spec, replace=True)]
        names = [n for n in registry.bound_names() if n != "truth" and (not registry.get_any(n).user or n in plugins)]
        for l, X, w, causal in C.model_layers(cell, ctx, offset=100):
            ev = registry.evaluate(X, w, causal=causal, names=names)
            xn = torch.linalg.matrix_norm(X, ord=2).reshape(-1).tolist()  # (B,)
            R = X.norm(dim=-1).amax(-1).reshape(-1).tolist()  # (B,)
            for r in ev.rows(model=cell["model"], n=X.shape[-2], layer=l, causal=causal, heads=w.h, d=w.d):
                if r["method"] != "truth":
                    rows.append(dict(r, x_spec=xn[r["sample"]], radius=R[r["sample"]]))
        return rows

    # ------------------------------------------------------------------------------------------- outputs
    def figures(self, table, outdir):
        from experiments import _jasmin_plots

        return _jasmin_plots.leaderboard_figures(table, outdir)

    def summary(self, table) -> str:
        from experiments import _jasmin_plots

        return _jasmin_plots.leaderboard_summary(table)
