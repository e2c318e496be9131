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

import math
from typing import Dict, Iterable, List, Optional, Sequence, Type

import torch

from harness.kernels.attention import AttentionWeights

Tensor = torch.Tensor
_ADAPTERS: List[Type["Adapter"]] = []


def register_adapter(cls: Type["Adapter"]) -> Type["Adapter"]:
    """Add an adapter class (usable as a decorator); later registrations are tried first."""
    _ADAPTERS.insert(0, cls)
    return cls


def supported() -> List[str]:
    return [c.name for c in reversed(_ADAPTERS)]


class UnsupportedModel(ValueError):
    pass


def adapter_for(model) -> "Adapter":
    """The adapter matching `model`, or UnsupportedModel listing the supported architectures."""
    for cls in _ADAPTERS:
        if cls.matches(model):
            return cls(model)
    mt = getattr(getattr(model, "config", None), "model_type", None)
    raise UnsupportedModel(
        f"unsupported architecture {type(model).__name__}" + (f" (model_type {mt!r})" if mt else "")
        + f"; supported: {', '.join(supported())}. To add one, subclass harness.models.adapters.Adapter "
        "(name, model_types, modules(), weights(module), causal) and call register_adapter(YourAdapter); "
        "see the module docstring")


def _dense(Wq, Wk, Wv, Wo, bq, bk, bv, bo, heads: int, scaling: float, dtype) -> AttentionWeights:
    """Full projections acting on row vectors (x -> x W, (d, h*dh)) -> AttentionWeights; `scaling` is the model's
    score factor, folded into wq, bq so that scores = q k^T / sqrt(dh)."""
    dh = Wq.shape[-1] // heads
    c = scaling * math.sqrt(dh)
    cast = lambda t: None if t is None else t.detach().to(dtype).clone()
    bq = cast(bq)
    return AttentionWeights.from_dense(cast(Wq) * c, cast(Wk), cast(Wv), cast(Wo), heads=heads,
                                       bq=None if bq is None else bq * c, bk=cast(bk), bv=cast(bv), bo=cast(bo))


def _linear(m):
    """nn.Linear (weight (out, in), x -> x W^T + b) -> (W (in, out), b)."""
    return m.weight.T, m.bias


class _Stop(Exception):
    pass


class Adapter:
    """Base class. Subclasses set `name`, `model_types` and implement `modules` and `weights`."""

    name = "?"
    model_types: Sequence[str] = ()
    padding_mask: Optional[Tensor] = None  # (B, n) 1/0 right-padding mask seen in the forward pass, if any

    def __init__(self, model):
        self.model = model

    @classmethod
    def matches(cls, model) -> bool:
        return getattr(getattr(model, "config", None), "model_type", None) in cls.model_types

    @property
    def causal(self) -> bool:
        return bool(getattr(getattr(self.model, "config", None), "is_decoder", False))

    def modules(self) -> List[torch.nn.Module]:  # pragma: no cover - interface
        """The self-attention modules, one per layer application, in the order the forward pass calls them."""
        raise NotImplementedError

    def weights(self, module, dtype=torch.float64) -> AttentionWeights:  # pragma: no cover - interface
        raise NotImplementedError

    def hidden(self, args, kwargs) -> Tensor:
        """The module's input X (B, n, d) from its forward arguments."""
        return args[0] if args else kwargs["hidden_states"]

    def output(self, out) -> Tensor:
        """The module's map F(X) (B, n, d) from its forward output (before residual and LayerNorm)."""
        return out[0] if isinstance(out, tuple) else out

    def output_module(self, module) -> torch.nn.Module:
        """Module whose forward output is F(X) (the attention module itself by default)."""
        return module

    def attention_map(self, layer: int, n: int, dtype=torch.float64, device=None):
        """The layer's exact map at n tokens (harness.models.adapters_modern.AttentionMap) where it is not
        softmax(X wq wk^T X^T / sqrt(dh)) X wv wo as `weights` describes it (RoPE, relative biases); None here."""
        return None

    @property
    def n_layers(self) -> int:
        return len(self.modules())

    def layer_weights(self, layer: int, dtype=torch.float64) -> AttentionWeights:
        mods = self.modules()
        if not -len(mods) <= layer < len(mods):
            raise ValueError(f"layer {layer} out of range: the model has {len(mods)} attention layers")
        return self.weights(mods[layer], dtype)

    def run(self, inputs) -> None:
        """Run the model on `inputs` (a dict of keyword arguments, or a tensor / tuple of positional ones)."""
        if isinstance(inputs, dict):
            self.model(**inputs)
        elif isinstance(inputs, (tuple, list)):
            self.model(*inputs)
        else:
            self.model(inputs)

    def capture(self, inputs, layers: Iterable[int], outputs: bool = False) -> Dict[str, Dict[int, Tensor]]:
        """One forward pass with hooks: {"inputs": {layer: X (B, n, d)}, "outputs": {layer: F(X)}} in the model's
        dtype, keyed by the requested indices (-1 stays -1). Stops after the deepest requested layer."""
        mods = self.modules()
        L = len(mods)
        req = list(layers)
        for l in req:
            if not -L <= l < L:
                raise ValueError(f"layer {l} out of range: the model has {L} attention layers")
        want = {l % L for l in req}
        last = max(want)
        calls: Dict[int, int] = {}  # id(module) -> calls so far
        order: Dict[int, List[int]] = {}  # id(module) -> the layer indices it serves, in call order
        for i, m in enumerate(mods):
            order.setdefault(id(m), []).append(i)
        got = {"inputs": {}, "outputs": {}}
        pending: List[int] = []

        def pre(mod, args, kwargs):
            k = calls.get(id(mod), 0)
            calls[id(mod)] = k + 1
            idx = order[id(mod)]
            if k >= len(idx):
                return
            i = idx[k]
            pending.append(i)
            if i in want:
                got["inputs"][i] = self.hidden(args, kwargs).detach()
            if i == last and not outputs:
                raise _Stop

        def post(mod, args, out):  # the output module runs after the pre-hook of its own layer
            i = pending[-1] if pending else None
            if i is not None and i in want:
                got["outputs"][i] = self.output(out).detach()
            if i == last:
                raise _Stop

        handles = []
        for m in {id(m): m for m in mods}.values():
            handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            if outputs:
                handles.append(self.output_module(m).register_forward_hook(post))
        try:
            with torch.no_grad():
                self.run(inputs)
        except _Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        return {k: {l: v[l % L] for l in req if l % L in v} for k, v in got.items()}


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

    def capture(self, inputs, layers, outputs=False):
        self._bf = all(m.batch_first for m in self.modules())
        return super().capture(inputs, layers, outputs)

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
        cfg = self.model.config
        per = cfg.num_hidden_layers / cfg.num_hidden_groups
        out = []
        for i in range(cfg.num_hidden_layers):
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


from harness.models import adapters_modern  # noqa: E402,F401 - registers the RoPE / relative-position adapters
