"""Certified changes of the feed-forward parts: the two-layer MLP (optionally with its residual) and one dense
layer with an activation (a pooler, a pre-classifier), per row, row vectors x -> x W + b (docs/math.md §6).

MLP, y = [x +] act(x W1 + b1) W2 + b2, Jacobian J(x) = [I +] W1 diag(act'(u)) W2 at u = x W1 + b1. Members, the
minimum is taken per radius:
  second order (smooth act, |act''| <= A2): f(x + e) - f(x) = int_0^1 J(x + t e) e dt, and
      ||(act'(u + t e W1) - act'(u)) * (e W1)|| <= A2 t ||e W1||_4^2 <= A2 t ||W1||^2 r^2, so
      change <= ||J(x)|| r + A2 / 2 ||W1||^2 ||W2|| r^2          (||J(x)|| exact: an SVD per row)
  unstable units (ReLU): units with |u_j| > rho_j = ||W1[:, j]|| r keep their derivative over the ball; the others
      (U) move it by at most 1, so ||J(x')|| <= ||J(x)|| + ||W1[:, U]||_F ||W2[U, :]||_F
  global: act' in [lo, hi] everywhere, so ||J|| <= ||[I +] c W1 W2|| + (hi - lo) / 2 ||W1|| ||W2||, c = (lo + hi) / 2
Rows move by r_i with sum r_i^2 <= r^2 and each row's factor grows with r_i: the matrix change is at most the largest
row factor (at r) times r.

Dense, y = act(x W + b) on one row: ||J(x')|| = ||W diag(act'(u'))|| <= ||W diag(s)|| with s_j the largest |act'|
over [u_j - rho_j, u_j + rho_j] (diag(act'(u') / s) has norm <= 1).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from harness.certify.block import Block, Rows

Tensor = torch.Tensor
SQRT2 = math.sqrt(2.0)
_PHI_SQRT2 = math.exp(-1.0) / math.sqrt(2.0 * math.pi)  # standard normal density at sqrt(2)
_CDF_SQRT2 = 0.5 * (1.0 + math.erf(1.0))  # Phi(sqrt(2))


def _gelu_d(u: Tensor) -> Tensor:  # d/du u Phi(u)
    return 0.5 * (1.0 + torch.erf(u / SQRT2)) + u * torch.exp(-0.5 * u * u) / math.sqrt(2.0 * math.pi)


# name -> (act, act', (min act', max act'), sup |act''| or None where act' jumps)
ACTIVATIONS = {
    "gelu": (torch.nn.functional.gelu, _gelu_d,
             (1.0 - _CDF_SQRT2 - SQRT2 * _PHI_SQRT2, _CDF_SQRT2 + SQRT2 * _PHI_SQRT2), 2.0 / math.sqrt(2.0 * math.pi)),
    "relu": (torch.relu, lambda u: (u > 0).to(u.dtype), (0.0, 1.0), None),
    "tanh": (torch.tanh, lambda u: 1.0 - torch.tanh(u).square(), (0.0, 1.0), 4.0 / (3.0 * math.sqrt(3.0))),
}
# the argmaxes of |act'| (GELU: act' peaks at +sqrt(2), dips at -sqrt(2); tanh, ReLU: largest nearest 0 / above 0)
_CRITICAL = {"gelu": (SQRT2, -SQRT2), "relu": (), "tanh": (0.0,)}


def activation(name: str):
    """The activation's entry in ACTIVATIONS, or a ValueError naming the supported ones."""
    key = {"gelu_python": "gelu", "relu": "relu", "tanh": "tanh", "gelu": "gelu"}.get(str(name).lower())
    if key is None:
        raise ValueError(f"activation {name!r} has no certified bound here; supported: gelu (erf), relu, tanh "
                         "(the tanh approximation of GELU is another function: its constants are not derived)")
    return key, ACTIVATIONS[key]


def max_abs_derivative(name: str, lo: Tensor, hi: Tensor) -> Tensor:
    """sup |act'| over each interval [lo, hi] (elementwise)."""
    small, big = derivative_range(name, lo, hi)
    return torch.maximum(small.abs(), big.abs())


def derivative_range(name: str, lo: Tensor, hi: Tensor) -> Tuple[Tensor, Tensor]:
    """(inf act', sup act') over each interval [lo, hi] (elementwise): at the endpoints or the critical points of act'
    inside (GELU: +-sqrt(2); tanh: 0, where act' peaks; ReLU: its two values)."""
    if name == "relu":
        return (lo > 0).to(lo.dtype), (hi > 0).to(lo.dtype)
    _, d, _, _ = ACTIVATIONS[name]
    a, b = d(lo), d(hi)
    small, big = torch.minimum(a, b), torch.maximum(a, b)
    for c in _CRITICAL[name]:
        inside = (lo <= c) & (c <= hi)
        v = d(torch.full_like(lo, c))
        small = torch.where(inside, torch.minimum(small, v), small)
        big = torch.where(inside, torch.maximum(big, v), big)
    return small, big


def _norm(A: Tensor) -> Tensor:
    return torch.linalg.matrix_norm(A, ord=2)


