"""Adapters for the attention of current models: rotary position embeddings (Llama, Mistral, Qwen2; grouped- and
multi-query attention), T5's relative position bias and DeBERTa-v2's disentangled relative attention.

The measured map is the same as for BERT: the sublayer's output projection applied to multi-head attention of the
sublayer's input X (after the norm where the block is pre-norm), positions 0..n-1 fixed, no residual:
    Llama / Mistral / Qwen2  X = input_layernorm output (RMSNorm), F = self_attn(X) (o_proj), causal
    T5 (encoder)             X = layer_norm output, F = SelfAttention(X) (o), no score scaling, bias added
    DeBERTa-v2               X = hidden state entering the layer, F = attention.output.dense(attention.self(X))
These maps are not softmax(X W_Q W_K^T X^T / sqrt(dh)) X W_V W_O, so each adapter also gives an `AttentionMap`:
the exact map in float64 from the layer's weights and the position terms the forward pass used (RoPE cos/sin,
the relative bias, DeBERTa's projected relative embeddings), which `attnlip analyze` differentiates for the truth.
`weights()` still gives AttentionWeights (key/value heads repeated for each query head they serve, the score
scaling folded into wq, bq) for the quantities that only read the projections.

Score of head l between tokens i and j (q_i = x_i wq_l + bq_l with the scaling folded in, k_j, v_j likewise):
    s_ij = (rot_i q_i) . (rot_j k_j) / sqrt(dh)  + bias_l[i, j]  + q_i . c2p_l[i, j] / sqrt(dh)  + k_j . p2c_l[i, j]
with rot the RoPE rotation at the token's position (identity without RoPE), bias T5's relative bias, c2p / p2c
DeBERTa's gathered relative key / query embeddings (p2c pre-divided by DeBERTa's scale).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional, Tuple

import torch

from harness.kernels.attention import AttentionWeights, causal_mask
from harness.models.adapter_base import Adapter, _dense, _linear, register_adapter

Tensor = torch.Tensor
FEATURES = ("rope", "score_bias", "rel_pos")  # score terms beyond q k^T / sqrt(dh) an AttentionMap may carry


def _rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


@dataclass
class AttentionMap:
    """The exact attention map of one layer at n tokens (float64 by default).

    w: per-query-head AttentionWeights (scores q k^T / sqrt(dh) before the extra terms); cos, sin (n, dh): RoPE;
    bias (h, n, n): added to the scores; pos_key (h, m, dh) with c2p_idx (n, n) and pos_query (h, m, dh) with
    p2c_idx (n, n): DeBERTa's c2p / p2c terms; causal: the causal mask."""

    w: AttentionWeights
    causal: bool = False
    cos: Optional[Tensor] = None
    sin: Optional[Tensor] = None
    bias: Optional[Tensor] = None
    pos_key: Optional[Tensor] = None
    c2p_idx: Optional[Tensor] = None
    pos_query: Optional[Tensor] = None
    p2c_idx: Optional[Tensor] = None

    @property
    def features(self) -> Tuple[str, ...]:
        return tuple(f for f, on in zip(FEATURES, (self.cos is not None, self.bias is not None,
                                                    self.pos_key is not None or self.pos_query is not None)) if on)

    def _qkv(self, Xh: Tensor):
        w = self.w
        add = lambda t, b: t if b is None else t + b[:, None, :]
        q, k, v = (add(Xh @ W, b) for W, b in ((w.wq, w.bq), (w.wk, w.bk), (w.wv, w.bv)))  # (..., h, n, dh)
        return q, k, v

    def scores(self, Xh: Tensor) -> Tensor:
        """Scores of every head, each from its own copy of the input: Xh (..., h, n, d) -> (..., h, n, n); masked
        entries are 0 (the softmax never reads them)."""
        q, k, _ = self._qkv(Xh)
        return self._scores(q, k)

    def _scores(self, q: Tensor, k: Tensor) -> Tensor:
        qr, kr = q, k
        if self.cos is not None:
            qr, kr = q * self.cos + _rotate_half(q) * self.sin, k * self.cos + _rotate_half(k) * self.sin
        s = qr @ kr.transpose(-1, -2)
        n = q.shape[-2]
        if self.pos_key is not None:  # c2p: q_i . pos_key[c2p_idx[i, j]]
            s = s + torch.gather(q @ self.pos_key.transpose(-1, -2), -1, self.c2p_idx.expand(*q.shape[:-1], n))
        s = s / math.sqrt(self.w.dh)
        if self.pos_query is not None:  # p2c: k_j . pos_query[p2c_idx[j, i]]
            g = torch.gather(k @ self.pos_query.transpose(-1, -2), -1, self.p2c_idx.expand(*k.shape[:-1], n))
            s = s + g.transpose(-1, -2)
        if self.bias is not None:
            s = s + self.bias
        if self.causal:
            s = s.masked_fill(causal_mask(n, s.device), 0.0)
        return s

    def probs_heads(self, Xh: Tensor) -> Tensor:
        s = self.scores(Xh)
        if self.causal:
            s = s.masked_fill(causal_mask(s.shape[-1], s.device), float("-inf"))
        return torch.softmax(s, dim=-1)

    def probs(self, X: Tensor) -> Tensor:
        """Attention maps (..., h, n, n) at X (..., n, d)."""
        return self.probs_heads(self._expand(X))

    def heads(self, Xh: Tensor) -> Tensor:
        """Every head's map f_l, each from its own copy of the input: Xh (..., h, n, d) -> (..., h, n, d)."""
        q, k, v = self._qkv(Xh)
        s = self._scores(q, k)
        if self.causal:
            s = s.masked_fill(causal_mask(s.shape[-1], s.device), float("-inf"))
        return torch.softmax(s, dim=-1) @ v @ self.w.wo

    def _expand(self, X: Tensor) -> Tensor:
        return X.unsqueeze(-3).expand(*X.shape[:-2], self.w.h, *X.shape[-2:])

    def layer(self, X: Tensor) -> Tensor:
        """F(X) = sum_l f_l(X) + bo: (..., n, d) -> (..., n, d)."""
        out = self.heads(self._expand(X)).sum(-3)
        return out if self.w.bo is None else out + self.w.bo


