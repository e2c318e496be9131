"""Softmax Jacobian J_sm(p) = diag(p) - p p^T, its exact spectral norm per row, and JaSMin's g_k (docs/math.md §2)."""
from __future__ import annotations

import torch

from harness.settings import JSM_BISECTION_STEPS

Tensor = torch.Tensor


def softmax_jacobian(p: Tensor) -> Tensor:
    """J_sm(p) = diag(p) - p p^T: (..., n) -> (..., n, n)."""
    return torch.diag_embed(p) - p.unsqueeze(-1) * p.unsqueeze(-2)


def sorted_desc(p: Tensor) -> Tensor:
    """p_(1) >= p_(2) >= ... along the last axis: (..., n) -> (..., n)."""
    return torch.sort(p, dim=-1, descending=True).values


def g_k(p: Tensor, k: int) -> Tensor:
    """JaSMin eq. (g_k): g_k(p) = p_(k) (1 - p_(k) + p_(k+1)), p_(n+1) = 0: (..., n) -> (...,). k is 1-based."""
    n = p.shape[-1]
    if not 1 <= k <= n:
        raise ValueError(f"g_k needs 1 <= k <= n = {n}, got k = {k}")
    k_ = min(k + 1, n)
    ps = torch.topk(p, k_, dim=-1).values  # (..., k+1) differentiable
    pk = ps[..., k - 1]
    pk1 = ps[..., k] if k < n else torch.zeros_like(pk)
    return pk * (1 - pk + pk1)


def jsm_norm(p: Tensor, iters: int = JSM_BISECTION_STEPS) -> Tensor:
    """Exact ||J_sm(p)|| per row, (..., n) -> (...,), by bisection on the secular equation.

    J_sm = diag(p) - p p^T is PSD; its top eigenvalue lambda lies in [p_(2), p_(1)] (Thm 4) and solves
    f(lambda) = 1 - sum_j p_j^2 / (p_j - lambda) = 0, with f decreasing there. Ties p_(1) = p_(2) give p_(1).
    O(n) per row and step instead of an O(n^3) eigendecomposition; `jsm_norm_dense` is the oracle. A step is a
    function of the brackets alone, so once one leaves every bracket as it was (each is then down to adjacent
    floating-point numbers, after about 55 halvings in float64) the rest would too: the loop stops there, with the
    value the full `iters` steps give.
    """
    top2 = torch.topk(p, min(2, p.shape[-1]), dim=-1).values
    p1 = top2[..., 0]
    p2 = top2[..., 1] if p.shape[-1] > 1 else torch.zeros_like(p1)
    lo, hi = p2.clone(), p1.clone()
    tied = (p1 - p2) <= 0
    sq = p * p
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        diff = p - mid.unsqueeze(-1)  # (..., n)
        safe = torch.where(diff == 0, torch.full_like(diff, float("inf")), diff)
        f = 1 - (sq / safe).sum(-1)
        go_right = f > 0
        new_lo = torch.where(go_right, mid, lo)
        new_hi = torch.where(go_right, hi, mid)
        if torch.equal(new_lo, lo) and torch.equal(new_hi, hi):  # a fixed point: no later step changes a bracket
            break
        lo, hi = new_lo, new_hi
    lam = 0.5 * (lo + hi)
    return torch.where(tied, p1, lam)


def jsm_norm_dense(p: Tensor) -> Tensor:
    """||J_sm(p)|| via a dense symmetric eigendecomposition (test oracle): (..., n) -> (...,)."""
    return torch.linalg.eigvalsh(softmax_jacobian(p))[..., -1].clamp_min(0)


def jsm_singular_values(p: Tensor) -> Tensor:
    """All singular values s_1 >= ... >= s_n of J_sm(p) (dense; for the interlacing check): (..., n) -> (..., n)."""
    return torch.linalg.eigvalsh(softmax_jacobian(p)).flip(-1).clamp_min(0)
