"""Spectral norms of low-rank products without forming them (shared by every paper's bounds)."""
from __future__ import annotations

import torch

Tensor = torch.Tensor


def spec(A: Tensor) -> Tensor:
    """Spectral norm over the last two axes: (..., m, p) -> (...,)."""
    return torch.linalg.matrix_norm(A, ord=2)


def prod_norm(a: Tensor, b: Tensor) -> Tensor:
    """||a b^T|| for thin factors a (..., m, r), b (..., p, r), exactly via QR: (...,).

    a = Qa Ra, b = Qb Rb with orthonormal Qa, Qb, so ||a b^T|| = ||Ra Rb^T|| (an r x r SVD, not m x p).
    At d = 768, dh = 64 this is ~1 ms per head instead of ~1 s for the dense d x d SVD.
    """
    Ra = torch.linalg.qr(a, mode="r").R if a.shape[-2] > a.shape[-1] else a
    Rb = torch.linalg.qr(b, mode="r").R if b.shape[-2] > b.shape[-1] else b
    return spec(Ra @ Rb.transpose(-1, -2))


def safe_norm(v: Tensor, dim: int = -1) -> Tensor:
    """2-norm over `dim` without overflow or underflow of the squares: (..., N) -> (...,).

    torch's norm squares the entries, so a vector of 1e200s (float64) or 1e20s (float32) has norm inf;
    here the entries are divided by their largest magnitude first. NaN stays NaN.
    """
    m = v.abs().amax(dim, keepdim=True)
    ms = torch.where(m > 0, m, torch.ones_like(m))
    ms = torch.where(torch.isfinite(ms), ms, torch.ones_like(ms))
    return (v / ms).norm(dim=dim) * ms.squeeze(dim)