def _expand_kv(W: Tensor, b: Optional[Tensor], heads: int, kv_heads: int, dh: int):
    """(d, kv*dh) key/value projection -> (d, h*dh), kv head l // (h / kv) serving query head l (repeat_kv)."""
    rep = heads // kv_heads
    W = W.reshape(W.shape[0], kv_heads, 1, dh).expand(-1, -1, rep, -1).reshape(W.shape[0], heads * dh)
    b = None if b is None else b.reshape(kv_heads, 1, dh).expand(-1, rep, -1).reshape(heads * dh)
    return W, b


class _ContextAdapter(Adapter):
    """Keeps the position terms the forward pass hands the attention modules (the same for every layer)."""

    def __init__(self, model):
        super().__init__(model)
        self.context = {}

    def hidden(self, args, kwargs) -> Tensor:
        self.context.update({k: kwargs[k] for k in self.context_keys if kwargs.get(k) is not None})
        return super().hidden(args, kwargs)

    context_keys: Tuple[str, ...] = ()

    def attention_map(self, layer: int, n: int, dtype=torch.float64, device=None) -> AttentionMap:
        raise NotImplementedError  # pragma: no cover - interface


@register_adapter
class RotaryAdapter(_ContextAdapter):
    """Llama / Mistral / Qwen2 decoders: RoPE, grouped- and multi-query attention, pre-norm (RMSNorm), causal."""

    name = "Llama / Mistral / Qwen2 (RoPE, GQA)"
    model_types = ("llama", "mistral", "qwen2")
    causal = True
    context_keys = ("position_embeddings",)

    def modules(self):
        return [L.self_attn for L in getattr(self.model, "base_model", self.model).layers]

    def run(self, inputs) -> None:
        """One pass without a key/value cache (nothing is generated; a cache would keep the keys)."""
        super().run(dict(inputs, use_cache=False) if isinstance(inputs, dict) else inputs)

    def weights(self, a, dtype=torch.float64):
        if hasattr(a, "q_norm") or hasattr(a, "k_norm"):
            raise ValueError(f"{self.name} adapter: per-head q/k normalization is not supported")
        hf_config = self.model.config
        h, kv, dh = hf_config.num_attention_heads, hf_config.num_key_value_heads, a.head_dim
        (Wq, bq), (Wk, bk), (Wv, bv), (Wo, bo) = (_linear(x) for x in (a.q_proj, a.k_proj, a.v_proj, a.o_proj))
        (Wk, bk), (Wv, bv) = _expand_kv(Wk, bk, h, kv, dh), _expand_kv(Wv, bv, h, kv, dh)
        return _dense(Wq, Wk, Wv, Wo, bq, bk, bv, bo, h, a.scaling, dtype)

    def attention_map(self, layer, n, dtype=torch.float64, device=None):
        a = self.modules()[layer]
        window = self.model.config.sliding_window if self.model.config.model_type == "mistral" else None
        window = getattr(a, "sliding_window", None) or window
        if window is not None and n > window:
            raise ValueError(f"layer {layer}: {n} tokens exceed the sliding window ({window}); pass --max-tokens "
                             f"{window} or fewer")
        if "position_embeddings" not in self.context:
            raise ValueError("run the model first (capture) so the rotary cos/sin it uses are known")
        cos, sin = (t.detach() for t in self.context["position_embeddings"])
        if cos.dim() == 3:
            if not (torch.equal(cos, cos[:1].expand_as(cos)) and torch.equal(sin, sin[:1].expand_as(sin))):
                raise ValueError(f"{self.name}: samples with different position ids (left padding?) are not "
                                 "supported; pad on the right")
            cos, sin = cos[0], sin[0]
        cast = lambda t: t[:n].to(dtype=dtype, device=device)
        w = self.weights(a, dtype).to(device=device)
        return AttentionMap(w, causal=True, cos=cast(cos), sin=cast(sin))


