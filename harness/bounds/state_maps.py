"""The functions of an InputState behind the built-in bounds of harness.bounds.registry that are more than one
call: Kim's validity predicate, Theorem 1's eps -> 0 limits (per head and per layer, with a fixed or the per-row
softmax constant), eq. 9's naive layer bound, and the second-order certificate at a state.
"""
from __future__ import annotations

import torch

from harness.bounds import kim, lofast, lofast_refined, second_order
from harness.bounds.input_state import InputState

Tensor = torch.Tensor


def kim_ok(s: InputState) -> Tensor:
    """Where Kim et al.'s bound is proven at the state (harness.bounds.kim.guaranteed): (...,) bool."""
    return kim.guaranteed(s.X, 0.0, augmented=s.w.has_bias)


def refined_c(s: InputState) -> Tensor:
    """The eps -> 0 per-ball softmax constant c_l(0) per head (..., h), from the state's probabilities."""
    return lofast_refined.constant_at_zero(s.P)


def lofast_limit(m_attr: str, c, heads: bool, centered: bool = False):
    """Theorem 1's eps -> 0 limit (lofast.theorem1_limit) at the state, m_l = the state's `m_attr`. heads: per head,
    with the single-head zeta_l = ||P_l|| ||VO_l|| (Kronecker norm); else the layer's, with zeta
    (= lofast.lipschitz_upper(residual=False)). c: the softmax constant, a number or a function of the state
    giving (..., h). centered: the values' norm about the mean token (ours: dP's rows sum to 0)."""
    def fn(s: InputState) -> Tensor:
        d1 = s.P_norm * s.VO_norm if heads else s.zeta
        v = s.value_norm_centered if centered else s.value_norm
        return lofast.theorem1_limit(d1, getattr(s, m_attr), v, s.w.dh, c(s) if callable(c) else c, heads)

    return fn


def lofast_naive_layer(s: InputState) -> Tensor:
    """eq. 9 for Delta_1 + the coarse Delta_2, eps -> 0 (the limit of the certificate "naive"): (...,)."""
    return lofast.theorem1_limit((s.VO_norm * s.P_norm).sum(-1), s.m_coarse, s.value_norm, s.w.dh, 1.0)


def second_order_residual_at(s: InputState, eps) -> Tensor:
    """The second-order certificate of the residual map X + F(X) at a certifying state: U eps + eps^2/2 K(eps) with
    U the certified upper estimate of ||I + J_F(X)|| (the identity has no curvature, so K is F's), padded by
    s.rounding_allowance."""
    s.truth_residual  # noqa: B018 - fills s.upper["residual"]
    e = torch.as_tensor(eps, dtype=s.X.dtype, device=s.X.device)
    return second_order.delta(s.upper["residual"], s.curvature, e) * s.rounding_allowance


def residual_changes(s: InputState, eps, out: dict) -> dict:
    """The ball changes `out` of F (name -> (...,)) turned into those of X + F(X): each plus eps, and in certifying
    mode second_order (and with it best) also the residual map's own second-order certificate."""
    e = torch.as_tensor(eps, dtype=s.X.dtype, device=s.X.device)
    out = {n: v + e for n, v in out.items()}
    if s.certify is not None and "second_order" in out:
        out["second_order"] = torch.minimum(out["second_order"], second_order_residual_at(s, eps))
        if "best" in out:
            out["best"] = torch.minimum(out["best"], out["second_order"])
    return out


def second_order_at(s: InputState, eps) -> Tensor:
    """harness.bounds.second_order.delta at the state: U = the layer truth, K from the exact ||M_l||; in certifying
    mode (`certify`) U and ||M_l|| are their certified upper estimates (Lanczos values approach the norms from
    below) and the result is padded by s.rounding_allowance."""
    truth = s.truth_layer
    U = s.upper.get("layer", truth) if s.certify is not None else truth
    e = torch.as_tensor(eps, dtype=s.X.dtype, device=s.X.device)
    return second_order.delta(U, s.curvature, e) * s.rounding_allowance
