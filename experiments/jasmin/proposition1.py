"""JaSMin (Yudin et al.) Proposition 1 and eq. 10 on attention rows, against the exact softmax-Jacobian norm.

Proposition 1: if 1 <= gamma <= k/4 and g_1(p) / g_k(p) <= gamma, then ||J_sm(p)|| <= (1 - sqrt(1 - 4 gamma/k)) / 2.
At a row p the tightest gamma is g_1 / g_k itself, so the proposition applies where that ratio lies in [1, k/4]
(it needs at least k entries), and the check is ||J_sm(p)|| <= bound(g_1 / g_k, k). Eq. 10: g_1(p) <= gamma < 1/4
forces p_(1) <= (1 - sqrt(1 - 4 gamma)) / 2 or p_(1) >= (1 + sqrt(1 - 4 gamma)) / 2 (from p_(1)(1 - p_(1)) <= g_1);
with gamma = g_1(p) it applies where g_1 < 1/4.

    KS                                  the k of the regularizer JaSMin_k the rows are checked for
    bound(gamma, k)                     Proposition 1's right-hand side
    prop1(P, exact, k)                  (applies, exact / bound where it applies, else NaN) per row
    eq10(P, g1)                         (applies, holds) per row
"""
from __future__ import annotations

from typing import Tuple

import torch

from harness.kernels.softmax import g_k

Tensor = torch.Tensor
KS = (5, 10, 16)  # JaSMin_k, k > 1 (the paper trains k = 10); 1 <= gamma <= k / 4 needs k >= 4


def bound(gamma: Tensor, k: int) -> Tensor:
    """(1 - sqrt(1 - 4 gamma / k)) / 2 for 1 <= gamma <= k / 4 (NaN outside)."""
    inside = (gamma >= 1) & (gamma <= k / 4)
    value = (1 - torch.sqrt((1 - 4 * gamma / k).clamp_min(0))) / 2
    return torch.where(inside, value, torch.full_like(gamma, float("nan")))


def prop1(P: Tensor, exact: Tensor, k: int) -> Tuple[Tensor, Tensor]:
    """Rows P (..., n) with their exact ||J_sm|| (...,): where Proposition 1 applies with gamma = g_1 / g_k, and
    exact / bound there (NaN elsewhere). Rows with fewer than k entries never apply."""
    if P.shape[-1] < k:
        no = torch.zeros(P.shape[:-1], dtype=torch.bool, device=P.device)
        return no, torch.full(P.shape[:-1], float("nan"), dtype=P.dtype, device=P.device)
    g1, gk = g_k(P, 1), g_k(P, k)
    gamma = g1 / gk.clamp_min(1e-300)
    applies = (gk > 0) & (gamma >= 1) & (gamma <= k / 4)
    b = bound(gamma, k)
    return applies, torch.where(applies, exact / b, torch.full_like(exact, float("nan")))


def eq10(P: Tensor, g1: Tensor) -> Tuple[Tensor, Tensor]:
    """Where eq. 10 applies with gamma = g_1 (g_1 < 1/4) and whether p_(1) lies outside the open interval
    ((1 - sqrt(1 - 4 g_1)) / 2, (1 + sqrt(1 - 4 g_1)) / 2) there (True where it does not apply)."""
    applies = g1 < 0.25
    p1 = P.amax(-1)
    root = torch.sqrt((1 - 4 * g1).clamp_min(0))
    tol = 1e-12
    holds = (p1 <= (1 - root) / 2 + tol) | (p1 >= (1 + root) / 2 - tol)
    return applies, holds | ~applies
