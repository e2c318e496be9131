"""The network route of a whole-model certificate: second order in eps with an exact first-order term
(docs/math.md §6).

For the margin m_j(x) = z_y(x) - z_j(x) = (w_y - w_j) . p(x) (p: the chain's pooled output), Taylor's theorem
with the integral remainder gives, for ||x' - x||_F <= eps,

    m_j(x') >= m_j(x) - ||grad m_j(x)|| eps - eps^2 / 2 ||w_y - w_j|| K,

where grad m_j(x) is computed exactly (autograd in float64, restricted to the rows that may move: a scalar
function's local Lipschitz constant is its gradient's norm, with no estimate involved) and K >= sup ||D^2 p|| over
the ball, composed from every block's (L_k, K_k) on its own propagated ball (block.Trace.smooth). The point is
certified when every margin stays positive. The route needs every block twice differentiable on its ball (a ReLU
whose units may change sign there is not; the layer-by-layer route still applies).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from harness.certify.block import Rows, Trace

Tensor = torch.Tensor
GRAD_ROUNDING = 1e-10  # relative allowance on the float64 gradient norms and margins


@dataclass
class NetworkTerms:
    margins: Tensor  # (C,) z_y - z_j (+inf at y)
    grads: Tensor  # (C,) ||grad m_j|| over the moving rows
    wdiff: Tensor  # (C,) ||w_y - w_j||


def prepare_network(program, trace: Trace, X: Tensor, y: int, rows: Rows) -> NetworkTerms:
    """The margins and their exact gradient norms at X (n, d_in), label y."""
    idx = list(range(X.shape[0])) if rows is None else list(rows)
    V = X[idx].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        full = X.detach().clone()
        full[idx] = V
        z = program.forward(full)
        grads = []
        for j in range(z.shape[-1]):
            if j == y:
                grads.append(torch.zeros((), dtype=X.dtype))
                continue
            (g,) = torch.autograd.grad(z[y] - z[j], V, retain_graph=True)
            grads.append(torch.linalg.vector_norm(g))
    z = z.detach()
    margins = z[y] - z
    margins[y] = math.inf
    W = program.W
    return NetworkTerms(margins=margins, grads=torch.stack(grads) * (1 + GRAD_ROUNDING),
                        wdiff=torch.linalg.vector_norm(W[:, y:y + 1] - W, dim=0))


def network_certified(net: NetworkTerms, trace: Trace, eps: float, rows: Rows) -> bool:
    """Whether every margin provably stays positive over the eps-ball (False where the route does not apply)."""
    got = trace.smooth(eps, rows)
    if got is None:
        return False
    _, K = got
    low = net.margins * (1 - GRAD_ROUNDING) - net.grads * eps - 0.5 * eps * eps * net.wdiff * K
    return bool((low > 0).all())
