"""A per-ball softmax constant for LoFAST's Theorem 1 (docs/math.md §1, "Refined softmax constant").

Theorem 1 bounds the change of each attention row by c ||s_i' - s_i|| with one global constant c (1 in the
paper, 1/2 by JaSMin Cor. 1). Over the eps-ball a smaller constant holds per row:

    ||J_sm(p)|| <= max_k p_k                 (J_sm = diag(p) - p p^T is PSD and below diag(p))
    p_k(s + t D) <= p_k(s) exp(t <e_k - p(s), D>)  for t in [0, 1]   (log-sum-exp is convex)
               <= p_k(s) exp(rho_i ||e_k - p(s)||)                   for ||D|| <= rho_i

so along the segment from s_i to s_i' the row's Jacobian norm stays below

    c_i(eps) = min(1/2, max_k min(1, p_ik exp(rho_i ||e_k - p_i||))),
    rho_i(eps) = eps (||wq K^T|| + ||q_i wk^T|| + eps ||wq wk^T||) / sqrt(dh)   (the row's score change)

and ||P_l(X') - P_l(X)||_F <= max_i c_i(eps) ||S_l' - S_l||_F. The head's constant c_l(eps) = max_i c_i(eps)
replaces c in Theorem 1 (it grows with eps, so the certified radius can still be found by bisection). Everything
is computed in log space: log p_ik + rho_i ||e_k - p_i|| never overflows, and a near-one-hot row keeps its
top probability (c = 1/2) instead of rounding to a product 0 * inf. At eps -> 0 the constant is
min(1/2, max_ik p_ik), which gives a valid local Lipschitz bound as well (`lipschitz_upper`).

    row_terms(X, w, causal) -> RowTerms            per-input ingredients, computed once
    softmax_constant(t, eps) -> (..., h)           c_l(eps), eps a scalar or (...,) tensor
    row_constants(t, eps) -> two (..., h, n)       per row: that constant and the second-derivative one (second_order)
    change_constant(t, eps, m, b) -> (..., h)      c'_l <= c_l with ||P_l' - P_l||_F <= c'_l T_l (tipped rows)
    weighted(t, eps) -> two (..., h)               probability-weighted bounds on ||dP_l|| and ||d^2P_l|| in the ball
    key_bounds(t, eps)                             the ball's per-key bounds, computed once for the functions above
    constant_at_zero(P) -> (..., h)                c_l(0) from the attention probabilities alone
    delta(X, w, eps, residual, causal) -> (...,)   Theorem 1 with c_l(eps) and the exact ||M_l|| (lofast.theorem1)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch

from harness.bounds import lofast
from harness.bounds.lofast_ops import check_eps, prepare, query_key
from harness.kernels.attention import AttentionWeights, causal_mask
from harness.kernels.linalg import all_finite, prod_norm

Tensor = torch.Tensor
Eps = Union[float, Tensor]


@dataclass
class RowTerms:
    """What c_l(eps) needs at one input: log-probabilities, distances ||e_k - p_i||, score-change factors."""

    logp: Tensor  # (..., h, n, n) log P_l (-inf where masked)
    dist: Tensor  # (..., h, n, n) ||e_k - p_i|| (0 where masked: p_k = 0 there anyway)
    key_side: Tensor  # (..., h) ||wq_l K_l^T||: a query's change moves its scores by at most this x ||dx_i||
    query_side: Tensor  # (..., h, n) ||q_i wk_l^T||: the keys' change moves row i by at most this x ||dX||_F
    b: Tensor  # (h,) ||wq_l wk_l^T|| (unscaled B_l)
    dh: int
    margin: Tensor  # (..., h, n, n) s_ik* - s_ij, lowered by its rounding allowance (0 at j = k*)
    pair: Tensor  # (..., h, n, n) ||wq_l (k_j - k_k*)^T||: a query's change moves that margin by this x ||dx_i||
    own: Tensor  # (..., h, n, n) bool: i is j or k* (its own change moves both sides of the margin)


def row_terms(X: Tensor, w: AttentionWeights, causal: bool = False) -> RowTerms:
    """The ingredients of c_l(eps) at X (..., n, d), biases included: scores are s_i = q_i K^T / sqrt(dh)."""
    w = prepare(X, w)
    Q, K = query_key(X, w)  # (..., h, n, dh), biases included
    S = Q @ K.transpose(-1, -2) / math.sqrt(w.dh)  # (..., h, n, n)
    if causal:
        S = S.masked_fill(causal_mask(X.shape[-2], X.device), float("-inf"))
    logp = torch.log_softmax(S, dim=-1)  # (..., h, n, n)
    p = logp.exp()
    # ||e_k - p||^2 = (1 - p_k)^2 + sum_{j != k} p_j^2: two non-negative terms, no cancellation
    one_minus = -torch.expm1(logp)  # 1 - p_k, accurate when p_k is near 1
    others_sq = (p.square().sum(-1, keepdim=True) - p.square()).clamp_min(0.0)
    dist = torch.sqrt(one_minus.square() + others_sq)
    key_side = prod_norm(w.wq, K)  # (..., h): ||wq_l K_l^T|| from the dh x dh factors' R, not the d x n product
    query_side = (Q @ w.wk.transpose(-1, -2)).norm(dim=-1)  # (..., h, n): ||q_i wk_l^T||
    margin, pair, own = _pair_terms(Q, K, S, logp, w)
    return RowTerms(logp, dist, key_side, query_side, w.B_norm(), w.dh, margin, pair, own)


def _pair_terms(Q: Tensor, K: Tensor, S: Tensor, logp: Tensor, w: AttentionWeights):
    """Per row i and key j: the score margin s_ik* - s_ij to the row's top key k* (less a rounding allowance for the
    products that formed it), ||wq (k_j - k_k*)^T|| (from the Gram matrix of K wq^T, padded for its cancellation) and
    whether i is j or k*. Biases cancel in k_j - k_k*."""
    n, u = S.shape[-1], torch.finfo(S.dtype).eps
    top = logp.argmax(-1, keepdim=True)  # (..., h, n, 1)
    s_top = S.gather(-1, top)
    KW = K @ w.wq.transpose(-1, -2)  # (..., h, n, d): k_j wq^T
    H = KW @ KW.transpose(-1, -2)  # (..., h, n, n)
    hd = H.diagonal(dim1=-2, dim2=-1)  # (..., h, n)
    h_top = hd.unsqueeze(-2).expand_as(H).gather(-1, top)  # (..., h, n, 1): H_k*k*
    cross = H.gather(-2, top.expand_as(H))  # (..., h, i, j): H_{k*_i, j}
    slack = 4.0 * (KW.shape[-1] + w.dh) * u * (hd.unsqueeze(-2) + h_top)  # the Gram entries' rounding
    pair = (hd.unsqueeze(-2) + h_top - 2.0 * cross + slack).clamp_min(0.0).sqrt()
    kn = K.norm(dim=-1).unsqueeze(-2)  # (..., h, 1, n)
    round_s = 2.0 * (Q.shape[-1] + w.wq.shape[-2] + 4) * u * Q.norm(dim=-1, keepdim=True) * (kn + kn.expand_as(S)
                                                                                               .gather(-1, top))
    margin = torch.where(torch.isfinite(S), s_top - S - round_s / math.sqrt(w.dh), torch.inf).clamp_min(0.0)
    idx = torch.arange(n, device=S.device)
    own = (idx[:, None] == idx[None, :]) | (top == idx[:, None])  # (..., h, n, n): i == j or i == k*_i
    return margin, pair, own


def key_bounds(t: RowTerms, eps: Eps):
    """The ball's bounds on every row's probabilities, computed once for the functions that read them (keys=):
    (log of the bound on every p_ik (..., h, n, n), the same with -inf at each row's top key k* at X, and
    q_i = min(1, sum_{j != k*} of those bounds) (..., h, n))."""
    e = torch.as_tensor(eps, dtype=t.logp.dtype, device=t.logp.device)
    if bool((e < 0).any()) or not all_finite(e):
        raise ValueError(f"eps must be finite and >= 0, got {eps!r}")
    e = e[..., None, None] if e.dim() else e  # (..., 1, 1) against (..., h, n)
    rho = e * (t.key_side.unsqueeze(-1) + t.query_side + e * t.b[:, None]) / math.sqrt(t.dh)  # (..., h, n)
    logb = t.logp + rho.unsqueeze(-1) * t.dist  # (..., h, n, n): log of the ball's bound on each p_k
    # p_j <= exp(s_j - s_k*), the margin moved by at most its own bound over the ball
    logb = torch.minimum(logb, _moved(t, e.unsqueeze(-1)) - t.margin)
    rest = logb.scatter(-1, t.logp.argmax(-1, keepdim=True), float("-inf"))  # every key but k*
    q_row = torch.exp(torch.logsumexp(rest, -1).clamp(max=0.0))  # (..., h, n), exp(-inf) = 0 for a lone key
    return logb, rest, q_row


def row_bounds(t: RowTerms, eps: Eps, top_too: bool = False, keys=None):
    """Per row i over the eps-ball, (..., h, n) each: c_i = min(1/2, max_k min(1, p_ik exp(rho_i ||e_k - p_i||)))
    (the bound on max_k p_k), and q_i = min(1, sum_{j != k*} p_ij exp(rho_i ||e_j - p_i||)), a bound on 1 - p_ik*
    anywhere in the ball, k* the row's most probable key at X (docs/math.md §1, "Near one-hot rows"; each key's
    bound also by its margin, "Per-key margins"); top_too: the bound on max_k p_k itself (not capped at 1/2) too.
    keys: key_bounds(t, eps) when the caller has it."""
    logb, _, q_row = key_bounds(t, eps) if keys is None else keys
    log_top = logb.amax(-1)  # (..., h, n): log of the bound on max_k p_k
    c_row = torch.exp(log_top.clamp(max=math.log(0.5)))  # min(1/2, .) in log space, then exp <= 1/2
    if top_too:
        return c_row, q_row, torch.exp(log_top.clamp(max=0.0))
    return c_row, q_row


def _moved(t: RowTerms, e: Tensor) -> Tensor:
    """How far the margin s_ik* - s_ij can fall over the eps-ball, (..., h, n, n), e (..., 1, 1, 1) or a number:
    dq_i (k_j - k_k*)^T + q_i (dk_j - dk_k*)^T + dq_i (dk_j - dk_k*)^T with ||dx_i||, ||dx_j||, ||dx_k*|| sharing eps:
    eps sqrt(a^2 + 2 b^2) (eps sqrt((a + b)^2 + b^2) when i is j or k*) + (1 + sqrt 2) / 2 eps^2 ||B||, over sqrt(dh),
    a = ||wq (k_j - k_k*)^T||, b = ||q_i wk^T||."""
    a, b = t.pair, t.query_side.unsqueeze(-1)
    first = torch.where(t.own, torch.sqrt((a + b).square() + b.square()), torch.sqrt(a.square() + 2.0 * b.square()))
    return e * (first + e * (1.0 + math.sqrt(2.0)) / 2.0 * t.b[:, None, None]) / math.sqrt(t.dh)


def weighted(t: RowTerms, eps: Eps, keys=None):
    """Probability-weighted bounds anywhere in the eps-ball, per unit ||E||_F, (..., h) each: omega_l >= ||dP_l[E]||_F
    and a bound on ||d^2P_l[E, E]||_F. A row's change is weighted by the ball bounds u_ij >= p_ij of the keys it can
    attend to: ||J_sm(p) ds||_1 <= 2 sum_{j != k*} p_j |ds_j - ds_k*| and ||T(p)[ds, ds]||_1 <= 2 Var_p(ds) <=
    2 sum_{j != k*} p_j (ds_j - ds_k*)^2, with |ds_j - ds_k*| <= a'_ij ||e_i|| + b'_i ||e_j - e_k*||, a'_ij =
    (||wq (k_j - k_k*)^T|| + sqrt 2 eps ||B||) / sqrt(dh), b'_i = (||q_i wk^T|| + eps ||B||) / sqrt(dh) (docs/math.md
    §1, "Probability-weighted rows"). So a key of huge score change that the row gives ~0 probability costs ~0, where
    ||M_l|| charges every row with it. keys: key_bounds(t, eps) when the caller has it."""
    _, rest, q = key_bounds(t, eps) if keys is None else keys
    u = torch.exp(rest.clamp(max=0.0))  # (..., h, n, n), 0 at k*
    e = torch.as_tensor(eps, dtype=q.dtype, device=q.device)
    e = e[..., None, None] if e.dim() else e  # (..., 1, 1) against (..., h, n)
    sq, b = math.sqrt(t.dh), t.b[:, None]
    a = (t.pair + math.sqrt(2.0) * e.unsqueeze(-1) * b.unsqueeze(-1)) / sq  # (..., h, n, n)
    beta = (t.query_side + e * b) / sq  # (..., h, n)
    spread = u.norm(dim=-1) + q  # >= sum_j u_ij ||e_j - e_k*|| per unit ||E||_F
    omega = (2.0 * (u * a).sum(-1)).amax(-1) + (2.0 * beta * spread).norm(dim=-1)
    d2p = (4.0 * t.b / sq * spread.norm(dim=-1) + 4.0 * (u * a.square()).sum(-1).amax(-1)
           + 16.0 * (beta.square() * q).sum(-1))
    return omega, d2p


def softmax_constant(t: RowTerms, eps: Eps, onehot: bool = True) -> Tensor:
    """c_l(eps) >= ||J_sm(p_i)|| for every row i of head l anywhere in the eps-ball: (..., h) for eps scalar or
    (...,). max_i min(c_i, 2 q_i) (row_bounds): ||J_sm(p)|| <= max_k p_k and <= 2 (1 - p_k) for every k, so a row
    that stays near one-hot over the ball contributes ~0. onehot=False: max_i c_i alone."""
    return (row_constants(t, eps)[0] if onehot else row_bounds(t, eps)[0]).amax(-1)  # (..., h)


def change_constant(t: RowTerms, eps: Eps, m: Tensor, b: Tensor) -> Tensor:
    """c'_l with ||P_l(X') - P_l(X)||_F <= c'_l T_l for every X' in the eps-ball, T_l = eps (m_l + ||B_l|| eps) /
    sqrt(dh) Theorem 1's bound on ||S_l' - S_l||_F there (m (..., h) ||M_l|| or an upper estimate, b (h,) ||B_l||):
    (..., h), never above softmax_constant(t, eps). Row by row, ||p_i' - p_i|| <= c_i ||s_i' - s_i|| (the
    mean value bound) and <= sqrt(2) q_i (zeroth order: every entry but k* lies below its ball bound at both ends,
    and p_ik* moves by their sum), so for the k rows of largest c_i taken at zeroth order and the rest at first
    order, ||P' - P||_F^2 <= sum_{first k} 2 q_i^2 + c_(k+1)^2 T^2; the minimum over k (k = 0 is Theorem 1's
    max_i c_i T). A row the ball can tip off one-hot then costs its probability mass, not ||M_l|| eps. And
    ||P' - P||_F <= eps omega_l (weighted: the mean value bound with the probability-weighted derivative)."""
    e = torch.as_tensor(eps, dtype=m.dtype, device=m.device)
    e = e.unsqueeze(-1) if e.dim() else e  # (..., 1) against (..., h)
    T = e * (m + b * e) / math.sqrt(t.dh)
    keys = key_bounds(t, eps)
    c_row, q_row = row_bounds(t, eps, keys=keys)
    c_sorted, order = torch.minimum(c_row, 2.0 * q_row).sort(-1, descending=True)  # (..., h, n), as row_constants
    zeroth = torch.cumsum(2.0 * q_row.gather(-1, order).square(), -1)  # rows 1..k at zeroth order
    zeroth = torch.cat([torch.zeros_like(zeroth[..., :1]), zeroth], -1)  # k = 0 .. n
    first = torch.cat([c_sorted, torch.zeros_like(c_sorted[..., :1])], -1)  # c_(k+1), 0 once every row is zeroth
    T1 = T.unsqueeze(-1)
    ratio = torch.where(T1 > 0, zeroth / T1.square().clamp_min(torch.finfo(T.dtype).tiny), torch.inf)
    ratio = torch.where(zeroth > 0, ratio, 0.0)  # a row with q_i = 0 costs nothing at any T
    c = torch.sqrt((ratio + first.square()).amin(-1)).minimum(c_sorted[..., 0])
    return torch.where(T > 0, torch.minimum(c, e * weighted(t, eps, keys)[0] / T.clamp_min(1e-300)), c)


