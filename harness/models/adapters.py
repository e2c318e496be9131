"""Architecture adapters: any supported attention model -> AttentionWeights per layer + the exact layer inputs.

An adapter is one small class. It lists the model's self-attention modules in call order (ALBERT: the shared
module once per application), turns one into AttentionWeights (docs/math.md §0, biases kept, the model's score scaling
folded into wq, bq), and reads the module's input X from a forward pre-hook. The measured map is the attention
module's own map before any residual, dropout or LayerNorm:
    BERT / RoBERTa / ELECTRA   X = hidden state entering the layer, F = attention.output.dense(attention.self(X))
    DistilBERT                 X = hidden state entering the block, F = out_lin(...)
    ALBERT                     X = hidden state entering each (shared) layer application, F = attention.dense(...)
    GPT-2 (causal)             X = ln_1 output, F = attn(X) (c_proj)
    ViT                        X = layernorm_before output, F = o_proj(...)
    torch.nn.MultiheadAttention  X = the query (self-attention only), F = the module's output
Padding: texts are right-padded; the analyzed input of sample b is X[b, :length_b], on which the attention map
equals the model's on the padded batch (key padding masked; causal rows never see later pads).

Llama / Mistral / Qwen2 (RoPE, GQA), T5 and DeBERTa-v2 are in harness.models.adapters_modern (registered on import
of this module); their maps carry position terms, given by `attention_map`.

Add an architecture: subclass Adapter, set `name` and `model_types` (HF config.model_type values), implement
`modules()` and `weights(module)` (and `causal` if the map is masked), then `register_adapter(MyAdapter)`.
"""
from __future__ import annotations

from typing import List, Optional

import torch

from harness.kernels.attention import AttentionWeights
from harness.models.adapter_base import (Adapter, UnsupportedModel, _dense, _linear, adapter_for,  # noqa: F401
                                         register_adapter, supported)

Tensor = torch.Tensor


@register_adapter
class MultiheadAttentionAdapter(Adapter):
    """Any module holding torch.nn.MultiheadAttention used as self-attention (query = key = value)."""

    name = "torch.nn.MultiheadAttention"

    @classmethod
    def matches(cls, model) -> bool:
        return any(isinstance(m, torch.nn.MultiheadAttention) for m in model.modules())

    def __init__(self, model):
        super().__init__(model)
        self._causal, self._bf = False, True

    @property
    def causal(self) -> bool:
        return self._causal

    def modules(self):
        return [m for m in self.model.modules() if isinstance(m, torch.nn.MultiheadAttention)]

    def hidden(self, args, kwargs) -> Tensor:
        names = ("query", "key", "value")
        q, k, v = [args[i] if len(args) > i else kwargs.get(n) for i, n in enumerate(names)]
        if not (k is q or torch.equal(k, q)) or not (v is q or torch.equal(v, q)):
            raise ValueError("MultiheadAttention adapter: only self-attention (query = key = value) is supported")
        kpm = args[3] if len(args) > 3 else kwargs.get("key_padding_mask")
        if kpm is not None:  # True (or -inf) = padding
            pad = kpm if kpm.dtype == torch.bool else torch.isinf(kpm) & (kpm < 0)
            self.padding_mask = (~pad).to(torch.long)
        mask = args[4] if len(args) > 4 else kwargs.get("attn_mask")
        if kwargs.get("is_causal") or (len(args) > 6 and args[6]):
            self._causal = True
        elif mask is not None:
            n = q.shape[1 if self._bf else 0]
            cm = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
            as_bool = mask if mask.dtype == torch.bool else torch.isinf(mask) & (mask < 0)
            if mask.dim() != 2 or not torch.equal(as_bool, cm):
                raise ValueError("MultiheadAttention adapter: attn_mask other than the causal mask is not supported")
            self._causal = True
        return q if self._bf else q.transpose(0, 1)

    def capture(self, inputs, layers, outputs=False, probs=False):
        self._bf = all(m.batch_first for m in self.modules())
        return super().capture(inputs, layers, outputs, probs)

    def output(self, out) -> Tensor:
        o = out[0]
        return o if self._bf else o.transpose(0, 1)

    def weights(self, m, dtype=torch.float64) -> AttentionWeights:
        d, h = m.embed_dim, m.num_heads
        if m.in_proj_weight is not None:
            Wq, Wk, Wv = m.in_proj_weight.chunk(3, dim=0)
        else:
            Wq, Wk, Wv = m.q_proj_weight, m.k_proj_weight, m.v_proj_weight
        b = m.in_proj_bias.chunk(3) if m.in_proj_bias is not None else (None, None, None)
        if m.bias_k is not None or m.add_zero_attn:
            raise ValueError("MultiheadAttention adapter: add_bias_kv / add_zero_attn are not supported")
        dh = d // h
        return _dense(Wq.T, Wk.T, Wv.T, m.out_proj.weight.T, *b, m.out_proj.bias, h, dh ** -0.5, dtype)


