"""Multi-head dot-product self-attention in the conventions of docs/math.md §0.

Per head l: S_l = X wq_l (X wk_l)^T / sqrt(dh), P_l = softmax_rows(S_l), F(X) = H X + sum_l P_l X VO_l.
Everything is batched over leading dimensions of X: (n, d) or (..., n, d).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Optional

import torch

from harness.settings import COMPUTE_DTYPES, torch_dtype

from .linalg import all_finite, prod_norm

Tensor = torch.Tensor


def check_finite(name: str, t: Tensor) -> None:
    """Raise ValueError if `t` holds NaN or inf."""
    if not all_finite(t):
        raise ValueError(f"{name} contains NaN or inf values")


def check_input(X: Tensor, d: Optional[int] = None, name: str = "X") -> None:
    """Validate a token matrix X of shape (..., n, d): tensor, floating, >= 2 dims, n >= 1, finite."""
    if not isinstance(X, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(X).__name__}")
    if X.dim() < 2:
        raise ValueError(f"{name} must have shape (n, d) or (B, n, d), got shape {tuple(X.shape)}")
    if not X.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor, got dtype {X.dtype}")
    if X.shape[-2] == 0:
        raise ValueError(f"{name} is an empty sequence (n = 0), shape {tuple(X.shape)}")
    if d is not None and X.shape[-1] != d:
        raise ValueError(f"{name} has feature dimension {X.shape[-1]} but the weights expect d = {d}")
    check_finite(name, X)


SUPPORTED_DTYPES = tuple(map(torch_dtype, COMPUTE_DTYPES))  # harness.settings: half precisions are refused


def check_pair(X: Tensor, w: "AttentionWeights", name: str = "X") -> None:
    """THE input rule of every bound and exact quantity (one rule, documented in the README):

    - X: a floating tensor (..., n, d) with n >= 1 and finite entries, float32 or float64 (float16/bfloat16 are
      refused: spectral norms and Lanczos need at least float32; cast first);
    - w: an AttentionWeights with w.d == d, of X's dtype and on X's device (never cast silently:
      `w.to(dtype=X.dtype, device=X.device)`);
    - an empty batch (0, n, d) is valid and gives an empty result.
    Anything else is a ValueError naming the argument."""
    if not isinstance(w, AttentionWeights):
        raise ValueError(f"w must be an AttentionWeights, got {type(w).__name__}")
    check_input(X, w.d, name)
    if X.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"{name} has dtype {X.dtype}: only float32 and float64 are supported (spectral norms and "
                         f"Lanczos need at least float32); cast {name} and w with .to(torch.float32)")
    if X.dtype != w.dtype:
        raise ValueError(f"{name} has dtype {X.dtype} but the weights have dtype {w.dtype}: cast one of them "
                         f"(w.to(dtype={name}.dtype)); nothing is cast silently")
    if X.device != w.device:
        raise ValueError(f"{name} is on {X.device} but the weights are on {w.device}: move one of them")


@dataclass(frozen=True)
class AttentionWeights:
    """Weights of one multi-head attention layer (docs/math.md §0).

    wq, wk, wv: (h, d, dh); wo: (h, dh, d); optional biases bq, bk, bv: (h, dh), bo: (d,).
    """

    wq: Tensor
    wk: Tensor
    wv: Tensor
    wo: Tensor
    bq: Optional[Tensor] = None
    bk: Optional[Tensor] = None
    bv: Optional[Tensor] = None
    bo: Optional[Tensor] = None

    def __post_init__(self):
        for f in ("wq", "wk", "wv", "wo"):
            t = getattr(self, f)
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"AttentionWeights.{f} must be a torch.Tensor, got {type(t).__name__}")
            if t.dim() != 3:
                raise ValueError(f"AttentionWeights.{f} must be 3-D (h, ., .), got shape {tuple(t.shape)}")
        h, d, dh = self.wq.shape
        if h < 1 or d < 1 or dh < 1:
            raise ValueError(f"AttentionWeights.wq has an empty dimension: shape {tuple(self.wq.shape)}")
        for f in ("wk", "wv"):
            if tuple(getattr(self, f).shape) != (h, d, dh):
                raise ValueError(f"AttentionWeights.{f} has shape {tuple(getattr(self, f).shape)}, "
                                 f"expected (h, d, dh) = {(h, d, dh)}")
        if tuple(self.wo.shape) != (h, dh, d):
            raise ValueError(f"AttentionWeights.wo has shape {tuple(self.wo.shape)}, "
                             f"expected (h, dh, d) = {(h, dh, d)}")
        for f, shape in (("bq", (h, dh)), ("bk", (h, dh)), ("bv", (h, dh)), ("bo", (d,))):
            b = getattr(self, f)
            if b is not None:
                if not isinstance(b, torch.Tensor) or tuple(b.shape) != shape:
                    got = tuple(b.shape) if isinstance(b, torch.Tensor) else type(b).__name__
                    raise ValueError(f"AttentionWeights.{f} has shape {got}, expected {shape}")
        for f in fields(self):
            t = getattr(self, f.name)
            if t is not None:
                if not t.is_floating_point():
                    raise ValueError(f"AttentionWeights.{f.name} must be floating point, got {t.dtype}")
                if t.device != self.wq.device:
                    raise ValueError(f"AttentionWeights.{f.name} is on {t.device}, wq on {self.wq.device}")
                check_finite(f"AttentionWeights.{f.name}", t)

    # ---- constructors -------------------------------------------------------------------------------
    @classmethod
    def from_dense(cls, Wq: Tensor, Wk: Tensor, Wv: Tensor, Wo: Tensor, heads: int,
                   bq: Optional[Tensor] = None, bk: Optional[Tensor] = None,
                   bv: Optional[Tensor] = None, bo: Optional[Tensor] = None) -> "AttentionWeights":
        """Split full (d, d) projections (x -> x W, heads contiguous on the output axis) into per-head weights.

        Wq, Wk, Wv: (d, h*dh) acting on row vectors; Wo: (h*dh, d). Biases: (h*dh,) and (d,).
        """
        d = Wq.shape[0]
        if heads < 1:
            raise ValueError(f"heads must be >= 1, got {heads}")
        inner = Wq.shape[-1]
        if inner % heads != 0:
            raise ValueError(f"projection width {inner} (d = {d}) is not divisible by the number of heads h = {heads}")
        dh = inner // heads

        def split_in(W):  # (d, h*dh) -> (h, d, dh)
            return W.reshape(W.shape[0], heads, dh).permute(1, 0, 2).contiguous()

        def split_b(b):
            return None if b is None else b.reshape(heads, dh).contiguous()

        return cls(split_in(Wq), split_in(Wk), split_in(Wv), Wo.reshape(heads, dh, Wo.shape[-1]).contiguous(),
                   split_b(bq), split_b(bk), split_b(bv), bo)

    @classmethod
    def random(cls, d: int, h: int, scale: float = 1.0, dtype=torch.float64, device=None,
               generator: Optional[torch.Generator] = None, bias: bool = False) -> "AttentionWeights":
        """Gaussian weights with std scale/sqrt(d) (a unit-ish operator norm regime)."""
        if not isinstance(h, int) or h < 1:
            raise ValueError(f"h (number of heads) must be an integer >= 1, got {h!r}")
        if not isinstance(d, int) or d < 1:
            raise ValueError(f"d (model dimension) must be an integer >= 1, got {d!r}")
        if d % h != 0:
            raise ValueError(f"d = {d} is not divisible by the number of heads h = {h}")
        dh = d // h
        kw = dict(dtype=dtype, device=device, generator=generator)
        s = scale / math.sqrt(d)
        w = [torch.randn(h, d, dh, **kw) * s for _ in range(3)] + [torch.randn(h, dh, d, **kw) * s]
        b = [None] * 4
        if bias:
            b = [torch.randn(h, dh, **kw) * 0.1 for _ in range(3)] + [torch.randn(d, **kw) * 0.1]
        return cls(*w, *b)

    # ---- derived quantities -------------------------------------------------------------------------
    @property
    def h(self) -> int:
        return self.wq.shape[0]

    @property
    def d(self) -> int:
        return self.wq.shape[1]

    @property
    def dh(self) -> int:
        return self.wq.shape[2]

    @property
    def has_bias(self) -> bool:
        return any(getattr(self, f) is not None for f in ("bq", "bk", "bv", "bo"))

    @property
    def dtype(self):
        return self.wq.dtype

    @property
    def device(self):
        return self.wq.device

    def to(self, *args, **kwargs) -> "AttentionWeights":
        return AttentionWeights(*[None if getattr(self, f.name) is None else getattr(self, f.name).to(*args, **kwargs)
                                  for f in fields(self)])

    def head(self, l: int) -> "AttentionWeights":
        """The single-head layer l (h = 1), keeping its output projection; bo is dropped."""
        if not 0 <= l < self.h:
            raise ValueError(f"head index {l} out of range for h = {self.h}")
        sl = slice(l, l + 1)
        pick = lambda b: None if b is None else b[sl]
        return AttentionWeights(self.wq[sl], self.wk[sl], self.wv[sl], self.wo[sl],
                                pick(self.bq), pick(self.bk), pick(self.bv), None)

    def A(self) -> Tensor:
        """A_l = wq_l wk_l^T / sqrt(dh): (h, d, d), so S_l = X A_l X^T (docs/math.md §0)."""
        return self.wq @ self.wk.transpose(-1, -2) / math.sqrt(self.dh)

    def B(self) -> Tensor:
        """B_l = wq_l wk_l^T (unscaled, LoFAST Lemma 2): (h, d, d)."""
        return self.wq @ self.wk.transpose(-1, -2)

    def VO(self) -> Tensor:
        """VO_l = wv_l wo_l: (h, d, d), the per-head value map."""
        return self.wv @ self.wo

    def A_norm(self) -> Tensor:
        """||A_l|| per head from the rank-dh factors (kernels.linalg.prod_norm), never forming A_l: (h,)."""
        return prod_norm(self.wq, self.wk) / math.sqrt(self.dh)

    def B_norm(self) -> Tensor:
        """||B_l|| = ||wq_l wk_l^T|| per head (LoFAST Lemma 2), from the factors: (h,)."""
        return prod_norm(self.wq, self.wk)

    def VO_norm(self) -> Tensor:
        """||VO_l|| = ||wv_l wo_l|| per head, from the factors: (h,)."""
        return prod_norm(self.wv, self.wo.transpose(-1, -2))

    def require_no_bias(self, what: str) -> None:
        """Raise a clear error for bounds that the papers do not extend to biases."""
        if self.has_bias:
            raise ValueError(f"{what} does not support attention biases; use AttentionWeights.augmented() "
                             f"with X augmented by a ones column (JaSMin Remark 2) or drop the biases")

    def augmented(self) -> "AttentionWeights":
        """Bias-free weights acting on [X, 1] (d+1 features): JaSMin Remark 2.

        wq' = [wq; bq], wk' = [wk; bk], wv' = [wv; bv], wo' = [wo, 0]. bo is dropped: a constant shift
        changes no Jacobian. A bound for the augmented map on [X, 1] bounds the Jacobian in X (a restriction).
        """
        h, d, dh = self.wq.shape
        z = torch.zeros(h, 1, dh, dtype=self.dtype, device=self.device)

        def aug(w, b):
            return torch.cat([w, z if b is None else b[:, None, :]], dim=1)

        wo = torch.cat([self.wo, torch.zeros(h, dh, 1, dtype=self.dtype, device=self.device)], dim=2)
        return AttentionWeights(aug(self.wq, self.bq), aug(self.wk, self.bk), aug(self.wv, self.bv), wo)


def augment_input(X: Tensor) -> Tensor:
    """[X, 1]: (..., n, d) -> (..., n, d+1), the input matching AttentionWeights.augmented()."""
    return torch.cat([X, torch.ones(*X.shape[:-1], 1, dtype=X.dtype, device=X.device)], dim=-1)


def causal_mask(n: int, device=None) -> Tensor:
    """Boolean (n, n) mask, True where j > i (entries set to -inf before the softmax)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).triu(1)


