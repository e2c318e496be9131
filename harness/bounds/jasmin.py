"""JaSMin (Yudin et al.): Theorem 3 per head, Theorem 4 interlacing, the JaSMin_k regularizers (docs/math.md §2).

Per head l the map is f_l(X) = P_l(X) X VO_l (value map VO_l = wv_l wo_l in place of the paper's W^V, docs/math.md §0)
and A_l = wq_l wk_l^T / sqrt(dh). Theorem 3:
    ||J_{f_l}(X)|| <= ||VO_l|| ( ||P_l|| + 2 ||X||^2 ||A_l|| max_i ||J_sm(P_l,i)|| ),
with the exact ||J_sm|| (kernels.softmax.jsm_norm) or its upper bound g_1 (Cor. 1). The proof only uses that each
row of P_l is a probability vector and that dP_i = J_sm(P_i) dS_i, so it holds unchanged for the causal mask
(masked entries have p = 0 and drop out of J_sm). Multi-head: ||J_F|| <= ||H|| + sum_l ||J_{f_l}|| (`multihead`).
Biases (Remark 2): the bound is evaluated for w.augmented() on [X, 1]; the Jacobian in X is a restriction of the
Jacobian in [X, 1], so this bounds the biased layer too.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch

from harness.kernels.attention import AttentionWeights, augment_input, check_pair, probs
from harness.kernels.softmax import g_k, jsm_norm, jsm_singular_values, sorted_desc
from harness.kernels.linalg import all_finite

Tensor = torch.Tensor

__all__ = ["g_k", "bound", "bound_terms", "from_terms", "multihead", "jasmin_penalty", "row_penalty",
           "interlacing_chain", "interlacing_holds"]


def _prepare(X: Tensor, w: AttentionWeights):
    """Validate X and apply Remark 2 (ones column) when w has biases: returns (X', w') bias-free."""
    if not isinstance(w, AttentionWeights):
        raise ValueError(f"w must be an AttentionWeights, got {type(w).__name__}")
    check_pair(X, w)
    if w.has_bias:
        return augment_input(X), w.augmented()
    return X, w


def bound_terms(X: Tensor, w: AttentionWeights, causal: bool = False, P: Optional[Tensor] = None,
                P_norm: Optional[Tensor] = None) -> dict:
    """The factors of Theorem 3 per head: dict of (..., h) tensors.

    keys: vo (||VO_l||), p (||P_l||), x2 (||X||^2, broadcast), a (||A_l||), jsm (max_i ||J_sm(P_l,i)||, exact),
    g1 (max_i g_1(P_l,i)). P: the attention maps probs(X, w, causal) when already computed (the augmented
    layer of Remark 2 has the same P, so the biased layer's maps are the right ones); P_norm: their spectral norms
    (..., h) when already computed (an analysis's InputState.P_norm), else the SVD's.
    """
    X, w = _prepare(X, w)
    if P is None:
        P = probs(X, w, causal)  # (..., h, n, n)
    vo, a = w.VO_norm(), w.A_norm()  # (h,), from the rank-dh factors
    p = torch.linalg.matrix_norm(P, ord=2) if P_norm is None else P_norm  # (..., h)
    x2 = torch.linalg.matrix_norm(X, ord=2).square().unsqueeze(-1).expand_as(p)  # (..., h)
    jsm = jsm_norm(P).amax(-1)  # (..., h)
    g1 = g_k(P, 1).amax(-1)  # (..., h)
    return dict(vo=vo.expand_as(p), p=p, x2=x2, a=a.expand_as(p), jsm=jsm, g1=g1)


def bound(X: Tensor, w: AttentionWeights, use_g1: bool = False, causal: bool = False,
          P: Optional[Tensor] = None) -> Tensor:
    """JaSMin Theorem 3 (eq. 3) per head: ||VO_l|| (||P_l|| + 2||X||^2 ||A_l|| max_i ||J_sm(P_i)||) -> (..., h).

    use_g1=True replaces ||J_sm(P_i)|| by its upper bound g_1(P_i) (eq. 7). P: precomputed attention maps.
    """
    return from_terms(bound_terms(X, w, causal, P), use_g1)


def from_terms(t: dict, use_g1: bool = False) -> Tensor:
    """Theorem 3 from its factors (bound_terms), so both variants share one computation: (..., h)."""
    s = t["g1"] if use_g1 else t["jsm"]
    return t["vo"] * (t["p"] + 2 * t["x2"] * t["a"] * s)


def multihead(bound_per_head: Tensor, residual: bool = False) -> Tensor:
    """Multi-head bound from per-head bounds: sum_l b_l (+ ||I|| = 1 if residual): (..., h) -> (...,)."""
    if not isinstance(bound_per_head, torch.Tensor) or bound_per_head.dim() < 1:
        raise ValueError("bound_per_head must be a tensor of shape (..., h)")
    out = bound_per_head.sum(-1)
    return out + 1 if residual else out


# ---- regularizers (Section 4, eqs. 8-9) ---------------------------------------------------------------------

def row_penalty(P: Tensor, k: int, eps: float = 1e-12) -> Tensor:
    """Per-row JaSMin term: log g_1(P_i) (k = 0, eq. 8) or log(g_1(P_i) / g_k(P_i)) (k > 1, eq. 9): (..., n) -> (...,).

    eps is added inside each log so one-hot rows (g_1 = 0, e.g. the first row of a causal map) stay finite.
    """
    if not isinstance(P, torch.Tensor) or P.dim() < 1 or P.shape[-1] == 0:
        raise ValueError("P must be a non-empty tensor of probability rows (..., n)")
    if not isinstance(k, int) or k < 0 or k == 1:
        raise ValueError(f"k must be 0 (eq. 8) or an integer > 1 (eq. 9), got {k!r}")
    if k > P.shape[-1]:
        raise ValueError(f"k = {k} exceeds the number of keys n = {P.shape[-1]}")
    if not all_finite(P):
        raise ValueError("P contains NaN or inf values")
    lg1 = torch.log(g_k(P, 1) + eps)
    if k == 0:
        return lg1
    return lg1 - torch.log(g_k(P, k) + eps)


def jasmin_penalty(P: Union[Tensor, Sequence[Tensor]], k: int = 0, agg: str = "mean", batch_dims: int = 0,
                   eps: float = 1e-12) -> Tensor:
    """JaSMin_k regularizer (eqs. 8-9): sum over layers/heads of agg_i of the row term -> scalar.

    P: probability maps (..., n, n), e.g. (L, h, n, n) or (B, h, n, n), or a list of per-layer tensors. The
    query axis (-2) is aggregated with agg = "max" (as the bound says) or "mean"; the first `batch_dims` axes
    are averaged (a batch of inputs); all remaining axes (layers, heads) are summed.
    """
    if agg not in ("mean", "max"):
        raise ValueError(f"agg must be 'mean' or 'max', got {agg!r}")
    if isinstance(P, (list, tuple)):
        if len(P) == 0:
            raise ValueError("P is an empty list of attention maps")
        return sum(jasmin_penalty(p, k, agg, batch_dims, eps) for p in P)
    if not isinstance(P, torch.Tensor) or P.dim() < 2:
        raise ValueError(f"P must have shape (..., n, n), got {getattr(P, 'shape', type(P).__name__)}")
    if P.shape[-2] == 0:
        raise ValueError("P has no query rows (n = 0)")
    if not 0 <= batch_dims <= P.dim() - 2:
        raise ValueError(f"batch_dims = {batch_dims} must lie in [0, {P.dim() - 2}] for P of shape {tuple(P.shape)}")
    t = row_penalty(P, k, eps)  # (..., n)
    t = t.amax(-1) if agg == "max" else t.mean(-1)  # (...,)
    if batch_dims:
        t = t.flatten(0, batch_dims - 1).mean(0) if batch_dims > 1 else t.mean(0)
    return t.sum()


# ---- Theorem 4 ---------------------------------------------------------------------------------------------

def interlacing_chain(p: Tensor) -> Tensor:
    """(p_(1), g_1, s_1, p_(2), g_2, s_2, ..., p_(n), g_n, s_n) of Theorem 4: (..., n) -> (..., 3n)."""
    if not isinstance(p, torch.Tensor) or p.dim() < 1 or p.shape[-1] == 0:
        raise ValueError("p must be a non-empty tensor (..., n)")
    n = p.shape[-1]
    ps = sorted_desc(p)  # (..., n)
    g = torch.stack([g_k(p, k) for k in range(1, n + 1)], dim=-1)  # (..., n)
    s = jsm_singular_values(p)  # (..., n)
    return torch.stack([ps, g, s], dim=-1).flatten(-2)  # (..., 3n)


def interlacing_holds(p: Tensor, tol: float = None) -> Tensor:
    """Theorem 4 check per row: the chain is non-increasing and s_n = 0, up to tol: (..., n) -> (...,) bool.

    tol defaults to 1000 machine epsilons of p's dtype (dense eigvalsh rounding).
    """
    if tol is None:
        tol = 1e3 * torch.finfo(p.dtype).eps
    c = interlacing_chain(p)
    mono = (c[..., 1:] - c[..., :-1] <= tol).all(-1)
    return mono & (c[..., -1].abs() <= tol)