@register_adapter
class ViTAdapter(Adapter):
    """Hugging Face ViT (pre-LN): X = layernorm_before output."""

    name = "ViT"
    model_types = ("vit",)

    def modules(self):
        base = getattr(self.model, "base_model", self.model)
        layers = base.layers if hasattr(base, "layers") else base.encoder.layer
        return [L.attention for L in layers]

    def weights(self, a, dtype=torch.float64):
        (Wq, bq), (Wk, bk), (Wv, bv), (Wo, bo) = (_linear(x) for x in (a.q_proj, a.k_proj, a.v_proj, a.o_proj))
        return _dense(Wq, Wk, Wv, Wo, bq, bk, bv, bo, a.num_attention_heads, a.scaling, dtype)


@register_adapter
class GPT2Adapter(Adapter):
    """GPT-2 (causal, pre-LN): X = ln_1 output; Conv1D weights act as x W."""

    name = "GPT-2"
    model_types = ("gpt2",)
    causal = True

    def modules(self):
        return [blk.attn for blk in getattr(self.model, "base_model", self.model).h]

    def weights(self, at, dtype=torch.float64):
        h, dh = at.num_heads, at.head_dim
        scaling = getattr(at, "scaling", dh ** -0.5 if at.scale_attn_weights else 1.0)
        W, b = at.c_attn.weight, at.c_attn.bias  # (d, 3 h dh)
        (Wq, Wk, Wv), (bq, bk, bv) = W.chunk(3, dim=1), b.chunk(3)
        return _dense(Wq, Wk, Wv, at.c_proj.weight, bq, bk, bv, at.c_proj.bias, h, scaling, dtype)


@register_adapter
class AlbertAdapter(Adapter):
    """ALBERT: layer groups shared across num_hidden_layers applications; each application is one layer."""

    name = "ALBERT (shared layers)"
    model_types = ("albert",)

    def modules(self):
        enc = getattr(self.model, "base_model", self.model).encoder
        hf_config = self.model.config
        per = hf_config.num_hidden_layers / hf_config.num_hidden_groups
        out = []
        for i in range(hf_config.num_hidden_layers):
            out += [lay.attention for lay in enc.albert_layer_groups[int(i / per)].albert_layers]
        return out

    def output_module(self, a):
        return a.dense

    def weights(self, a, dtype=torch.float64):
        (Wq, bq), (Wk, bk), (Wv, bv), (Wo, bo) = (_linear(x) for x in (a.query, a.key, a.value, a.dense))
        return _dense(Wq, Wk, Wv, Wo, bq, bk, bv, bo, a.num_attention_heads, a.scaling, dtype)


@register_adapter
class DistilBertAdapter(Adapter):
    name = "DistilBERT"
    model_types = ("distilbert",)

    def modules(self):
        return [L.attention for L in getattr(self.model, "base_model", self.model).transformer.layer]

    def weights(self, a, dtype=torch.float64):
        (Wq, bq), (Wk, bk), (Wv, bv), (Wo, bo) = (_linear(x) for x in (a.q_lin, a.k_lin, a.v_lin, a.out_lin))
        return _dense(Wq, Wk, Wv, Wo, bq, bk, bv, bo, a.n_heads, a.scaling, dtype)


@register_adapter
class BertAdapter(Adapter):
    """BERT, RoBERTa, ELECTRA (and MiniLM): X = hidden state entering the layer (post-LN)."""

    name = "BERT / RoBERTa / ELECTRA"
    model_types = ("bert", "roberta", "electra")

    def modules(self):
        return [L.attention.self for L in getattr(self.model, "base_model", self.model).encoder.layer]

    def output_module(self, sa):
        for L in getattr(self.model, "base_model", self.model).encoder.layer:
            if L.attention.self is sa:
                return L.attention.output.dense
        raise ValueError("attention module not found in the encoder")

    def weights(self, sa, dtype=torch.float64):
        (Wq, bq), (Wk, bk), (Wv, bv) = (_linear(x) for x in (sa.query, sa.key, sa.value))
        Wo, bo = _linear(self.output_module(sa))
        scaling = getattr(sa, "scaling", sa.attention_head_size ** -0.5)
        return _dense(Wq, Wk, Wv, Wo, bq, bk, bv, bo, sa.num_attention_heads, scaling, dtype)


def lengths(attention_mask: Optional[Tensor], batch: int, n: int) -> List[int]:
    """Real token counts per sample from a right-padding mask (B, n) of 1/0 (None: all n)."""
    if attention_mask is None:
        return [n] * batch
    m = attention_mask.to(torch.long)
    ln = m.sum(-1)
    ar = torch.arange(m.shape[-1], device=m.device)
    if not torch.equal(m, (ar[None] < ln[:, None]).to(torch.long)):
        raise ValueError("attention_mask must be right padding (ones then zeros); tokenize with padding_side='right'")
    return [int(x) for x in ln]


# after the adapters above, so that these are tried first (later registrations win)
from harness.models import adapters_modern  # noqa: E402,F401 - registers the RoPE / relative-position adapters
