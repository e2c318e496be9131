"""Random-init Llama models for castin_sqrt_n (RoPE, grouped-query attention, causal): no Llama weights are
available offline, so the panels measure Llama's architecture with seeded Hugging Face init (std 0.02).

    llama-gqa   GPT-2-small-like: d = 768, 12 query heads sharing 4 key/value heads (head dim 64), 12 layers,
                SwiGLU width 3072, RoPE theta 10^4, RMSNorm; GPT-2's byte-level BPE tokenizer (50,257 tokens,
                vocab_size set to match) through harness.models.text, so its token windows of a corpus are exactly
                the GPT-2 panels' windows (same tokenizer, same chunk seed): only the architecture differs.
    tiny-llama  test scale: d = 32, 4 query / 2 key-value heads, 2 layers; the BERT uncased tokenizer of the MiniLM
                package (30,522 tokens), which needs no data mirror, as tiny-bert does.

The measured map is harness.models.adapters_modern's (RotaryAdapter): X = input_layernorm output of the layer, F =
self_attn(X) with o_proj, positions 0..n-1 fixed, causal, no residual; its exact float64 AttentionMap carries the
rotary cos/sin the forward pass used. Truth: Lanczos on J^T J of that map (harness.analyze.modern.MapState, the
routine `attnlip analyze` uses); paper estimator: sqrt(||J^T F(X)||_F) of the same map.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Sequence

import torch

from harness.models import text

Tensor = torch.Tensor
# name -> (LlamaConfig fields, tokenizer name for harness.models.text)
MODELS = {
    "llama-gqa": (dict(hidden_size=768, num_attention_heads=12, num_key_value_heads=4, num_hidden_layers=12,
                       intermediate_size=3072, max_position_embeddings=1024), "gpt2"),
    "tiny-llama": (dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
                        intermediate_size=64, max_position_embeddings=512), "tiny-bert"),
}


TOKENIZER_LABEL = {"gpt2": "gpt2", "tiny-bert": "bert-uncased"}  # as shown in the cell key, rows and figures


def is_llama(name: str) -> bool:
    return str(name).lower() in MODELS


def _spec(name: str):
    try:
        return MODELS[str(name).lower()]
    except KeyError:
        raise ValueError(f"unknown Llama panel model {name!r}; known: {', '.join(MODELS)}") from None


def model_source(name: str, seed: int = 0) -> str:
    """Cell-key label of the weights: 'random-init:llama-gqa(d=768,heads=12,kv=4,layers=12,ffn=3072,
    rope_theta=10000,tokenizer=gpt2,seed=0)'."""
    hf_config, tok = _spec(name)
    return (f"random-init:{name.lower()}(d={hf_config['hidden_size']},heads={hf_config['num_attention_heads']},"
            f"kv={hf_config['num_key_value_heads']},layers={hf_config['num_hidden_layers']},ffn={hf_config['intermediate_size']},"
            f"rope_theta=10000,tokenizer={TOKENIZER_LABEL[tok]},seed={int(seed)})")


@functools.lru_cache(maxsize=2)
def load(name: str, seed: int = 0, device: str = "cpu"):
    """(LlamaModel in eval mode with eager attention, float32, seeded random init; its RotaryAdapter); cached."""
    from transformers import AutoModel, LlamaConfig

    from harness.models.adapters import adapter_for

    fields, tok = _spec(name)
    config = LlamaConfig(vocab_size=len(text.tokenizer(tok)), rms_norm_eps=1e-6, **fields)  # RoPE theta 10^4 (default)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        model = AutoModel.from_config(config, attn_implementation="eager")
    model.eval().to(torch.device(device))
    return model, adapter_for(model)


def info(name: str, seed: int = 0) -> dict:
    hf_config, tok = _spec(name)
    return {"pretrained": False, "source": model_source(name, seed), "d": hf_config["hidden_size"],
            "n_heads": hf_config["num_attention_heads"], "kv_heads": hf_config["num_key_value_heads"],
            "tokenizer": TOKENIZER_LABEL[tok]}


@dataclass
class Layer:
    X: Tensor  # (count, n, d) input of the layer's self_attn (input_layernorm output)
    amap: object  # adapters_modern.AttentionMap at n tokens (RoPE, GQA expanded, causal)


def ids(name: str, corpus: str, n: int, count: int, chunk_seed: int) -> Tensor:
    """`count` non-overlapping length-n windows of `corpus` in the model's tokenizer (no special tokens)."""
    return text.chunk_ids(_spec(name)[1], corpus, int(n), int(count), int(chunk_seed))


def layers(name: str, corpus: str, indices: Sequence[int], n: int, count: int, chunk_seed: int, seed: int = 0,
           dtype=torch.float64, device="cpu") -> Dict[int, Layer]:
    """{layer: Layer} on `count` length-n windows: one float32 forward pass, X and the map cast to dtype."""
    return capture(name, ids(name, corpus, n, count, chunk_seed), indices, seed, dtype, device)


def capture(name: str, token_ids: Tensor, indices: Sequence[int], seed: int = 0, dtype=torch.float64,
            device="cpu") -> Dict[int, Layer]:
    model, adapter = load(str(name).lower(), int(seed), str(device))
    dev = torch.device(device)
    got = adapter.capture({"input_ids": token_ids.to(dev)}, [int(i) for i in indices])["inputs"]
    n = token_ids.shape[-1]
    return {int(l): Layer(X.to(device=dev, dtype=dtype), adapter.attention_map(int(l), n, dtype, dev))
            for l, X in got.items()}


def measure(X: Tensor, amap, tol: float, seed: int = 0) -> dict:
    """Per sequence (X (count, n, d)): lipschitz = ||J_F(X)|| (Lanczos, MapState of `attnlip analyze`), its
    convergence, and paper_estimator = sqrt(||J_F(X)^T F(X)||_F) (the paper code's jvp[0] defect)."""
    from harness.analyze.modern import MapState

    s = MapState(X, amap, tol=tol, seed=seed)
    lip = s.truth_layer.detach()
    FX, vjp = torch.func.vjp(amap.layer, X.detach())
    paper = vjp(FX.detach())[0].flatten(-2).norm(dim=-1).sqrt()
    return {"lipschitz": lip, "converged": s.converged["truth_layer"], "paper_estimator": paper.detach()}


def bound_note(amap) -> str:
    """Why Thm 3.3 is not reported on this map (the bound registry's reason for RoPE scores)."""
    from harness.bounds import registry

    return registry.get("castin", "head").unproven(amap.features) or ""
