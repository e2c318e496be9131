"""Hugging Face text models (MiniLM, BERT, GPT-2) as AttentionWeights plus the exact self-attention inputs X.

Loading lives in harness.models.text (model_source, load, capture), which builds on this module; this module
reads a loaded model's layers through harness.models.adapters: its AttentionWeights are the adapters' (the one
weight extraction) and its hooks the adapters' capture (the one set of forward hooks). Conventions (docs/math.md §0): x -> x W on row vectors, heads contiguous on the projection's output
axis.
BERT/MiniLM (post-LN): X = hidden state entering the layer; F(X) = attention.output.dense(attention.self(X)),
i.e. before dropout, residual and LayerNorm. GPT-2 (pre-LN): X = ln_1 output; F(X) = attn(X) = c_proj(...),
causal. Models are always in eval() mode with attn_implementation="eager".
"""
from __future__ import annotations

from typing import Dict, Iterable, Optional

import torch

from harness.kernels.attention import AttentionWeights
from harness.models.adapters import adapter_for

CAUSAL_TYPES = ("gpt2", "gpt_neo", "gptj", "llama", "mistral", "opt", "qwen2")


# ---- structure ----------------------------------------------------------------------------------------------
def _family(model) -> str:
    base = getattr(model, "base_model", model)
    if hasattr(base, "encoder") and hasattr(base.encoder, "layer"):
        return "bert"
    if hasattr(base, "h") and hasattr(base.h[0], "attn") and hasattr(base.h[0].attn, "c_attn"):
        return "gpt2"
    raise ValueError(f"unsupported model {type(model).__name__}: expected a BERT-family or GPT-2 model")


def _layers(model):
    base = getattr(model, "base_model", model)
    return base.encoder.layer if _family(model) == "bert" else base.h


def _layer(model, layer: int):
    layers = _layers(model)
    if not -len(layers) <= layer < len(layers):
        raise ValueError(f"layer {layer} out of range: the model has {len(layers)} layers")
    return layers[layer]


def is_causal(model) -> bool:
    """True for decoder models whose self-attention is causally masked (GPT-2; BERT with is_decoder)."""
    hf_config = model.config
    return hf_config.model_type in CAUSAL_TYPES or bool(getattr(hf_config, "is_decoder", False))


def n_layers(model) -> int:
    return len(_layers(model))


# ---- weights ------------------------------------------------------------------------------------------------
def attention_weights(model, layer: int, dtype=torch.float64) -> AttentionWeights:
    """AttentionWeights (with biases) of a layer's self-attention, equal to the model's map (docs/math.md §0):
    harness.models.adapters' extraction (the model's score scaling folded into wq, bq)."""
    _layer(model, layer)  # a BERT-family or GPT-2 model, layer in range
    return adapter_for(model).layer_weights(layer, dtype)


# ---- hooks --------------------------------------------------------------------------------------------------
def capture(model, input_ids: torch.Tensor, layers: Iterable[int], attention_mask: Optional[torch.Tensor] = None,
            dtype=torch.float64, outputs: bool = False) -> Dict[str, Dict[int, torch.Tensor]]:
    """Run the model once with forward hooks (harness.models.adapters' Adapter.capture); per requested layer
    capture the self-attention input X (B, n, d) and, with outputs=True, its output F(X) (B, n, d) and
    probabilities P (B, h, n, n), cast to dtype.

    Stops the forward pass after the deepest requested layer (cheap for early layers of big models).
    """
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    if input_ids.dim() != 2:
        raise ValueError(f"input_ids must be (B, n) or (n,), got shape {tuple(input_ids.shape)}")
    requested = list(layers)
    if not requested:
        raise ValueError("capture needs at least one layer index")
    for l in requested:
        _layer(model, l)  # a BERT-family or GPT-2 model, layer in range
    call = {"input_ids": input_ids} if attention_mask is None else dict(input_ids=input_ids,
                                                                        attention_mask=attention_mask)
    got = adapter_for(model).capture(call, requested, outputs=outputs, probs=outputs)
    return {k: {l: v.to(dtype) for l, v in got.get(k, {}).items()} for k in ("inputs", "outputs", "probs")}


def attention_inputs(model, input_ids: torch.Tensor, layers: Iterable[int],
                     attention_mask: Optional[torch.Tensor] = None, dtype=torch.float64) -> Dict[int, torch.Tensor]:
    """{layer: X (B, n, d)}: the exact input of each layer's self-attention (BERT: hidden state entering the
    layer; GPT-2: ln_1 output), captured by forward hooks, cast to dtype."""
    return capture(model, input_ids, layers, attention_mask, dtype)["inputs"]


def attention_outputs(model, input_ids: torch.Tensor, layers: Iterable[int],
                      attention_mask: Optional[torch.Tensor] = None, dtype=torch.float64):
    """({layer: X}, {layer: F(X) (B, n, d)}, {layer: P (B, h, n, n)}) as computed by the model itself."""
    got = capture(model, input_ids, layers, attention_mask, dtype, outputs=True)
    return got["inputs"], got["outputs"], got["probs"]


def token_radius(X: torch.Tensor) -> torch.Tensor:
    """Per-token l2 norms ||x_i|| of an attention input: (..., n, d) -> (..., n) (Castin's R = max_i)."""
    return X.norm(dim=-1)