class MLP(Block):
    """[x +] act(x W1 + b1) W2 + b2 on each row; W1 (d, f), W2 (f, d')."""

    rowwise = True

    def __init__(self, W1: Tensor, b1: Optional[Tensor], W2: Tensor, b2: Optional[Tensor], act: str,
                 residual: bool = False, name: str = "mlp"):
        self.act, (self.fn, self.d, (lo, hi), self.A2) = activation(act)
        if residual and W1.shape[0] != W2.shape[1]:
            raise ValueError("a residual MLP maps d to d")
        self.W1, self.b1, self.W2, self.b2, self.residual, self.name = W1, b1, W2, b2, bool(residual), name
        self.n1, self.n2 = float(_norm(W1)), float(_norm(W2))
        eye = torch.eye(W1.shape[0], dtype=W1.dtype, device=W1.device) if residual else 0.0
        self.glob = float(_norm(eye + 0.5 * (lo + hi) * W1 @ W2)) + 0.5 * (hi - lo) * self.n1 * self.n2
        self.col1 = torch.linalg.vector_norm(W1, dim=0)  # (f,) ||W1[:, j]||
        self.sq1, self.sq2 = self.col1.square(), W2.square().sum(-1)  # (f,) each
        root = self.col1.sqrt()
        self.split = float(_norm(W1 * root) * _norm(root[:, None] * W2))  # ||W1 diag(sqrt c)|| ||diag(sqrt c) W2||

    def _pre(self, X: Tensor) -> Tensor:
        U = X @ self.W1
        return U if self.b1 is None else U + self.b1

    def forward(self, X: Tensor) -> Tensor:
        Y = self.fn(self._pre(X)) @ self.W2
        Y = Y if self.b2 is None else Y + self.b2
        return X + Y if self.residual else Y

    def prepare(self, X: Tensor) -> Tuple[Tensor, Tensor]:
        """(pre-activations (n, f), ||J(x_i)|| per row (n,))."""
        U = self._pre(X)
        J = (self.W1.unsqueeze(0) * self.d(U).unsqueeze(-2)) @ self.W2  # (n, d, d')
        if self.residual:
            J = J + torch.eye(J.shape[-1], dtype=J.dtype, device=J.device)
        return U, _norm(J)

    def change(self, prep, r: float, rows: Rows):
        U, a = prep
        if rows is not None:
            U, a = U[list(rows)], a[list(rows)]
        members = {"mlp global": self.glob * r}
        if self.A2 is not None:
            members["mlp second order"] = float(a.max()) * r + 0.5 * self.A2 * self.n1 ** 2 * self.n2 * r * r
        else:
            unstable = (U.abs() <= self.col1 * r).to(U.dtype)  # (rows, f)
            extra = torch.sqrt((unstable * self.sq1).sum(-1) * (unstable * self.sq2).sum(-1))
            members["mlp unstable units"] = float((a + extra).max()) * r
        how = min(members, key=members.get)
        return members[how], rows, how

    def jacobian(self, prep, r: float, rows: Rows):
        """J0 = max_i ||J(x_i)|| (exact); D: J(x') - J(x) = W1 diag(delta) W2 with |delta_j| <= A2 ||W1[:, j]|| r
        for a smooth activation, so D <= A2 r ||W1 diag(sqrt c)|| ||diag(sqrt c) W2||, c_j = ||W1[:, j]||; for ReLU
        delta is supported on the units that may change sign, |delta_j| <= 1, so D <= ||W1[:, U]||_F ||W2[U, :]||_F
        (the largest over the moving rows)."""
        U, a = prep
        if rows is not None:
            U, a = U[list(rows)], a[list(rows)]
        if self.A2 is not None:
            return float(a.max()), self.A2 * r * self.split
        unstable = (U.abs() <= self.col1 * r).to(U.dtype)  # (rows, f)
        D = torch.sqrt((unstable * self.sq1).sum(-1) * (unstable * self.sq2).sum(-1)).max()
        return float(a.max()), min(float(D), self.n1 * self.n2)


class Dense(Block):
    """act(x W + b) on each row; W (d, d')."""

    rowwise = True

    def __init__(self, W: Tensor, b: Optional[Tensor], act: str, name: str = "dense"):
        self.act, (self.fn, _, _, _) = activation(act)
        self.W, self.b, self.name = W, b, name
        self.col = torch.linalg.vector_norm(W, dim=0)
        self.lip = float(_norm(W)) * max(abs(x) for x in ACTIVATIONS[self.act][2])

    def _pre(self, X: Tensor) -> Tensor:
        U = X @ self.W
        return U if self.b is None else U + self.b

    def forward(self, X: Tensor) -> Tensor:
        return self.fn(self._pre(X))

    def prepare(self, X: Tensor) -> Tuple[Tensor, Tensor]:
        """(pre-activations (n, d'), ||W diag(act'(u_i))|| per row (n,): J0 at the nominal rows, exact)."""
        U = self._pre(X)
        return U, _norm(self.W.unsqueeze(0) * ACTIVATIONS[self.act][1](U).unsqueeze(-2))

    def change(self, prep, r: float, rows: Rows):
        U = prep[0] if rows is None else prep[0][list(rows)]
        rho = self.col * r
        s = max_abs_derivative(self.act, U - rho, U + rho)  # (rows, d')
        local = float(_norm(self.W.unsqueeze(0) * s.unsqueeze(-2)).max()) * r
        return (local, rows, "dense local") if local <= self.lip * r else (self.lip * r, rows, "dense global")

    def jacobian(self, prep, r: float, rows: Rows):
        """J0 = ||W diag(act'(u))|| per row (exact, from prepare); D = ||W diag(t)|| with t_j the largest
        |act'(u') - act'(u_j)| on [u_j - rho_j, u_j + rho_j] (diag(delta / t) has norm <= 1)."""
        U, J0 = prep if rows is None else (prep[0][list(rows)], prep[1][list(rows)])
        s0 = ACTIVATIONS[self.act][1](U)
        lo, hi = derivative_range(self.act, U - self.col * r, U + self.col * r)
        t = torch.maximum(hi - s0, s0 - lo)
        return float(J0.max()), float(_norm(self.W.unsqueeze(0) * t.unsqueeze(-2)).max())