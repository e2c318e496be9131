"""The Kim / Specformer bound as stated in JaSMin's Theorem 1 (citing Specformer [Hu et al. 2024]).

Lip(Attn; B_r(vec X)) <= n(n+1) (||X||_F + r)^2 ( ||W^V|| ||W^Q|| ||W^K|| + ||W^V|| ), per head.
Per head l we use the value map VO_l = wv_l wo_l in place of W^V (docs/math.md §0: the single-head map with output
projection is P_l X VO_l), and the per-head projections wq_l, wk_l (d, dh) for W^Q, W^K (no 1/sqrt(dh): the
theorem states the unscaled norms, which only makes it larger than with A_l).

Validity (ours): the statement has no lower restriction on ||X||_F, and at X = 0, r = 0 it gives 0 while the true
constant is ||VO_l|| ||P|| = ||VO_l|| (P uniform). It is nevertheless a valid bound whenever
(||X||_F + r)^2 sqrt(n) (n+1) >= 1: on the ball, JaSMin Thm 3 + Cor. 1 give ||J|| <= ||VO|| (sqrt(n) +
(||X||_F + r)^2 ||A||) and ||A|| <= ||W^Q|| ||W^K||, both dominated term by term. `guaranteed` reports this.
"""
from __future__ import annotations

import math
from typing import Union

import torch

from harness.kernels.attention import AttentionWeights, augment_input, check_input, check_pair
from harness.kernels.linalg import all_finite

Tensor = torch.Tensor

__all__ = ["bound", "guaranteed"]


def _prepare(X, w, r):
    if not isinstance(w, AttentionWeights):
        raise ValueError(f"w must be an AttentionWeights, got {type(w).__name__}")
    check_pair(X, w)
    r = torch.as_tensor(r, dtype=X.dtype, device=X.device)
    if not all_finite(r) or (r < 0).any():
        raise ValueError(f"r (ball radius) must be finite and >= 0, got {r}")
    if w.has_bias:  # JaSMin Remark 2: weights concatenated with their biases, input [X, 1]
        X, w = augment_input(X), w.augmented()
    return X, w, r


def bound(X: Tensor, w: AttentionWeights, r: Union[float, Tensor] = 0.0, causal: bool = False) -> Tensor:
    """JaSMin Thm 1: n(n+1)(||X||_F + r)^2 (||VO_l|| ||wq_l|| ||wk_l|| + ||VO_l||) per head: (..., h).

    r: radius of the Frobenius ball around X (scalar or (...,)). The bound depends on norms only, so `causal`
    changes nothing (kept for a uniform signature).
    """
    X, w, r = _prepare(X, w, r)
    n = X.shape[-2]
    c2 = (torch.linalg.matrix_norm(X, ord="fro") + r).square().unsqueeze(-1)  # (..., 1)
    v = w.VO_norm()  # (h,)
    q = torch.linalg.matrix_norm(w.wq, ord=2)
    k = torch.linalg.matrix_norm(w.wk, ord=2)
    return n * (n + 1) * c2 * (v * q * k + v)


def guaranteed(X: Tensor, r: Union[float, Tensor] = 0.0, augmented: bool = False) -> Tensor:
    """True where our sufficient condition (||X||_F + r)^2 sqrt(n)(n+1) >= 1 for `bound` to hold is met: (...,).

    augmented=True evaluates it on [X, 1] (what `bound` uses for biased weights).
    """
    check_input(X)
    if augmented:
        X = augment_input(X)
    n = X.shape[-2]
    c = torch.linalg.matrix_norm(X, ord="fro") + torch.as_tensor(r, dtype=X.dtype, device=X.device)
    return c.square() * math.sqrt(n) * (n + 1) >= 1
