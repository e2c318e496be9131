"""The adapter interface and its registry (harness.models.adapters has the architectures and the user-facing
documentation): `Adapter`, `register_adapter`, `adapter_for`, and the helpers every adapter shares to turn
projections into AttentionWeights (`_dense`, `_linear`)."""
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

    def probabilities(self, out) -> Optional[Tensor]:
        """The attention probabilities P (B, h, n, n) from the attention module's forward output (the second
        element of its tuple, as Hugging Face's eager attention returns them), or None where it has none."""
        p = out[1] if isinstance(out, tuple) and len(out) > 1 else None
        return p if isinstance(p, Tensor) and p.dim() == 4 else None

    def capture(self, inputs, layers: Iterable[int], outputs: bool = False,
                probs: bool = False) -> Dict[str, Dict[int, Tensor]]:
        """One forward pass with hooks: {"inputs": {layer: X (B, n, d)}, "outputs": {layer: F(X)}} (outputs=True)
        and, with probs=True, "probs": {layer: P (B, h, n, n)} (`probabilities`), in the model's dtype, keyed by
        the requested indices (-1 stays -1). Stops once the deepest requested layer has given what is asked."""
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
        got = {"inputs": {}, "outputs": {}, **({"probs": {}} if probs else {})}
        needed = [k for k, on in (("inputs", True), ("outputs", outputs), ("probs", probs)) if on]
        pending: List[int] = []

        def maybe_stop(i):
            if i == last and all(i in got[k] for k in needed):
                raise _Stop

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
            maybe_stop(i)

        def post(key, read):  # forward hooks run after the pre-hook of their own layer application
            def hook(mod, args, out):
                i = pending[-1] if pending else None
                if i is not None and i in want:
                    value = read(out)
                    if value is None:  # only `probabilities` can have nothing to give
                        raise ValueError(f"{self.name} adapter: the attention module of layer {i} does not return "
                                         "its attention probabilities (B, h, n, n); capture with probs=False")
                    got[key][i] = value.detach()
                    maybe_stop(i)
            return hook

        handles = []
        for m in {id(m): m for m in mods}.values():
            handles.append(m.register_forward_pre_hook(pre, with_kwargs=True))
            if probs:  # before the output hook: on a module that is its own output module, it must run first
                handles.append(m.register_forward_hook(post("probs", self.probabilities)))
            if outputs:
                handles.append(self.output_module(m).register_forward_hook(post("outputs", self.output)))
        try:
            with torch.no_grad():
                self.run(inputs)
        except _Stop:
            pass
        finally:
            for h in handles:
                h.remove()
        return {k: {l: v[l % L] for l in req if l % L in v} for k, v in got.items()}
