"""Top singular value of matrix-free operators (Lanczos or power iteration on A^T A), Jacobian norms via torch.func.

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


def _check_args(iters, tol, on_nonconvergence):
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if tol is not None and tol <= 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if on_nonconvergence not in ("warn", "raise", "ignore"):
        raise ValueError(f"on_nonconvergence must be 'warn', 'raise' or 'ignore', got {on_nonconvergence!r}")


def _report(done: Tensor, rel: Tensor, iters: int, tol: float, on_nonconvergence: str, what: str) -> None:
    if bool(done.all()):
        return
    msg = (f"{what} did not converge for {int((~done).sum())} of {done.numel()} operators after "
           f"{iters} iterations (max relative residual/change {float(rel[~done].max()):.2e} > tol {tol:.1e})")
    if on_nonconvergence == "raise":
        raise RuntimeError(msg)
    if on_nonconvergence == "warn":
        warnings.warn(msg, NonConvergenceWarning, stacklevel=3)


def default_tol(dtype) -> float:
    """Relative tolerance reachable in a dtype: 1e-10 for float64, 1e-5 for float32/lower."""
    return 1e-10 if dtype == torch.float64 else 1e-5


def top_singular_value(matvec: Callable[[Tensor], Tensor], rmatvec: Callable[[Tensor], Tensor], v0: Tensor,
                       event_dims: int, iters: int = 2000, tol: Optional[float] = None,
                       on_nonconvergence: str = "warn", method: str = "lanczos", krylov: int = 40,
                       ) -> PowerResult:
    """sigma_max of a batched matrix-free operator A from matvec/rmatvec only (A^T A is never formed).

    matvec: (*batch, *event_in) -> (*batch, *event_out); rmatvec its adjoint. v0: (*batch, *event_in) start.
    method="lanczos" (default): Lanczos on A^T A with full reorthogonalization, restarted from the Ritz vector
    every `krylov` steps; stops when the relative Ritz residual ||A^T A y - theta y|| / theta < tol, which
    bounds the relative error of sigma^2 by tol (Weyl). method="power": plain power iteration
    v <- A^T A v / ||A^T A v||, stopping on the relative change of the Rayleigh quotient (error about
    tol * r / (1 - r), r = (s2/s1)^2: fine on well-separated spectra, slow on clustered ones).
    `iters` caps operator applications (A^T A products). tol=None picks default_tol(dtype).
    on_nonconvergence: "warn" (default), "raise" or "ignore"; the per-element flag is returned in every case.
    """
    _check_args(iters, tol, on_nonconvergence)
    if tol is None:
        tol = default_tol(v0.dtype)
    if method == "power":
        return _power(matvec, rmatvec, v0, event_dims, iters, tol, on_nonconvergence)
    if method != "lanczos":
        raise ValueError(f"method must be 'lanczos' or 'power', got {method!r}")
    return _lanczos(matvec, rmatvec, v0, event_dims, iters, tol, on_nonconvergence, max(2, krylov))


def _lanczos(matvec, rmatvec, v0, event_dims, iters, tol, on_nonconvergence, krylov) -> PowerResult:
    """Batched restarted Lanczos on M = A^T A (see top_singular_value)."""
    batch_shape = v0.shape[: v0.dim() - event_dims]
    event_shape = v0.shape[v0.dim() - event_dims:]
    tiny = torch.finfo(v0.dtype).tiny
    eps_mach = torch.finfo(v0.dtype).eps
    flat = lambda t: t.reshape(*batch_shape, -1)  # (*batch, N)
    unflat = lambda t: t.reshape(*batch_shape, *event_shape)
    M = lambda v: flat(rmatvec(matvec(unflat(v))))

    x = flat(v0)
    x = x / x.norm(dim=-1, keepdim=True).clamp_min(tiny)
    theta = torch.zeros(batch_shape, dtype=v0.dtype, device=v0.device)
    rel = torch.full(batch_shape, float("inf"), dtype=v0.dtype, device=v0.device)
    done = torch.zeros(batch_shape, dtype=torch.bool, device=v0.device)
    applied = 0
    steps = min(krylov, iters)
    basis = torch.empty(*batch_shape, steps, x.shape[-1], dtype=v0.dtype, device=v0.device)  # (*batch, k, N)
    while applied < iters and not bool(done.all()):
        basis[..., 0, :] = x
        alphas, betas = [], []
        for j in range(min(krylov, iters - applied)):
            vj = basis[..., j, :]
            w = M(vj)  # (*batch, N)
            applied += 1
            a = (w * vj).sum(-1)
            w = w - a[..., None] * vj
            if j > 0:
                w = w - betas[-1][..., None] * basis[..., j - 1, :]
            V = basis[..., : j + 1, :]  # (*batch, j+1, N) view, no copy
            for _ in range(2):  # full reorthogonalization, twice is enough
                w = w - ((V @ w[..., None])[..., 0][..., None, :] @ V)[..., 0, :]
            b = w.norm(dim=-1)
            alphas.append(a)
            betas.append(b)
            k = len(alphas)
            T = torch.diag_embed(torch.stack(alphas, -1))
            if k > 1:
                off = torch.stack(betas[:-1], -1)
                T = T + torch.diag_embed(off, 1) + torch.diag_embed(off, -1)
            evals, evecs = torch.linalg.eigh(T)  # ascending
            th = evals[..., -1].clamp_min(0)
            y = evecs[..., -1]  # (*batch, k)
            res = b * y[..., -1].abs()
            scale = th.clamp_min(tiny)
            rel_new = torch.where(th > 0, res / scale, torch.zeros_like(res))
            # breakdown (invariant subspace found) or zero operator: exact
            broke = b <= 100 * eps_mach * torch.stack(alphas, -1).abs().amax(-1).clamp_min(tiny)
            conv = (rel_new < tol) | broke
            upd = ~done
            theta = torch.where(upd, th, theta)
            rel = torch.where(upd, torch.where(broke, torch.zeros_like(rel_new), rel_new), rel)
            ritz = (y[..., None, :] @ V)[..., 0, :]  # (*batch, N)
            ritz = ritz / ritz.norm(dim=-1, keepdim=True).clamp_min(tiny)
            x = torch.where(upd[..., None], ritz, x)
            done = done | (upd & conv)
            if bool(done.all()) or bool(broke.all()) or j + 1 >= steps:
                break
            nxt = w / b[..., None].clamp_min(tiny)
            basis[..., j + 1, :] = torch.where(broke[..., None], torch.zeros_like(nxt), nxt)
    _report(done, rel, applied, tol, on_nonconvergence, "Lanczos iteration")
    return PowerResult(theta.sqrt(), done, unflat(x), applied, rel)


def _power(matvec, rmatvec, v0, event_dims, iters, tol, on_nonconvergence) -> PowerResult:
    """Plain power iteration on A^T A (see top_singular_value)."""
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
    _report(done, rel, it, tol, on_nonconvergence, "power iteration")
    return PowerResult(lam.clamp_min(0).sqrt(), done, v, it, rel)


def operator_norm(matvec, rmatvec, shape, event_dims: int, dtype=torch.float64, device=None, seed: int = 0,
                  v0: Optional[Tensor] = None, **kw) -> PowerResult:
    """top_singular_value from a seeded Gaussian start of the given (*batch, *event) shape (or a warm start v0)."""
    if v0 is None:
        v0 = _random_start(shape, dtype, device, seed)
    return top_singular_value(matvec, rmatvec, v0, event_dims, **kw)


def jacobian_norm(f: Callable[[Tensor], Tensor], X: Tensor, tol: Optional[float] = None, iters: int = 2000,
                  batch_dims: Optional[int] = None, seed: int = 0, v0: Optional[Tensor] = None,
                  return_info: bool = False, on_nonconvergence: str = "warn", method: str = "lanczos"):
    """Local Lipschitz constant ||J_f(X)|| (Frobenius in, Frobenius out) by Lanczos (or power) iteration on J^T J.

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
                        iters=iters, tol=tol, on_nonconvergence=on_nonconvergence, method=method)
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
