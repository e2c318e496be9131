"""Top singular value of matrix-free operators by power iteration on A^T A, and Jacobian norms via torch.func.

The operator acts on tensors of shape (*batch, *event); each batch element is its own operator and gets its
own singular value, convergence flag and vector. Non-convergence is reported (flag + warning), never hidden.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

Tensor = torch.Tensor


class NonConvergenceWarning(RuntimeWarning):
    """Power iteration stopped at `iters` before reaching `tol` for some batch element."""


@dataclass
class PowerResult:
    value: Tensor  # (*batch,) top singular value
    converged: Tensor  # (*batch,) bool
    vector: Tensor  # (*batch, *event) top right singular vector (unit norm)
    iters: int  # iterations run
    rel_change: Tensor  # (*batch,) last relative change of the estimate


def _norm(v: Tensor, event_dims: int) -> Tensor:
    """Frobenius norm over the trailing `event_dims` axes: (*batch, *event) -> (*batch,)."""
    return v.flatten(start_dim=v.dim() - event_dims).norm(dim=-1) if event_dims else v.abs()


def _bcast(s: Tensor, event_dims: int) -> Tensor:
    return s.reshape(*s.shape, *([1] * event_dims))


def _random_start(shape, dtype, device, seed: int) -> Tensor:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randn(shape, dtype=dtype, device=device, generator=g)


def top_singular_value(matvec: Callable[[Tensor], Tensor], rmatvec: Callable[[Tensor], Tensor], v0: Tensor,
                       event_dims: int, iters: int = 2000, tol: float = 1e-10, on_nonconvergence: str = "warn",
                       ) -> PowerResult:
    """sigma_max of a batched matrix-free operator A, by power iteration v <- A^T A v / ||A^T A v||.

    matvec: (*batch, *event_in) -> (*batch, *event_out); rmatvec its adjoint. v0: (*batch, *event_in) start.
    Stops when every batch element's relative change of sigma^2 falls below `tol` (the error in sigma is then
    about tol * r / (1 - r) with r = (s2/s1)^2, i.e. < 1e-8 relative for r <= 0.99 and the default tol).
    on_nonconvergence: "warn" (default), "raise" or "ignore"; the flag is returned in every case.
    """
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if tol <= 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if on_nonconvergence not in ("warn", "raise", "ignore"):
        raise ValueError(f"on_nonconvergence must be 'warn', 'raise' or 'ignore', got {on_nonconvergence!r}")
    batch_shape = v0.shape[: v0.dim() - event_dims]
    v = v0 / _bcast(_norm(v0, event_dims).clamp_min(torch.finfo(v0.dtype).tiny), event_dims)
    lam = torch.zeros(batch_shape, dtype=v0.dtype, device=v0.device)
    done = torch.zeros(batch_shape, dtype=torch.bool, device=v0.device)
    rel = torch.full(batch_shape, float("inf"), dtype=v0.dtype, device=v0.device)
    it = 0
    for it in range(1, iters + 1):
        w = rmatvec(matvec(v))  # (*batch, *event) = A^T A v
        lam_new = (w * v).flatten(start_dim=v.dim() - event_dims).sum(-1) if event_dims else w * v  # Rayleigh
        nrm = _norm(w, event_dims)
        zero = nrm <= torch.finfo(v.dtype).tiny
        rel_new = (lam_new - lam).abs() / lam_new.abs().clamp_min(torch.finfo(v.dtype).tiny)
        rel_new = torch.where(zero, torch.zeros_like(rel_new), rel_new)
        # freeze elements that have converged: keep their value and vector
        upd = ~done
        lam = torch.where(upd, lam_new, lam)
        rel = torch.where(upd, rel_new, rel)
        v_new = torch.where(_bcast(zero, event_dims), v, w / _bcast(nrm.clamp_min(torch.finfo(v.dtype).tiny), event_dims))
        v = torch.where(_bcast(upd, event_dims), v_new, v)
        done = done | (upd & (rel_new < tol) & (it > 1)) | zero
        if bool(done.all()):
            break
    sigma = lam.clamp_min(0).sqrt()
    if not bool(done.all()):
        msg = (f"power iteration did not converge for {int((~done).sum())} of {done.numel()} operators after "
               f"{iters} iterations (max relative change {float(rel[~done].max()):.2e} > tol {tol:.1e})")
        if on_nonconvergence == "raise":
            raise RuntimeError(msg)
        if on_nonconvergence == "warn":
            warnings.warn(msg, NonConvergenceWarning, stacklevel=2)
    return PowerResult(sigma, done, v, it, rel)


def operator_norm(matvec, rmatvec, shape, event_dims: int, dtype=torch.float64, device=None, seed: int = 0,
                  v0: Optional[Tensor] = None, **kw) -> PowerResult:
    """top_singular_value from a seeded Gaussian start of the given (*batch, *event) shape (or a warm start v0)."""
    if v0 is None:
        v0 = _random_start(shape, dtype, device, seed)
    return top_singular_value(matvec, rmatvec, v0, event_dims, **kw)


def jacobian_norm(f: Callable[[Tensor], Tensor], X: Tensor, tol: float = 1e-10, iters: int = 2000,
                  batch_dims: Optional[int] = None, seed: int = 0, v0: Optional[Tensor] = None,
                  return_info: bool = False, on_nonconvergence: str = "warn"):
    """Local Lipschitz constant ||J_f(X)|| (Frobenius in, Frobenius out) by power iteration on J^T J.

    X: (n, d) or (B, n, d) (generally (*batch, *event) with `batch_dims` leading batch axes, default X.dim()-2).
    f must treat batch elements independently (every attention layer does). Uses torch.func.jvp for J u
    (element [1]: element [0] is f(X), the pitfall of the Castin et al. code, MATH.md §3) and a single
    torch.func.vjp linearization for J^T w. Returns (*batch,) values, or (values, PowerResult) if return_info.
    """
    if not isinstance(X, torch.Tensor) or not X.is_floating_point():
        raise ValueError("X must be a floating torch.Tensor")
    if not torch.isfinite(X).all():
        raise ValueError("X contains NaN or inf values")
    if batch_dims is None:
        batch_dims = max(X.dim() - 2, 0)
    event_dims = X.dim() - batch_dims
    if event_dims < 1:
        raise ValueError(f"batch_dims = {batch_dims} leaves no event axes for X of shape {tuple(X.shape)}")
    X = X.detach()
    _, vjp_fn = torch.func.vjp(f, X)

    def matvec(u):
        return torch.func.jvp(f, (X,), (u,))[1]

    def rmatvec(w):
        return vjp_fn(w)[0]

    res = operator_norm(matvec, rmatvec, X.shape, event_dims, X.dtype, X.device, seed, v0,
                        iters=iters, tol=tol, on_nonconvergence=on_nonconvergence)
    return (res.value, res) if return_info else res.value


def paper_estimator(f: Callable[[Tensor], Tensor], X: Tensor, iters: int = 50, seed: int = 0) -> Tensor:
    """The estimator of Castin et al.'s public code (MATH.md §3), kept to quantify its bias.

    It takes torch.func.jvp(...)[0] (= f(X)) in place of J u, so each step computes v <- J^T f(X) and it
    reports sqrt(||J^T f(X)||) rather than ||J||. Batched like jacobian_norm: (*batch, n, d) -> (*batch,).
    """
    X = X.detach()
    event_dims = 2
    _, vjp_fn = torch.func.vjp(f, X)
    v = _random_start(X.shape, X.dtype, X.device, seed)
    lam = torch.zeros(X.shape[: X.dim() - event_dims], dtype=X.dtype, device=X.device)
    for _ in range(iters):
        v = v / _bcast(_norm(v, event_dims).clamp_min(1e-300), event_dims)
        Jv = torch.func.jvp(f, (X,), (v,))[0]  # the defect: this is f(X), not J v
        v = vjp_fn(Jv)[0]
        lam = _norm(v, event_dims)
    return lam.sqrt()


def dense_jacobian(f: Callable[[Tensor], Tensor], X: Tensor) -> Tensor:
    """Explicit Jacobian of f at a single X (n, d): (n*d_out, n*d) with row-major vec (test oracle)."""
    J = torch.func.jacrev(f)(X)  # (n, d_out, n, d)
    return J.reshape(f(X).numel(), X.numel())