def kappa(c: Union[float, Tensor], top: Union[float, Tensor, None] = None) -> Union[float, Tensor]:
    """A bound on ||T(p)[u, u]|| / ||u||^2, T the second derivative of the softmax at p, given ||J_sm(p)|| <= c and
    max_k p_k <= top: sqrt(2 g(top) c + c^2 top), g(x) = x (1 - x)^2 up to x = 1/3 and 4/27 beyond (docs/math.md §1;
    sqrt(8 c / 27 + c^2) at top = 1, the default; the true supremum over p is sqrt(2/27) = 0.272 at c = 1/2)."""
    top = 1.0 if top is None else top
    if isinstance(c, Tensor) or isinstance(top, Tensor):
        top = torch.as_tensor(top, dtype=c.dtype if isinstance(c, Tensor) else top.dtype)
        g = torch.where(top <= 1.0 / 3.0, top * (1.0 - top).square(), torch.full_like(top, 4.0 / 27.0))
        return torch.sqrt(2.0 * g * c + c * c * top)
    g = top * (1.0 - top) ** 2 if top <= 1.0 / 3.0 else 4.0 / 27.0
    return math.sqrt(2.0 * g * c + c * c * top)


def row_constants(t: RowTerms, eps: Eps, keys=None):
    """Per row over the eps-ball, (..., h, n) each, from one row_bounds: min(c_i, 2 q_i) >= ||J_sm(p_i)||
    (softmax_constant's rows) and k_i = min(kappa of it and the row's bound on max_k p_k, 4 q_i)
    >= ||T(p_i)[u, u]|| / ||u||^2: T(p)[u, u]_j =
    p_j ((u_j - <p, u>)^2 - Var_p(u)), whose 1-norm is at most 2 Var_p(u) <= 4 (1 - p_k) ||u||^2 for every k.
    keys: key_bounds(t, eps) when the caller has it."""
    c_row, q_row, top = row_bounds(t, eps, top_too=True, keys=keys)
    c_row = torch.minimum(c_row, 2.0 * q_row)
    return c_row, torch.minimum(kappa(c_row, top), 4.0 * q_row)


