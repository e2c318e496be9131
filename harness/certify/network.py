"""The network route of a whole-model certificate: the exact gradient of every margin plus a certified bound on
how much that gradient can vary over the ball (docs/math.md §6).

For the margin m_j(x) = z_y - z_j = (w_y - w_j) . p(x) (p: the chain's pooled output) and ||x' - x||_F <= eps,

    m_j(x') - m_j(x) - grad m_j(x) . (x' - x) = int_0^1 (grad m_j(x + t (x' - x)) - grad m_j(x)) . (x' - x) dt,

so m_j(x') >= m_j(x) - ||grad m_j(x)|| eps - eps int_0^1 V_0(t eps) dt, where V_0(rho) >= sup ||grad m_j(x') -
grad m_j(x)|| over the ball of radius rho. The gradient is exact (reverse mode in float64 over the rows that may
move: a scalar function's local constant is its gradient's norm, no estimate involved). V_0 comes from a backward
recursion over the chain's blocks f_1 ... f_K, each on its own propagated ball (radius r_k around its nominal
input X_k, from the layer-by-layer route), with phi_k = m_j o f_K o ... o f_{k+1} and g_k = ||grad phi_k(X_k)||:

    grad phi_{k-1}(x') - grad phi_{k-1}(x) = J_k(x)^T (v' - v) + (J_k(x') - J_k(x))^T v'
    V_{k-1} <= J0_k V_k + D_k (g_k + V_k),      V_K = 0 at the head (the margin is linear in p),

with (J0_k, D_k) each block's nominal Jacobian norm and Jacobian variation over its ball (block.jacobian). The
integral is bounded by the upper Riemann sum over STEPS sub-radii (V_0 grows with the radius). Every block
provides (J0, D), ReLU included (its variation is bounded by the units that may change sign).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch

from harness.certify.block import Rows, Trace

Tensor = torch.Tensor
GRAD_ROUNDING = 1e-10  # relative allowance on the float64 gradient norms and margins
STEPS = 4  # sub-radii of the upper Riemann sum of int_0^1 V_0(t eps) dt


@dataclass
class NetworkTerms:
    margins: Tensor  # (C,) z_y - z_j (+inf at y)
    grads: List[Tensor]  # per step k: (C, n_k, d_k) gradient of each margin w.r.t. the step's input X_k
    wdiff: Tensor  # (C,) ||w_y - w_j||

    def grad_norms(self, k: int, rows: Rows) -> Tensor:
        """||grad phi_k(X_k)|| over the rows that may move: (C,)."""
        g = self.grads[k] if rows is None else self.grads[k][:, list(rows)]
        return torch.linalg.vector_norm(g.flatten(1), dim=-1) * (1 + GRAD_ROUNDING)


def prepare_network(program, trace: Trace, X: Tensor, y: int) -> NetworkTerms:
    """The margins at X (n, d_in), label y, and their exact gradients at every step's input (one backward pass
    per class)."""
    inputs = []
    with torch.enable_grad():
        h = X.detach().clone().requires_grad_(True)
        for s in trace.steps:
            inputs.append(h)
            h = s.block.forward(h)
            if h.requires_grad:
                h.retain_grad()
        z = (h @ program.W + program.b)[0]
        grads = [torch.zeros(z.shape[0], *x.shape, dtype=X.dtype) for x in inputs]
        for j in range(z.shape[0]):
            if j == y:
                continue
            got = torch.autograd.grad(z[y] - z[j], inputs, retain_graph=True, allow_unused=True)
            for k, g in enumerate(got):
                if g is not None:
                    grads[k][j] = g
    z = z.detach()
    margins = z[y] - z
    margins[y] = math.inf
    W = program.W
    return NetworkTerms(margins=margins, grads=grads, wdiff=torch.linalg.vector_norm(W[:, y:y + 1] - W, dim=0))


@dataclass
class Balls:
    """Every step's input ball at one eps: radii (K + 1: each step's input, then the output), the rows that may move,
    each block's (J0, D) on its ball (None where it has none) and the certificate that gave each radius."""

    radii: List[float]
    rows: List[Rows]
    consts: List[Optional[Tuple[float, float]]]
    how: List[str]
    dp: List[Optional[float]]  # per step output: the bound on the prefix Jacobian's variation (None: not computed)


