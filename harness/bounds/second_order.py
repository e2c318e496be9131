"""The second-order ball-change certificate (docs/math.md §1, "Second-order certificate").

By Taylor's theorem with integral remainder, for ||E||_F <= eps,

    ||F(X + E) - F(X)||_F <= U eps + (eps^2 / 2) K(eps),

with U >= ||J_F(X)|| (the exact local constant: a Lanczos value, or its Kuczynski-Wozniakowski certified upper
estimate in a certificate) and K(eps) >= ||D^2 F(Z)[E, E]||_F for every Z in the ball and unit E. F is
multi-head attention, F(Z) = sum_l P_l(Z) (Z wv_l + bv_l) wo_l (+ bo, + Z with the residual: both have no
second derivative, so K is the same with or without them). Per head, with s = (Z wq + bq)(Z wk + bk)^T / sqrt(dh):

    D^2 F_l[E, E] = d^2P_l[E, E] (Z wv_l + bv_l) wo_l + 2 dP_l[E] E wv_l wo_l
    d^2p_i = J_sm(p_i) d^2s_i + T(p_i)[ds_i, ds_i]                (row i; T the softmax's second derivative)
    ||dS_l||_F <= sigma_l(eps) = (||M_l(X)|| + 2 eps ||wq_l wk_l^T||) / sqrt(dh)   (Lemma 2's operator, moved by Z - X)
    ||d^2S_l||_F = 2 ||E wq_l wk_l^T E^T||_F / sqrt(dh) <= 2 ||wq_l wk_l^T|| / sqrt(dh)
    ||J_sm(p_i(Z))|| <= c_l(eps)  (the per-ball constant of harness.bounds.lofast_refined, <= 1/2)
    ||T(p)[u, u]|| <= kappa(c, top) ||u||^2  (<= kappa(1/2, 1) = 0.631; top >= max_k p_k over the ball)
    ||T(p)[u, u]|| <= 4 (1 - p_k) ||u||^2 for every k   (near one-hot rows: lofast_refined.row_constants)
    ||(Z wv_l + bv_l) wo_l|| <= ||(X wv_l + bv_l) wo_l|| + eps ||wv_l wo_l||

so K_l(eps) = (2 c_l b_l / sqrt(dh) + A_l) (xvo_l + eps vo_l) + 2 B_l vo_l with k_i = min(kappa(c_i), 4 q_i)
(q_i >= 1 - p_ik* over the ball, lofast_refined.row_bounds), c_l = max_i c_i, and the rows' share of the score
change: ||ds_i|| <= r_i = (||wq_l K^T|| + ||q_i wk_l^T|| + 2 eps b_l) / sqrt(dh) per unit ||E||_F and
sum_i ||ds_i||^2 <= sigma_l^2, so A_l = max sum_i k_i t_i and B_l^2 = max sum_i c_i^2 t_i over 0 <= t_i <= r_i^2,
sum_i t_i <= sigma_l^2 (at most k_max sigma_l^2 and c_l^2 sigma_l^2; far less when the rows that could bend stay
near one-hot or move little; each also at most lofast_refined.weighted's probability-weighted bound), and
K = sum_l K_l. As eps -> 0 the certificate / eps tends to U, the exact local constant (up to the estimate); for
large eps the eps^2 term dominates and Theorem 1's certificates (harness.bounds.ball_change) are smaller: the
registry's "best" certificate takes the minimum of all of them, which is sound as well.

    CurvatureTerms, curvature_terms(X, w, m, causal)   per-input ingredients (m: ||M_l(X)|| or an upper estimate)
    curvature(t, eps) -> (...,)                         K(eps)
    delta(U, t, eps) -> (...,)                          U eps + eps^2 / 2 K(eps)
    kappa(c, top)                                       the bound on the softmax's second derivative
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch

from harness.bounds import lofast_refined
from harness.bounds.lofast_refined import kappa  # noqa: F401 - part of this module's documented interface
from harness.bounds.lofast_ops import prepare
from harness.kernels.attention import AttentionWeights
from harness.settings import CERTIFY_EPS, FAIL_PROB, ITERS

Tensor = torch.Tensor
Eps = Union[float, Tensor]


@dataclass
class CurvatureTerms:
    """What K(eps) needs at one input X (..., n, d)."""

    m: Tensor  # (..., h) ||M_l(X)|| (Lemma 2's operator with biases) or a certified upper estimate of it
    b: Tensor  # (h,) ||wq_l wk_l^T||
    xvo: Tensor  # (..., h) ||(X - 1 xbar) wv_l wo_l|| (rows of dP, d^2P sum to 0) or ||(X wv_l + bv_l) wo_l||
    vo: Tensor  # (h,) ||wv_l wo_l||
    dh: int
    rows: lofast_refined.RowTerms  # the per-row softmax terms of c_l(eps)


def curvature_terms(X: Tensor, w: AttentionWeights, m: Tensor, causal: bool = False,
                    xvo: Tensor = None, rows: lofast_refined.RowTerms = None) -> CurvatureTerms:
    """The ingredients of K(eps) at X (..., n, d): m (..., h) is ||M_l(X)|| or an upper estimate of it; xvo and rows
    are computed unless given (harness.bounds.lofast.centered_value_norm, lofast_refined.row_terms)."""
    from harness.bounds.lofast import centered_value_norm

    w = prepare(X, w)
    xvo = centered_value_norm(X, w) if xvo is None else xvo
    return CurvatureTerms(m=m, b=w.B_norm(), xvo=xvo, vo=w.VO_norm(),
                          dh=w.dh, rows=lofast_refined.row_terms(X, w, causal) if rows is None else rows)


def curvature(t: CurvatureTerms, eps: Eps) -> Tensor:
    """K(eps) >= sup_{||Z - X||_F <= eps, ||E||_F = 1} ||D^2 F(Z)[E, E]||_F: (...,) for eps a number or (...,)."""
    e = torch.as_tensor(eps, dtype=t.m.dtype, device=t.m.device)
    keys = lofast_refined.key_bounds(t.rows, e)  # the ball's per-key bounds, computed once for both readers
    c_row, k_row = lofast_refined.row_constants(t.rows, e, keys)
    c = c_row.amax(-1)  # (..., h), softmax_constant: <= 1/2; ~0 for rows that stay one-hot
    eh = e.unsqueeze(-1) if e.dim() else e  # (..., 1) against (..., h)
    sqdh = math.sqrt(t.dh)
    sigma2 = ((t.m + 2.0 * eh * t.b) / sqdh).square()  # bound on ||dS_l||_F^2 per unit ||E||_F anywhere in the ball
    r = t.rows  # row i's scores move by at most rate_i ||E||_F anywhere in the ball
    rate2 = ((r.key_side + 2.0 * eh * t.b).unsqueeze(-1) + r.query_side).square() / t.dh  # (..., h, n)
    omega, d2p_weighted = lofast_refined.weighted(t.rows, e, keys)
    d2p = torch.minimum(2.0 * c * t.b / sqdh + _most(k_row, rate2, sigma2), d2p_weighted)  # >= ||d^2 P_l[E, E]||_F
    dp = torch.minimum(_most(c_row.square(), rate2, sigma2).sqrt(), omega)  # bound on ||dP_l[E]||_F
    return (d2p * (t.xvo + eh * t.vo) + 2.0 * dp * t.vo).sum(-1)


def _most(weight: Tensor, cap: Tensor, total: Tensor) -> Tensor:
    """max sum_i weight_i t_i over 0 <= t_i <= cap_i, sum_i t_i <= total (the rows' share of ||dS_l||_F^2): (..., h)
    from (..., h, n) weights and caps and a (..., h) total. The rows of largest weight take their whole cap first;
    with every cap at least the total it is max_i weight_i total, the bound of one row taking all of it."""
    w, order = weight.sort(-1, descending=True)
    cap = cap.expand_as(weight).gather(-1, order)
    before = torch.cumsum(cap, -1) - cap
    return (w * torch.minimum(cap, total.unsqueeze(-1) - before).clamp_min(0.0)).sum(-1)


def delta(U: Tensor, t: CurvatureTerms, eps: Eps) -> Tensor:
    """U eps + eps^2 / 2 K(eps) >= sup_{||X' - X||_F <= eps} ||F(X') - F(X)||_F when U >= ||J_F(X)||: (...,).
    With the residual, U bounds ||J_F(X) + I|| and the bound is on the residual map's change."""
    e = torch.as_tensor(eps, dtype=U.dtype, device=U.device)
    return U * e + 0.5 * e.square() * curvature(t, e)


def certified_truth(X: Tensor, w: AttentionWeights, residual: bool = False, causal: bool = False,
                    certify_eps: float = CERTIFY_EPS, fail_prob: float = FAIL_PROB, seed: int = 0, tol: float = None,
                    iters: int = ITERS):
    """||J(X)|| of the layer map (of F + identity when `residual`) at X (..., n, d) by Lanczos from a seeded Gaussian,
    run for at least the Kuczynski-Wozniakowski steps of a relative eps `certify_eps` on the squared norm, so its
    `upper` holds with probability >= 1 - fail_prob (kernels.layer.certified_norm): a PowerResult, values (...,)."""
    from harness.kernels.krylov import kw_steps
    from harness.kernels.layer import truth

    steps = min(kw_steps(X.shape[-2] * X.shape[-1], certify_eps, fail_prob), iters)
    return truth(X, prepare(X, w), causal, residual=residual, tol=tol, iters=iters,
                 seed=seed, certify=dict(steps=steps, fail_prob=fail_prob))
