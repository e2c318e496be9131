"""Training regularizers on a ViT's attention: JaSMin_k (docs/math.md §2, eqs. 8-9) and the Specformer penalty.

A regularizer is called as `reg(model, probs)` with probs the per-layer attention maps [(B, h, n, n)] of the
current batch (from ViT.forward(x, return_attn=True)) and returns lambda * penalty (a scalar). `needs_attn`
tells the training loop whether to collect the maps; `recipe` is what keys a trained model's cache entry.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence

import torch

from harness.bounds.jasmin import jasmin_penalty

Tensor = torch.Tensor


class JaSMin:
    """lambda * L_k with L_0 = sum_{l,h} agg_i log g_1(P_i), L_k = sum_{l,h} agg_i log(g_1(P_i)/g_k(P_i)) (eqs. 8-9)."""

    needs_attn = True

    def __init__(self, k: int = 0, lam: float = 1e-3, agg: str = "mean"):
        if not isinstance(k, int) or k < 0 or k == 1:
            raise ValueError(f"JaSMin k must be 0 or an integer > 1, got {k!r}")
        if agg not in ("mean", "max"):
            raise ValueError(f"JaSMin agg must be 'mean' or 'max', got {agg!r}")
        if lam < 0:
            raise ValueError(f"JaSMin lambda must be >= 0, got {lam}")
        self.k, self.lam, self.agg = k, float(lam), agg

    @property
    def recipe(self) -> Dict:
        return {"type": "jasmin", "k": self.k, "lam": self.lam, "agg": self.agg}

    def penalty(self, probs: Sequence[Tensor]) -> Tensor:
        """L_k (without lambda) for per-layer maps [(B, h, n, n)]."""
        if len(probs) == 0:
            raise ValueError("JaSMin needs the attention maps (call the model with return_attn=True)")
        return jasmin_penalty(list(probs), self.k, self.agg, batch_dims=1)

    def __call__(self, model, probs: Optional[Sequence[Tensor]] = None) -> Tensor:
        return self.lam * self.penalty(probs or [])


def _attn_modules(model) -> List:
    """The MHSA modules of a ViT-like model (anything with .blocks[i].attn holding Wq/Wk/Wv and heads)."""
    blocks = getattr(model, "blocks", None)
    if blocks is None or not all(hasattr(b, "attn") and hasattr(b.attn, "Wq") for b in blocks):
        raise ValueError("Specformer penalty needs a model with .blocks[i].attn.{Wq,Wk,Wv,heads} (harness ViT)")
    return [b.attn for b in blocks]


def head_matrices(W: Tensor, heads: int) -> Tensor:
    """Per-head blocks of a projection W (d, h*dh) split on the OUTPUT axis: (h, d, dh)."""
    d, inner = W.shape
    return W.reshape(d, heads, inner // heads).permute(1, 0, 2)


def sigma1(M: Tensor, v0: Optional[Tensor] = None, iters: int = 10):
    """Top singular value of a batch of matrices M (..., a, b) by power iteration on M^T M.

    The vectors are found without gradient; sigma = u^T M v then carries the exact gradient u v^T of sigma_1
    at convergence (as in torch's spectral_norm). Returns (sigma (...,), v (..., b)) for warm starts.
    """
    with torch.no_grad():
        v = torch.randn(M.shape[:-2] + M.shape[-1:], dtype=M.dtype, device=M.device,
                        generator=torch.Generator(device=M.device).manual_seed(0)) if v0 is None else v0.clone()
        v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        for _ in range(iters):
            u = (M @ v.unsqueeze(-1)).squeeze(-1)  # (..., a)
            u = u / u.norm(dim=-1, keepdim=True).clamp_min(1e-30)
            v = (M.transpose(-1, -2) @ u.unsqueeze(-1)).squeeze(-1)  # (..., b)
            v = v / v.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        u = (M @ v.unsqueeze(-1)).squeeze(-1)
        u = u / u.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    sigma = (u.unsqueeze(-2) @ M @ v.unsqueeze(-1)).squeeze(-1).squeeze(-1)  # (...,)
    return sigma, v.detach()


class Specformer:
    """lambda_q sigma_1(W^Q_h)^2 + lambda_k sigma_1(W^K_h)^2 + lambda_v sigma_1(W^V_h)^2, summed over layers and
    heads (Hu et al. 2024; JaSMin's baseline). Heads are split on the projection's output axis. Power
    iteration is warm-started across calls (`iters` steps per call)."""

    needs_attn = False

    def __init__(self, lam_q: float = 1e-3, lam_k: float = 1e-3, lam_v: float = 1e-3, iters: int = 5):
        if min(lam_q, lam_k, lam_v) < 0:
            raise ValueError(f"Specformer lambdas must be >= 0, got {(lam_q, lam_k, lam_v)}")
        if iters < 1:
            raise ValueError(f"iters must be >= 1, got {iters}")
        self.lams = {"Wq": float(lam_q), "Wk": float(lam_k), "Wv": float(lam_v)}
        self.iters = iters
        self._v: Dict = {}

    def reset(self) -> None:
        """Forget the warm-start vectors (train_classifier calls this before training)."""
        self._v = {}

    @classmethod
    def variant(cls, which: str, lam: float, iters: int = 5) -> "Specformer":
        """'joint' (all three lambdas = lam) or the per-matrix variants 'q', 'k', 'v' (one lambda, others 0)."""
        table = {"joint": (lam, lam, lam), "q": (lam, 0, 0), "k": (0, lam, 0), "v": (0, 0, lam)}
        if which not in table:
            raise ValueError(f"Specformer variant must be one of {sorted(table)}, got {which!r}")
        return cls(*table[which], iters=iters)

    @property
    def recipe(self) -> Dict:
        return {"type": "specformer", "lam_q": self.lams["Wq"], "lam_k": self.lams["Wk"],
                "lam_v": self.lams["Wv"], "iters": self.iters}

    def sigmas(self, model, names: Optional[Sequence[str]] = None) -> Dict[str, Tensor]:
        """{'Wq'|'Wk'|'Wv': sigma_1 per layer and head (L, h)} (differentiable)."""
        names = list(self.lams) if names is None else list(names)
        out: Dict[str, List[Tensor]] = {k: [] for k in names}
        for li, attn in enumerate(_attn_modules(model)):
            for name in names:
                M = head_matrices(getattr(attn, name), attn.heads)  # (h, d, dh)
                key = (li, name)
                v0 = self._v.get(key)
                if v0 is not None and (v0.shape != M.shape[:-2] + M.shape[-1:] or v0.dtype != M.dtype):
                    v0 = None
                s, self._v[key] = sigma1(M, v0, self.iters if v0 is not None else max(self.iters, 30))
                out[name].append(s)
        return {k: torch.stack(v) for k, v in out.items()}

    def __call__(self, model, probs=None) -> Tensor:
        active = [n for n, lam in self.lams.items() if lam > 0]
        total = torch.zeros((), dtype=_attn_modules(model)[0].Wq.dtype)
        for name, s in self.sigmas(model, active).items():
            total = total + self.lams[name] * s.square().sum()
        return total


def from_recipe(recipe: Optional[Dict]):
    """Rebuild a regularizer from its .recipe dict (None -> None)."""
    if recipe is None:
        return None
    c = dict(recipe)
    t = c.pop("type", None)
    if t == "jasmin":
        return JaSMin(**c)
    if t == "specformer":
        return Specformer(**c)
    raise ValueError(f"unknown regularizer type {t!r}: use 'jasmin' or 'specformer'")


METHODS = ("baseline", "specformer", "jasmin")


def for_method(method: str = "baseline", k: Optional[int] = None, lam: Optional[float] = None,
               agg: Optional[str] = None, variant: Optional[str] = None):
    """The regularizer of a JaSMin sweep entry: None (baseline), Specformer.variant(variant, lam) or
    JaSMin(k, lam, agg)."""
    if method == "baseline":
        return None
    if method == "specformer":
        return Specformer.variant(variant, float(lam))
    if method == "jasmin":
        return JaSMin(int(k), float(lam), agg)
    raise ValueError(f"unknown method {method!r}: use one of {METHODS}")


def method_label(method: str = "baseline", k: Optional[int] = None, lam: Optional[float] = None,
                 agg: Optional[str] = None, variant: Optional[str] = None) -> str:
    """Human label of a sweep entry: Baseline, Specformer(joint, 1e-2), JaSMin k=10 lam=1e-2 mean."""
    if method == "baseline":
        return "Baseline"
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}: use one of {METHODS}")
    lam_s = f"{float(lam):.0e}".replace("e-0", "e-")
    if method == "specformer":
        return f"Specformer({variant}, {lam_s})"
    return f"JaSMin k={int(k)} lam={lam_s} {agg}"