@register_adapter
class T5Adapter(_ContextAdapter):
    """T5 encoder self-attention (T5Model, T5EncoderModel): relative position bias, no score scaling."""

    name = "T5 encoder (relative position bias)"
    model_types = ("t5",)

    def _encoder(self):
        return self.model.encoder if hasattr(self.model, "encoder") else self.model

    def modules(self):
        return [blk.layer[0].SelfAttention for blk in self._encoder().block]

    def run(self, inputs) -> None:
        if isinstance(inputs, dict):
            self._encoder()(**{k: v for k, v in inputs.items() if k in ("input_ids", "attention_mask")})
        else:
            super().run(inputs)

    def weights(self, a, dtype=torch.float64):
        (Wq, _), (Wk, _), (Wv, _), (Wo, _) = (_linear(x) for x in (a.q, a.k, a.v, a.o))
        return _dense(Wq, Wk, Wv, Wo, None, None, None, None, a.n_heads, getattr(a, "scaling", 1.0), dtype)

    def attention_map(self, layer, n, dtype=torch.float64, device=None):
        first = self.modules()[0]
        with torch.no_grad():
            bias = first.compute_bias(n, n, device=first.relative_attention_bias.weight.device)[0]
        w = self.weights(self.modules()[layer], dtype).to(device=device)
        return AttentionMap(w, bias=bias.to(dtype=dtype, device=device))


@register_adapter
class DebertaV2Adapter(_ContextAdapter):
    """DeBERTa-v2/v3: disentangled attention (content-to-position c2p, position-to-content p2c) with relative
    embeddings; X = hidden state entering the layer (post-LN)."""

    name = "DeBERTa-v2 (disentangled relative attention)"
    model_types = ("deberta-v2",)
    context_keys = ("relative_pos", "rel_embeddings")

    def _layers(self):
        return getattr(self.model, "base_model", self.model).encoder.layer

    def modules(self):
        return [L.attention.self for L in self._layers()]

    def output_module(self, sa):
        for L in self._layers():
            if L.attention.self is sa:
                return L.attention.output.dense
        raise ValueError("attention module not found in the encoder")

    def _scale(self, sa) -> float:
        """DeBERTa's score divisor sqrt(dh * (1 + #pos terms)), computed in float32 as the model does."""
        sf = 1 + ("c2p" in sa.pos_att_type) + ("p2c" in sa.pos_att_type)
        return float(torch.sqrt(torch.tensor(sa.attention_head_size, dtype=torch.float) * sf))

    def weights(self, sa, dtype=torch.float64):
        (Wq, bq), (Wk, bk), (Wv, bv) = (_linear(x) for x in (sa.query_proj, sa.key_proj, sa.value_proj))
        Wo, bo = _linear(self.output_module(sa))
        return _dense(Wq, Wk, Wv, Wo, bq, bk, bv, bo, sa.num_attention_heads, 1.0 / self._scale(sa), dtype)

    def attention_map(self, layer, n, dtype=torch.float64, device=None):
        sa = self.modules()[layer]
        w = self.weights(sa, dtype).to(device=device)
        if not sa.relative_attention:
            return AttentionMap(w)
        if "rel_embeddings" not in self.context:
            raise ValueError("run the model first (capture) so the relative embeddings it uses are known")
        rel = self.context["relative_pos"].reshape(-1, *self.context["relative_pos"].shape[-2:])[0, :n, :n]
        span, h, dh = sa.pos_ebd_size, sa.num_attention_heads, sa.attention_head_size
        E = self.context["rel_embeddings"][: 2 * span].to(dtype)
        proj = lambda m: torch.nn.functional.linear(E, m.weight.to(dtype), None if m.bias is None else
                                                    m.bias.to(dtype)).reshape(-1, h, dh).transpose(0, 1)
        kw = {}
        if "c2p" in sa.pos_att_type:
            pk = proj(sa.key_proj if sa.share_att_key else sa.pos_key_proj)  # (h, 2 span, dh)
            # the folded query carries 1/scale * sqrt(dh); c2p is divided by sqrt(dh) in _scores
            kw.update(pos_key=pk.to(device), c2p_idx=torch.clamp(rel + span, 0, 2 * span - 1).to(device))
        if "p2c" in sa.pos_att_type:
            pq = proj(sa.query_proj if sa.share_att_key else sa.pos_query_proj) / self._scale(sa)
            kw.update(pos_query=pq.to(device), p2c_idx=torch.clamp(-rel + span, 0, 2 * span - 1).to(device))
        return AttentionMap(w, **kw)
