"""Castin et al.: the Jacobian formula (Lemma C.2 / D.1 / C.6) and weighted self-attention (Def. C.4), docs/math.md §3.

Conventions: A is the §0 score matrix (S = X A X^T), so Castin's A_c = A^T; V is the value map in the row
convention f(X) = P X V (V = VO_l for a head). Tokens are rows of X (..., n, d).
Weighted self-attention with masses w in the simplex: P^w_ij = w_j e^{s_ij} / sum_k w_k e^{s_ik},
f^w(X) = P^w X V, and the norm ||D||_w^2 = sum_i w_i ||D_i||^2 on inputs and outputs.
Uniform masses w = 1/n give ordinary self-attention and the Euclidean Jacobian norm.
"""
from __future__ import annotations

from typing import Optional

import torch

from harness.kernels.attention import causal_mask, check_input
from harness.kernels.power import operator_norm
from harness.kernels.linalg import all_finite

Tensor = torch.Tensor

__all__ = ["check_masses", "weighted_probs", "weighted_attention", "jacobian_formula", "dense_jacobian_formula",
           "weighted_jacobian_norm", "weighted_dense_jacobian", "covariances"]


def _check_AV(A: Tensor, V: Tensor, d: int) -> None:
    for name, M in (("A", A), ("V", V)):
        if not isinstance(M, torch.Tensor) or tuple(M.shape) != (d, d):
            got = tuple(M.shape) if isinstance(M, torch.Tensor) else type(M).__name__
            raise ValueError(f"{name} must have shape (d, d) = {(d, d)}, got {got}")
        if not all_finite(M):
            raise ValueError(f"{name} contains NaN or inf values")


def check_masses(masses: Optional[Tensor], X: Tensor) -> Tensor:
    """Validate positive masses (n,) or (..., n) for X (..., n, d); return them normalized to the simplex."""
    n = X.shape[-2]
    if masses is None:
        return torch.full(X.shape[:-1], 1.0 / n, dtype=X.dtype, device=X.device)
    if not isinstance(masses, torch.Tensor):
        masses = torch.as_tensor(masses, dtype=X.dtype, device=X.device)
    if masses.dim() < 1 or masses.shape[-1] != n:
        raise ValueError(f"masses must have shape (..., n) with n = {n}, got {tuple(masses.shape)}")
    if not all_finite(masses):
        raise ValueError("masses contain NaN or inf values")
    if (masses <= 0).any():
        raise ValueError("masses must be strictly positive (the weighted norm needs w_i > 0)")
    masses = masses.to(X.dtype)
    return (masses / masses.sum(-1, keepdim=True)).expand(X.shape[:-1])


def weighted_probs(X: Tensor, A: Tensor, masses: Optional[Tensor] = None, causal: bool = False) -> Tensor:
    """P^w = softmax_rows(X A X^T + log w) (Def. C.4; masked: j <= i): (..., n, d) -> (..., n, n)."""
    m = check_masses(masses, X)
    S = X @ A @ X.transpose(-1, -2) + torch.log(m).unsqueeze(-2)  # (..., n, n)
    if causal:
        S = S.masked_fill(causal_mask(X.shape[-2], X.device), float("-inf"))
    return torch.softmax(S, dim=-1)


def weighted_attention(X: Tensor, w_masses: Optional[Tensor], A: Tensor, V: Tensor, causal: bool = False) -> Tensor:
    """Weighted self-attention f^w(X) = P^w X V (Def. C.4): (..., n, d) -> (..., n, d)."""
    check_input(X)
    _check_AV(A, V, X.shape[-1])
    return weighted_probs(X, A, w_masses, causal) @ X @ V


def covariances(X: Tensor, P: Tensor) -> Tensor:
    """Cov_i = sum_j P_ij x_j x_j^T - m_i m_i^T: X (..., n, d), P (..., n, n) -> (..., n, d, d)."""
    m = P @ X  # (..., n, d)
    second = torch.einsum("...ij,...jk,...jl->...ikl", P, X, X)  # (..., n, d, d)
    return second - m.unsqueeze(-1) * m.unsqueeze(-2)


