"""Mass splitting (Castin et al. §4.2, docs/math.md §3, derived criterion).

Duplicating token i into copies of mass w_i / c and moving the copies in opposite directions (D, -D) leaves the
measure's first-order change zero except inside Cov_i: the Jacobian at the duplicated configuration is block
diagonal in (copies move together) + (copies move apart), so
    ||Df^{w'}(X')||_{w'} = max( ||Df^w(X)||_w , max_i ||V^T Cov_i A_c|| )     (`split_lipschitz`),
which `duplicated_lipschitz` computes explicitly (duplicate, then Jacobian norm). Worked example: d = 1, A = -2,
V = 1, X = (-3, -0.3): unsplit 1.382, duplicated (n = 4) 2.011.
"""
from __future__ import annotations

from typing import Optional, Union

import torch

from harness.bounds.castin_weighted import (_check_AV, check_masses, covariances, jacobian_formula,
                                            weighted_jacobian_norm, weighted_probs)
from harness.kernels.attention import AttentionWeights, check_input
from harness.kernels.layer import layer_operator
from harness.kernels.linalg import all_finite

Tensor = torch.Tensor

__all__ = ["duplicate_tokens", "duplicated_lipschitz", "covariance_term", "split_terms", "split_lipschitz",
           "mass_splitting_map", "one_dim_weights", "explicit_duplication"]


def duplicate_tokens(X: Tensor, masses: Optional[Tensor] = None, copies: int = 2):
    """Each token repeated `copies` times with mass w_i / copies: (..., n, d) -> ((..., c*n, d), (..., c*n))."""
    check_input(X)
    if not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be an integer >= 1, got {copies!r}")
    m = check_masses(masses, X)
    return X.repeat_interleave(copies, dim=-2), m.repeat_interleave(copies, dim=-1) / copies


def duplicated_lipschitz(X: Tensor, masses: Optional[Tensor], A: Tensor, V: Tensor, copies: int = 2, **kw) -> Tensor:
    """Explicit route: ||Df^{w'}(X')||_{w'} at the duplicated configuration (uniform masses: Euclidean norm)."""
    Xd, md = duplicate_tokens(X, masses, copies)
    return weighted_jacobian_norm(Xd, md, A, V, **kw)


def covariance_term(X: Tensor, masses: Optional[Tensor], A: Tensor, V: Tensor) -> Tensor:
    """max_i ||V^T Cov_i A_c|| with Cov_i under P^w (the copies-move-apart block): (..., n, d) -> (...,)."""
    check_input(X)
    _check_AV(A, V, X.shape[-1])
    P = weighted_probs(X, A, masses)
    M = V.transpose(-1, -2) @ covariances(X, P) @ A.transpose(-1, -2)  # (..., n, d, d)
    return torch.linalg.matrix_norm(M, ord=2).amax(-1)


def split_terms(X: Tensor, masses: Optional[Tensor], A: Tensor, V: Tensor, **kw) -> dict:
    """dict(unsplit = ||Df^w(X)||_w, cov = max_i ||V^T Cov_i A_c||, split = their max), each (...,)."""
    unsplit = weighted_jacobian_norm(X, masses, A, V, **kw)
    cov = covariance_term(X, masses, A, V)
    return dict(unsplit=unsplit, cov=cov, split=torch.maximum(unsplit, cov))


def split_lipschitz(X: Tensor, masses: Optional[Tensor], A: Tensor, V: Tensor, **kw) -> Tensor:
    """Mass-splitting local constant max(||Df^w(X)||_w, max_i ||V^T Cov_i A_c||): (..., n, d) -> (...,)."""
    return split_terms(X, masses, A, V, **kw)["split"]


def _as_t(x, dtype, device):
    return torch.as_tensor(x, dtype=dtype, device=device)