def constant_at_zero(P: Tensor) -> Tensor:
    """c_l(0) = softmax_constant(row_terms(X, w, causal), 0) from the probabilities P (..., h, n, n) alone: at eps = 0
    every rho_i is 0, so c_i(0) = min(1/2, max_k p_ik, 2 sum_{j != k*} p_ij) (k* the row's most probable key; the
    sum over the other entries, not 1 - p_ik*, so a near-one-hot row keeps its small value) and c_l(0) = max_i
    c_i(0). (..., h)."""
    top = P.argmax(-1, keepdim=True)
    rest = P.scatter(-1, top, 0.0).sum(-1)  # (..., h, n): 1 - p_ik*, summed from the other entries
    c_row = torch.minimum(P.amax(-1).clamp(max=0.5), 2.0 * rest)
    return c_row.amax(-1)


def delta(X: Tensor, w: AttentionWeights, eps: Eps, residual: bool = True, causal: bool = False, **power) -> Tensor:
    """Theorem 1 with the per-ball constant c_l(eps) and the exact ||M_l||: ||F(X') - F(X)||_F for
    ||X' - X||_F <= eps, (..., n, d) -> (...,). Never larger than lofast.delta(..., softmax_lip=0.5)."""
    w = prepare(X, w)
    e = check_eps(eps, X)
    z = lofast.zeta(X, w, residual, causal=causal, **power)
    m = lofast.m_norms(X, w, **power)
    c = change_constant(row_terms(X, w, causal), e, m, w.B_norm())
    return lofast.theorem1(z, m, w.B_norm(), lofast.centered_value_norm(X, w), w.VO_norm(), w.dh, e, c)


def lipschitz_upper(X: Tensor, w: AttentionWeights, residual: bool = True, causal: bool = False, **power) -> Tensor:
    """lim_{eps->0} delta/eps = zeta + sum_l c_l(0)/sqrt(dh) ||M_l|| ||(X - 1 xbar) VO_l|| >= ||J_F(X)||: (...,)."""
    w = prepare(X, w)
    c = softmax_constant(row_terms(X, w, causal), 0.0)
    z = lofast.zeta(X, w, residual, causal=causal, **power)
    m = lofast.m_norms(X, w, **power)
    return z + (c / math.sqrt(w.dh) * m * lofast.centered_value_norm(X, w)).sum(-1)