def jacobian_formula(X: Tensor, A: Tensor, V: Tensor, D: Tensor, P: Optional[Tensor] = None,
                     causal: bool = False, masses: Optional[Tensor] = None) -> Tensor:
    """df(X)[D] by Lemma C.2 (masked: D.1, weighted: C.6), rows i: (..., n, d).

    df_i = V^T ( sum_j P_ij D_j + Cov_i A_c D_i + sum_j P_ij <A_c x_i, D_j> (x_j - m_i) ), A_c = A^T.
    P defaults to the (masked / weighted) attention matrix of X; masked and weighted cases differ only in P.
    """
    if P is None:
        P = weighted_probs(X, A, masses, causal)  # (..., n, n)
    Ac = A.transpose(-1, -2)
    m = P @ X  # (..., n, d)
    cov = covariances(X, P)  # (..., n, d, d)
    t1 = P @ D  # (..., n, d)
    t2 = (cov @ (D @ Ac.transpose(-1, -2)).unsqueeze(-1)).squeeze(-1)  # Cov_i A_c D_i: (..., n, d)
    c = (X @ Ac.transpose(-1, -2)) @ D.transpose(-1, -2)  # c_ij = <A_c x_i, D_j>: (..., n, n)
    Pc = P * c  # (..., n, n)
    t3 = Pc @ X - Pc.sum(-1, keepdim=True) * m  # sum_j P_ij c_ij (x_j - m_i): (..., n, d)
    return (t1 + t2 + t3) @ V


def dense_jacobian_formula(X: Tensor, A: Tensor, V: Tensor, causal: bool = False,
                           masses: Optional[Tensor] = None) -> Tensor:
    """Explicit (n*d, n*d) Jacobian of a single X (n, d) built column by column from Lemma C.2 (row-major vec)."""
    if X.dim() != 2:
        raise ValueError(f"dense_jacobian_formula needs a single X of shape (n, d), got {tuple(X.shape)}")
    n, d = X.shape
    E = torch.eye(n * d, dtype=X.dtype, device=X.device).reshape(n * d, n, d)  # basis perturbations
    P = weighted_probs(X, A, masses, causal)
    cols = jacobian_formula(X.expand(n * d, n, d), A, V, E, P=P.expand(n * d, n, n))  # (nd, n, d)
    return cols.reshape(n * d, n * d).T


def _weight_scale(masses: Tensor) -> Tensor:
    return masses.sqrt().unsqueeze(-1)  # (..., n, 1)


def weighted_jacobian_norm(X: Tensor, masses: Optional[Tensor], A: Tensor, V: Tensor, causal: bool = False,
                           tol: float = 1e-12, iters: int = 5000, seed: int = 0, return_info: bool = False):
    """||Df^w(X)||_w (Lemma C.5) by power iteration in the w-inner product: (..., n, d) -> (...,).

    With W = diag(w) (x) I_d the operator norm is ||W^{1/2} J W^{-1/2}||; matvec uses Lemma C.6 (jacobian_formula),
    the adjoint uses torch.func.vjp of the same linear map.
    """
    check_input(X)
    _check_AV(A, V, X.shape[-1])
    m = check_masses(masses, X)
    X = X.detach()
    P = weighted_probs(X, A, m, causal)
    s = _weight_scale(m)  # (..., n, 1)

    def matvec(u):
        return s * jacobian_formula(X, A, V, u / s, P=P)

    _, vjp_fn = torch.func.vjp(matvec, torch.zeros_like(X))  # the map is linear: one linearization serves

    def rmatvec(y):
        return vjp_fn(y)[0]

    res = operator_norm(matvec, rmatvec, X.shape, 2, X.dtype, X.device, seed, iters=iters, tol=tol)
    return (res.value, res) if return_info else res.value


def weighted_dense_jacobian(X: Tensor, masses: Optional[Tensor], A: Tensor, V: Tensor,
                            causal: bool = False) -> Tensor:
    """W^{1/2} J W^{-1/2} for a single X (n, d) with J = torch.func.jacrev of f^w (test oracle): (n*d, n*d)."""
    m = check_masses(masses, X)
    J = torch.func.jacrev(lambda Z: weighted_probs(Z, A, m, causal) @ Z @ V)(X).reshape(X.numel(), X.numel())
    s = m.sqrt().repeat_interleave(X.shape[-1])  # (n*d,)
    return s[:, None] * J / s[None, :]