def balls(trace: Trace, eps: float, rows: Rows, norms: Optional[List[float]] = None,
          smaller: Sequence[Balls] = ()) -> Balls:
    """The input ball of every step for input radius eps: the layer-by-layer radius change_k(r_k), or, with the exact
    prefix Jacobian norms N_k (harness.certify.tangents), the smaller N_{k+1} eps + eps int_0^1 Dp_{k+1}(t eps) dt
    (Taylor with the integral remainder), where Dp_{k+1} = D_k (N_k + Dp_k) + J0_k Dp_k bounds the prefix Jacobian's
    variation over the input ball. `smaller`: the balls at eps j / i for j = 1 .. i - 1 (i = len(smaller) + 1), whose
    Dp with this one's give the upper Riemann sum of the integral (Dp grows with the radius)."""
    out = Balls([float(eps)], [rows], [], [], [])
    r, rw, Dp = float(eps), rows, 0.0
    for k, s in enumerate(trace.steps):
        if r == 0.0 or (rw is not None and len(rw) == 0):
            r, rw, jc, how = 0.0, (), (1.0, 0.0), "unchanged"
        else:
            jc = s.block.jacobian(s.prep, r, rw)
            r_next, rw, how = s.block.change(s.prep, r, rw)
            if norms is not None and jc is not None and Dp is not None:
                Dp = jc[1] * (norms[k] + Dp) + jc[0] * Dp
                known = [b.dp[k] for b in smaller]
                avg = (sum(known) + Dp) / (len(known) + 1) if all(x is not None for x in known) else Dp
                first = norms[k + 1] * eps + eps * avg
                if first < r_next:  # the block's certificate is named, then what replaced its radius
                    r_next, how = first, f"{how}, then the exact prefix Jacobian"
            else:
                Dp = None
            r = r_next
        out.consts.append(jc)
        out.radii.append(float(r))
        out.rows.append(rw)
        out.how.append(how)
        out.dp.append(Dp if norms is not None and r > 0.0 else None)
    return out


def ball_series(trace: Trace, eps: float, rows: Rows, norms: Optional[List[float]] = None,
                steps: int = STEPS) -> List[Balls]:
    """The balls at eps i / steps, i = 1 .. steps (the last at eps), each integrating over the ones before it."""
    out: List[Balls] = []
    for i in range(1, steps + 1):
        out.append(balls(trace, eps * i / steps, rows, norms, out))
    return out


def _variation(net: NetworkTerms, b: Balls) -> Optional[Tensor]:
    """V_0 (C,): the bound on the margins' gradient variation over the input ball of `b`, or None."""
    K = len(b.consts)
    V = torch.zeros_like(net.wdiff)
    for k in range(K - 1, -1, -1):
        if b.consts[k] is None:
            return None
        J0, D = b.consts[k]
        out = net.wdiff if k + 1 == K else net.grad_norms(k + 1, None)
        V = J0 * V + D * (out * (1 + GRAD_ROUNDING) + V)
    return V


def margin_lower_bounds(net: NetworkTerms, trace: Trace, eps: float, rows: Rows, norms=None,
                        series: Optional[List[Balls]] = None):
    """Lower bounds of every margin over the eps-ball (C,), or None where the route does not apply. series: the
    ball_series at eps, if already computed."""
    series = series or ball_series(trace, eps, rows, norms)
    total = torch.zeros_like(net.wdiff)
    for b in series:
        V = _variation(net, b)
        if V is None:
            return None
        total = total + V / len(series)
    g0 = net.grad_norms(0, rows)
    return net.margins * (1 - GRAD_ROUNDING) - g0 * eps - eps * total


def network_certified(net: NetworkTerms, trace: Trace, eps: float, rows: Rows, norms=None,
                      series: Optional[List[Balls]] = None) -> bool:
    """Whether every margin provably stays positive over the eps-ball (False where the route does not apply)."""
    low = margin_lower_bounds(net, trace, eps, rows, norms, series)
    return low is not None and bool((low > 0).all())
