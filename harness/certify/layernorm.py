"""LayerNorm's certified change over an l2 ball (docs/math.md §6).

Per row, y = gamma * P x / sigma(x) + beta with P = I - 1 1^T / d and sigma(x) = sqrt(||P x||^2 / d + eps_ln).
The Jacobian of x -> P x / sigma(x) is (P - u u^T / d) / sigma with u = P x / sigma, whose eigenvalues are
1 / sigma on the complement of u in range(P) and (1 - ||u||^2 / d) / sigma in [0, 1 / sigma] along u: its norm is
exactly 1 / sigma(x). Along a segment from x to x' with ||x' - x|| <= r, ||P x'|| >= ||P x|| - r, so

    ||y(x') - y(x)|| <= max|gamma| r / sigma_min(r),   sigma_min(r) = sqrt(max(0, ||P x|| - r)^2 / d + eps_ln).

Over the matrix, rows move by r_i with sum r_i^2 <= r^2 and each row's factor grows with r_i, so the change is
at most max_i L_i(r) r with L_i(r) = max|gamma| / sigma_min_i(r) over the rows that may move.

The second member never exceeds LayerNorm's range: with a = P x, A = ||a|| and phi(a) = a / sqrt(||a||^2 + d eps_ln)
(so y = gamma * sqrt(d) phi(a) + beta), any a' within r of a has ||a'|| in [A - r, A + r] and makes an angle of at
most arcsin(r / A) with a (any angle when r >= A); ||phi(a') - phi(a)||^2 = f(|a'|)^2 + f(A)^2 - 2 f(|a'|) f(A) cos,
f(t) = t / sqrt(t^2 + d eps_ln), is largest at an end of that interval and at the largest angle. Over the matrix the
squares of the rows' bounds at r add up. The certificate is the smaller of the two. An optional constant `shift`
(max_n, d) is added before normalizing (BERT's position and type embeddings, its first n rows); it changes neither.

For the network route (the Jacobian's variation over the ball, at most r K), the second derivative of
x -> P x / sigma(x) along a unit e is
-2 a (c.a) / (d sigma^3) - c |a|^2 / (d sigma^3) + 3 c (c.a)^2 / (d^2 sigma^5) with c = P x, a = P e; as
|c| <= sqrt(d) sigma and |a| <= 1 its norm is at most 6 / (sqrt(d) sigma^2), so K = 6 max|gamma| / (sqrt(d)
sigma_min^2) over the ball (rows are independent: the largest row's K bounds the matrix).
"""
from __future__ import annotations

from typing import Optional

import torch

from harness.certify.block import Block, Rows

Tensor = torch.Tensor


class LayerNorm(Block):
    rowwise = True

    def __init__(self, gamma: Tensor, beta: Tensor, eps: float, shift: Optional[Tensor] = None,
                 name: str = "layernorm"):
        if gamma.dim() != 1 or beta.shape != gamma.shape or float(eps) < 0:
            raise ValueError("LayerNorm needs gamma, beta of shape (d,) and eps >= 0")
        self.gamma, self.beta, self.eps, self.shift, self.name = gamma, beta, float(eps), shift, name
        self.gmax = float(gamma.abs().max())

    def _input(self, X: Tensor) -> Tensor:
        if self.shift is None:
            return X
        if X.shape[-2] > self.shift.shape[0]:
            raise ValueError(f"{self.name}: {X.shape[-2]} tokens, but the model has {self.shift.shape[0]} positions")
        return X + self.shift[: X.shape[-2]]

    def forward(self, X: Tensor) -> Tensor:
        Z = self._input(X)
        return torch.nn.functional.layer_norm(Z, Z.shape[-1:], self.gamma, self.beta, self.eps)

    def prepare(self, X: Tensor) -> Tensor:
        """||P x_i|| per row: (n,)."""
        Z = self._input(X)
        return torch.linalg.vector_norm(Z - Z.mean(-1, keepdim=True), dim=-1)

    def change(self, prep: Tensor, r: float, rows: Rows):
        c = prep if rows is None else prep[list(rows)]
        d = self.gamma.shape[0]
        sigma = torch.sqrt((c - r).clamp_min(0.0).square() / d + self.eps)  # (rows,)
        lip = float(self.gmax * r / sigma.min()) if bool((sigma > 0).all()) else float("inf")
        cap = float(torch.linalg.vector_norm(self._angle(c, r)))
        return (lip, rows, "layernorm 1/sigma") if lip <= cap else (cap, rows, "layernorm angle")

    def _angle(self, A: Tensor, r: float) -> Tensor:
        """Per row, a bound on ||y(x') - y(x)|| over ||x' - x|| <= r that stays finite (see the module docstring):
        max|gamma| sqrt(d) ||phi(a') - phi(a)||, phi(a) = a / sqrt(|a|^2 + d eps_ln), with |a'| in [A - r, A + r]
        and the angle between a and a' at most arcsin(r / A) (anything beyond when r >= A)."""
        d = self.gamma.shape[0]
        c = d * self.eps
        f = lambda t: t / torch.sqrt(t * t + c) if c > 0 else (t > 0).to(t.dtype)  # noqa: E731
        fa = f(A)
        ratio = (r / A.clamp_min(torch.finfo(A.dtype).tiny)).clamp(max=1.0)
        # 1 - cos(angle) without cancellation: rho^2 / (1 + sqrt(1 - rho^2)) below the row's norm, 2 beyond it
        omc = torch.where(r < A, ratio.square() / (1.0 + torch.sqrt(1.0 - ratio.square())), 2.0 * torch.ones_like(A))
        worst = torch.zeros_like(A)
        for t in ((A - r).clamp_min(0.0), A + r):  # |phi(a') - phi(a)|^2 = (f' - f)^2 + 2 f' f (1 - cos)
            ft = f(t)
            worst = torch.maximum(worst, ((ft - fa).square() + 2.0 * ft * fa * omc).sqrt())
        eps = torch.finfo(A.dtype).eps
        return self.gmax * d ** 0.5 * (worst * (1 + 16 * eps) + 16 * eps * r / A.clamp_min(eps))

    def jacobian(self, prep: Tensor, r: float, rows: Rows):
        """J0 = max|gamma| / sigma(x) at the nominal rows; D = r K, K = 6 max|gamma| / (sqrt(d) sigma_min(r)^2) the
        second-derivative bound over the ball (docs/math.md §6)."""
        c = prep if rows is None else prep[list(rows)]
        d = self.gamma.shape[0]
        s0 = float(torch.sqrt(c.square() / d + self.eps).min())
        smin = float(torch.sqrt((c - r).clamp_min(0.0).square() / d + self.eps).min())
        if smin == 0.0:
            return None
        return self.gmax / s0, r * 6.0 * self.gmax / (d ** 0.5 * smin * smin)