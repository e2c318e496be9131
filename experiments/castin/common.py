"""Shared compute glue of the Castin et al. experiments: real layer inputs with the family's chunk seeding, and
the single heads the radius experiments study. Loading is harness.models.text; operators harness.kernels.layer;
bounds and input constructions harness.bounds.castin. Presentation is in castin/figures/ (a module per figure family,
shared helpers in castin/figures/common.py).
"""
from __future__ import annotations

from typing import Dict, Tuple

import torch

from harness.bounds.castin import max_gamma_head
from harness.kernels.attention import AttentionWeights
from harness.models import text
from harness.catalog import Experiment
from harness.settings import truth_tol


def tol(dtype) -> float:
    """Lanczos tolerance of the measured local Lipschitz constants: the truth's, harness.settings.truth_tol."""
    return truth_tol(dtype)


def layers(cell, ctx, n: int, count: int, indices=None, dtype=torch.float64) -> Dict[int, text.Layer]:
    """{layer: text.Layer (X (count, n, d), w with biases, causal)} of the cell's model on `count` length-n
    windows of cell["corpus"], one forward pass; indices default to [cell["layer"]]. Windows drawn with seed
    ctx.seed * 100003 + n (independent across n, as the paper). cell["masked"] runs a BERT-family model as a
    decoder (and masks the measured map)."""
    idx = [int(cell["layer"])] if indices is None else [int(i) for i in indices]
    return text.layer_inputs(cell["model"], cell.get("corpus", "alice"), idx, int(n), int(count),
                             chunk_seed=ctx.seed * 100003 + int(n), pretrained=cell.get("pretrained", "auto"),
                             seed=ctx.seed, dtype=dtype, device=ctx.torch_device,
                             decoder=bool(cell.get("masked", False)))


def layer(cell, ctx, n: int, count: int) -> text.Layer:
    """layers() of the cell's single layer cell["layer"]."""
    return layers(cell, ctx, n, count)[int(cell["layer"])]


def info(cell, ctx) -> dict:
    """The loaded model's info (pretrained, causal, n_layers, n_heads, d, source)."""
    return text.load(cell["model"], cell.get("pretrained", "auto"), ctx.seed, ctx.torch_device).info


def no_bias(w: AttentionWeights) -> AttentionWeights:
    """The same weights without biases (Castin's propositions are stated bias-free)."""
    return AttentionWeights(w.wq, w.wk, w.wv, w.wo)


RADIUS_WEIGHTS = [{"model": ["random"], "pretrained": ["auto"], "layer": [0]},
                  {"model": ["minilm"], "pretrained": ["auto"], "layer": [-1]}]


def radius_grid(**keys) -> list:
    """Grid of the radius experiments: a random head and MiniLM's last layer, each with the given keys."""
    return [dict(g, **{k: [v] for k, v in keys.items()}) for g in RADIUS_WEIGHTS]


def radius_model_source(cell) -> str:
    """model_source of a radius experiment's cell: the seeded random head, or the text model's weights."""
    if cell["model"] == "random":
        return "random-init:AttentionWeights.random(d=8,h=1,scale=2.0)"
    return text.model_source(cell["model"], cell.get("pretrained", "auto"))


def head_weights(cell, ctx) -> Tuple[AttentionWeights, str]:
    """(single-head bias-free AttentionWeights in float64 on ctx's device, label): model 'random' (d = 8, seeded,
    std 2/sqrt(d)) or a text model's layer cell["layer"], head of largest Prop. 3.4 gamma."""
    if cell["model"] == "random":
        g = torch.Generator().manual_seed(ctx.seed)
        w = AttentionWeights.random(8, 1, scale=2.0, generator=g)
        return w.to(device=ctx.torch_device), "random d=8"
    tm = text.load(cell["model"], cell.get("pretrained", "auto"), ctx.seed, ctx.torch_device)
    from harness.models.hf import attention_weights

    w = no_bias(attention_weights(tm.model, int(cell["layer"]), dtype=torch.float64))
    l = max_gamma_head(w)
    return w.head(l), f"{cell['model']} L{cell['layer']} head {l}"


class RadiusExperiment(Experiment):
    """Base of the radius experiments: the weights they read, as radius_model_source says."""

    def model_source(self, cell) -> str:
        return radius_model_source(cell)
