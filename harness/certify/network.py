"""The network route of a whole-model certificate: second order in eps with an exact first-order term
(docs/math.md §6).

For the margin m_j(x) = z_y - z_j = (w_y - w_j) . p(x) (p: the chain's pooled output), Taylor's theorem with the
integral remainder gives, for ||x' - x||_F <= eps,

    m_j(x') >= m_j(x) - ||grad m_j(x)|| eps - eps^2 / 2 H_0,

with grad m_j(x) exact (reverse mode in float64 over the rows that may move: a scalar function's local constant
is its gradient's norm, no estimate involved) and H_0 >= sup ||Hessian of m_j|| over the ball. H_0 comes from a
backward recursion over the chain's blocks f_1 ... f_K, each on its own propagated ball (radius r_k around its
nominal input X_k, from the layer-by-layer route), with phi_k = m_j o f_K o ... o f_{k+1}:

    H_{k-1} <= G_k K_k + L_k^2 H_k                      (Hessian of phi_k o f_k: chain rule)
    G_{k-1} <= min(g_{k-1} + r_{k-1} H_{k-1}, L_k G_k)  (sup of ||grad phi_{k-1}|| over its ball)

where (L_k, K_k) bound f_k's Jacobian and second derivative on its ball (block.smooth), g_k = ||grad phi_k(X_k)||
is the exact gradient at the nominal point (one backward pass), and the recursion starts at the head with
G_K = ||w_y - w_j||, H_K = 0. The tail enters through actual gradient norms, not products of operator norms.
The route needs every block twice differentiable on its ball (a ReLU whose units may change sign there is not;
the layer-by-layer route still applies).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import List

import torch

from harness.certify.block import Rows, Trace

Tensor = torch.Tensor
GRAD_ROUNDING = 1e-10  # relative allowance on the float64 gradient norms and margins


@dataclass
class NetworkTerms:
    margins: Tensor  # (C,) z_y - z_j (+inf at y)
    grads: List[Tensor]  # per step k: (C, n_k, d_k) gradient of each margin w.r.t. the step's input X_k
    wdiff: Tensor  # (C,) ||w_y - w_j||

    def grad_norms(self, k: int, rows: Rows) -> Tensor:
        """||grad phi_k(X_k)|| over the rows that may move: (C,)."""
        g = self.grads[k] if rows is None else self.grads[k][:, list(rows)]
        return torch.linalg.vector_norm(g.flatten(1), dim=-1) * (1 + GRAD_ROUNDING)


def prepare_network(program, trace: Trace, X: Tensor, y: int, rows: Rows) -> NetworkTerms:
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


def margin_lower_bounds(net: NetworkTerms, trace: Trace, eps: float, rows: Rows):
    """Lower bounds of every margin over the eps-ball (C,), or None where the route does not apply."""
    radii, rws, r, rw = [], [], float(eps), rows
    consts = []
    for s in trace.steps:  # each step's input ball, and (L_k, K_k) on it
        radii.append(r)
        rws.append(rw)
        if r == 0.0 or (rw is not None and len(rw) == 0):
            consts.append((1.0, 0.0))
            r, rw = 0.0, ()
            continue
        got = s.block.smooth(s.prep, r, rw)
        if got is None:
            return None
        consts.append(got)
        r, rw, _ = s.block.change(s.prep, r, rw)
    G = net.wdiff * (1 + GRAD_ROUNDING)  # (C,) at the head: the margin is linear in p
    H = torch.zeros_like(G)
    for k in range(len(trace.steps) - 1, -1, -1):
        L, K = consts[k]
        H = G * K + L * L * H
        G = torch.minimum(net.grad_norms(k, rws[k]) + radii[k] * H, L * G)
    g0 = net.grad_norms(0, rows)
    return net.margins * (1 - GRAD_ROUNDING) - g0 * eps - 0.5 * eps * eps * H


def network_certified(net: NetworkTerms, trace: Trace, eps: float, rows: Rows) -> bool:
    """Whether every margin provably stays positive over the eps-ball (False where the route does not apply)."""
    low = margin_lower_bounds(net, trace, eps, rows)
    return low is not None and bool((low > 0).all())