def project(X: Tensor, W: Tensor, b: Optional[Tensor] = None) -> Tensor:
    """Per-head projections X W_l + b_l as one fused GEMM: X (..., n, d), W (h, d, dh) -> (..., h, n, dh).

    A broadcast `X.unsqueeze(-3) @ W` copies X once per head and is several times slower on batches.
    """
    h, d, dh = W.shape
    Y = X @ W.permute(1, 0, 2).reshape(d, h * dh)  # (..., n, h*dh)
    if b is not None:
        Y = Y + b.reshape(h * dh)
    return Y.unflatten(-1, (h, dh)).transpose(-2, -3)  # (..., h, n, dh)


def scores(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """S_l = (X wq_l + bq_l)(X wk_l + bk_l)^T / sqrt(dh): (..., n, d) -> (..., h, n, n)."""
    q = project(X, w.wq, w.bq)  # (..., h, n, dh)
    k = project(X, w.wk, w.bk)
    S = q @ k.transpose(-1, -2) / math.sqrt(w.dh)  # (..., h, n, n)
    if causal:
        S = S.masked_fill(causal_mask(X.shape[-2], X.device), float("-inf"))
    return S


def probs(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """P_l(X) = softmax_rows(S_l): (..., n, d) -> (..., h, n, n)."""
    check_input(X, w.d)
    return torch.softmax(scores(X, w, causal), dim=-1)


def attention(X: Tensor, w: AttentionWeights, residual: bool = False, causal: bool = False) -> Tensor:
    """F(X) = H X + sum_l P_l(X) (X wv_l + bv_l) wo_l + bo: (..., n, d) -> (..., n, d)."""
    check_input(X, w.d)
    return attention_unchecked(X, w, residual, causal)


def attention_unchecked(X: Tensor, w: AttentionWeights, residual: bool = False, causal: bool = False) -> Tensor:
    """attention() without input validation (for use inside torch.func transforms)."""
    return attention_and_probs(X, w, residual, causal)[0]


def attention_and_probs(X: Tensor, w: AttentionWeights, residual: bool = False, causal: bool = False):
    """(F(X), P(X)) in one pass, without input validation: (..., n, d) -> ((..., n, d), (..., h, n, n))."""
    P = torch.softmax(scores(X, w, causal), dim=-1)  # (..., h, n, n)
    v = project(X, w.wv, w.bv)  # (..., h, n, dh)
    heads = (P @ v).transpose(-2, -3).flatten(-2)  # (..., n, h*dh), heads concatenated
    out = heads @ w.wo.reshape(w.h * w.dh, w.d)  # (..., n, d) = sum_l P_l v_l wo_l
    if w.bo is not None:
        out = out + w.bo
    return (out + X if residual else out), P