def mass_splitting_map(x1: Union[float, Tensor], x2: Union[float, Tensor], p: Union[float, Tensor] = 0.5,
                       A: float = -2.0, V: float = 1.0, dtype=torch.float64, device=None, rtol: float = 1e-9) -> dict:
    """1-D phase map of two atoms at x1, x2 with masses (p, 1-p): broadcasts x1, x2, p (e.g. x1[:, None], x2[None]).

    Returns dict of tensors of the broadcast shape: unsplit (||Df^w||_w, dense 2x2), cov (max_i |V Cov_i A|),
    split (max of both), gain (split / unsplit), splits (bool: cov > unsplit (1 + rtol), splitting pays).
    """
    x1, x2, p = (_as_t(t, dtype, device) for t in (x1, x2, p))
    x1, x2, p = torch.broadcast_tensors(x1, x2, p)
    for name, t in (("x1", x1), ("x2", x2), ("p", p)):
        if not all_finite(t):
            raise ValueError(f"{name} contains NaN or inf values")
    if ((p <= 0) | (p >= 1)).any():
        raise ValueError("p must lie strictly inside (0, 1)")
    At = _as_t(A, dtype, device).reshape(1, 1)
    Vt = _as_t(V, dtype, device).reshape(1, 1)
    shape = x1.shape
    X = torch.stack([x1, x2], dim=-1).reshape(-1, 2, 1)  # (S, 2, 1)
    m = torch.stack([p, 1 - p], dim=-1).reshape(-1, 2)  # (S, 2)
    P = weighted_probs(X, At, m)  # (S, 2, 2)
    E = torch.eye(2, dtype=dtype, device=device).reshape(2, 2, 1)  # basis perturbations
    cols = torch.stack([jacobian_formula(X, At, Vt, E[k].expand_as(X), P=P)[..., 0] for k in range(2)], -1)  # (S,2,2)
    s = m.sqrt()
    J = s.unsqueeze(-1) * cols / s.unsqueeze(-2)  # W^{1/2} J W^{-1/2}
    unsplit = torch.linalg.matrix_norm(J, ord=2)
    cov = (Vt * covariances(X, P) * At).abs().reshape(-1, 2).amax(-1)
    split = torch.maximum(unsplit, cov)
    out = dict(unsplit=unsplit, cov=cov, split=split, gain=split / unsplit, splits=cov > unsplit * (1 + rtol))
    return {k: v.reshape(shape) for k, v in out.items()}


def one_dim_weights(A: float = -2.0, V: float = 1.0, dtype=torch.float64, device=None) -> AttentionWeights:
    """AttentionWeights with d = h = dh = 1 and S = A x x', VO = V."""
    t = lambda v: torch.tensor([[[float(v)]]], dtype=dtype, device=device)
    return AttentionWeights(t(A), t(1.0), t(V), t(1.0))


def explicit_duplication(x1: Tensor, x2: Tensor, a: int, b: int, A: float = -2.0, V: float = 1.0,
                         copies: int = 2) -> dict:
    """unsplit / split local constants by explicit duplication: ordinary attention on copies * (a + b) tokens,
    x1 repeated copies * a times, x2 copies * b times (every atom has >= 2 copies to split): (S,) each.

    J (S, n, n) is built column by column from kernels.layer.layer_operator; unsplit = ||J Q|| with Q the
    orthonormal basis of group-constant moves, split = ||J||. dtype/device follow x1."""
    w = one_dim_weights(A, V, x1.dtype, x1.device)
    a, b = copies * a, copies * b
    X = torch.cat([x1[:, None].expand(-1, a), x2[:, None].expand(-1, b)], dim=1)[..., None]  # (S, n, 1)
    n = a + b
    matvec, _ = layer_operator(X, w)
    E = torch.eye(n, dtype=X.dtype, device=X.device)
    J = torch.stack([matvec(E[k].expand(X.shape[0], n)[..., None])[..., 0] for k in range(n)], dim=-1)  # (S, n, n)
    Q = torch.zeros(n, 2, dtype=X.dtype, device=X.device)
    Q[:a, 0] = 1 / a ** 0.5
    Q[a:, 1] = 1 / b ** 0.5
    return dict(unsplit=torch.linalg.matrix_norm(J @ Q, ord=2), split=torch.linalg.matrix_norm(J, ord=2))
