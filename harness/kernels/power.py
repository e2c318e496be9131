"""Top singular value of matrix-free operators (Lanczos or power iteration on A^T A), Jacobian norms via torch.func.

The operator acts on tensors of shape (*batch, *event); each batch element is its own operator and gets its
own singular value, convergence flag and vector. Non-convergence is reported (flag + warning), never hidden.
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from harness.kernels.krylov import CallableGram, lanczos
from harness.kernels.linalg import all_finite, safe_norm
from harness.settings import ITERS, KRYLOV, PAPER_ESTIMATOR_ITERS, SUSPICIOUS_STEPS, norm_tol

Tensor = torch.Tensor


class NonConvergenceWarning(RuntimeWarning):
    """The iteration stopped at `iters` before reaching `tol`, or produced a non-finite value, for some element."""


@dataclass
class PowerResult:
    value: Tensor  # (*batch,) top singular value (a Ritz value: a lower estimate)
    converged: Tensor  # (*batch,) bool (False for every non-finite value)
    vector: Tensor  # (*batch, *event) top right singular vector (unit norm)
    iters: int  # operator (A^T A) applications of the batch
    rel_change: Tensor  # (*batch,) last relative residual (Lanczos) or change (power)
    upper: Optional[Tensor] = None  # (*batch,) certified upper estimate (probability >= 1 - fail_prob), see krylov
    fail_prob: Optional[float] = None  # failure probability of `upper` (over the random start)
    restarted: Optional[Tensor] = None  # (*batch,) bool: a suspicious caller start was checked from a random one
    steps: Optional[Tensor] = None  # (*batch,) products spent on each operator (Lanczos: deflation stops early)
    info: Optional[dict] = None  # how it was computed where a caller chose among routes (kernels.layer.truth)


def _norm(v: Tensor, event_dims: int) -> Tensor:
    """Frobenius norm over the trailing `event_dims` axes: (*batch, *event) -> (*batch,), overflow-free."""
    return safe_norm(v.flatten(start_dim=v.dim() - event_dims), -1) if event_dims else v.abs()


def _bcast(s: Tensor, event_dims: int) -> Tensor:
    return s.reshape(*s.shape, *([1] * event_dims))


def _random_start(shape, dtype, device, seed: int) -> Tensor:
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return torch.randn(shape, dtype=dtype, device=device, generator=g)


def check_args(iters, tol, on_nonconvergence) -> None:
    """One clear ValueError for a bad iteration cap, tolerance or on_nonconvergence policy (shared by every solver
    front door: top_singular_value, lofast's exact norms)."""
    if iters < 1:
        raise ValueError(f"iters must be >= 1, got {iters}")
    if tol is not None and tol <= 0:
        raise ValueError(f"tol must be > 0, got {tol}")
    if on_nonconvergence not in ("warn", "raise", "ignore"):
        raise ValueError(f"on_nonconvergence must be 'warn', 'raise' or 'ignore', got {on_nonconvergence!r}")


def report_nonconvergence(done: Tensor, rel: Tensor, iters: int, tol: float, on_nonconvergence: str,
                          what: str) -> None:
    """Warn (NonConvergenceWarning), raise (RuntimeError) or stay silent, per on_nonconvergence, when some element
    of `done` is False: how many, the largest residual/change `rel` against tol, and how many are non-finite."""
    if bool(done.all()):
        return
    bad = ~done
    msg = (f"{what} did not converge for {int(bad.sum())} of {done.numel()} operators after "
           f"{iters} iterations (max relative residual/change {float(rel[bad].max()):.2e} > tol {tol:.1e}")
    nonfinite = int((~torch.isfinite(rel[bad])).sum())
    msg += f"; {nonfinite} non-finite)" if nonfinite else ")"
    if on_nonconvergence == "raise":
        raise RuntimeError(msg)
    if on_nonconvergence == "warn":
        warnings.warn(msg, NonConvergenceWarning, stacklevel=3)


def default_tol(dtype) -> float:
    """Relative tolerance of the norms inside bounds in a dtype: harness.settings.norm_tol (1e-10 for float64,
    1e-5 for float32/lower; the reasons are there)."""
    return norm_tol(dtype)


def top_singular_value(matvec: Callable[[Tensor], Tensor], rmatvec: Callable[[Tensor], Tensor], v0: Tensor,
                       event_dims: int, iters: int = ITERS, tol: Optional[float] = None,
                       on_nonconvergence: str = "warn", method: str = "lanczos", krylov: int = KRYLOV,
                       random_start: bool = False, fail_prob: Optional[float] = None, seed: int = 0,
                       ) -> PowerResult:
    """sigma_max of a batched matrix-free operator A from matvec/rmatvec only (A^T A is never formed).

    matvec: (*batch, *event_in) -> (*batch, *event_out); rmatvec its adjoint. v0: (*batch, *event_in) start.
    method="lanczos" (default): thick-restart Lanczos on A^T A / c^2 (harness.kernels.krylov; c = ||A v0|| keeps
    every finite operator finite), basis of `krylov` vectors; stops when the relative Ritz residual
    ||A^T A y - theta y|| / theta < tol, which bounds the relative error of sigma^2 by tol (Weyl).
    method="power": plain power iteration, stopping on the relative change of the Rayleigh quotient (error about
    tol * r / (1 - r), r = (s2/s1)^2: fine on well-separated spectra, slow on clustered ones).
    `iters` caps operator applications (A^T A products). tol=None picks default_tol(dtype).
    Non-finite results are never flagged converged. on_nonconvergence: "warn" (default), "raise" or "ignore".

    Start-vector deficiency: a start with no component along the top singular vector (e.g. another singular
    vector) converges to a smaller singular value. Unless random_start=True, an operator whose start converges
    within SUSPICIOUS_STEPS products is rerun from a Gaussian start (seed) and the larger value kept
    (`restarted` marks it). A deficient start that converges more slowly is not detected: pass a random start.
    fail_prob (Lanczos, random_start=True only): also return `upper`, an upper estimate holding with probability
    >= 1 - fail_prob over the start vector (Kuczynski-Wozniakowski, docs/math.md §4).
    """
    check_args(iters, tol, on_nonconvergence)
    if tol is None:
        tol = default_tol(v0.dtype)
    if method == "power":
        return _power(matvec, rmatvec, v0, event_dims, iters, tol, on_nonconvergence)
    if method != "lanczos":
        raise ValueError(f"method must be 'lanczos' or 'power', got {method!r}")
    res = _lanczos(matvec, rmatvec, v0, event_dims, iters, tol, max(2, krylov), fail_prob if random_start else None)
    if not random_start:
        sus = res.converged & (res.steps <= SUSPICIOUS_STEPS)
        if bool(sus.any()):
            r2 = _lanczos(matvec, rmatvec, _random_start(v0.shape, v0.dtype, v0.device, seed), event_dims, iters,
                          tol, max(2, krylov), None)
            better = sus & (r2.value > res.value)
            res.value = torch.where(better, r2.value, res.value)
            res.vector = torch.where(_bcast(better, event_dims), r2.vector, res.vector)
            res.converged = torch.where(sus, r2.converged, res.converged)
            res.rel_change = torch.where(sus, r2.rel_change, res.rel_change)
            res.iters += r2.iters
            res.restarted = sus
    report_nonconvergence(res.converged, res.rel_change, res.iters, tol, on_nonconvergence, "Lanczos iteration")
    return res


def _lanczos(matvec, rmatvec, v0, event_dims, iters, tol, krylov, fail_prob) -> PowerResult:
    """Thick-restart Lanczos on the scaled A^T A (see top_singular_value); results reshaped to the batch."""
    batch_shape = v0.shape[: v0.dim() - event_dims]
    event_shape = v0.shape[v0.dim() - event_dims:]
    Bn = math.prod(batch_shape)
    x0 = v0.reshape(Bn, -1)
    x0 = x0 / safe_norm(x0).clamp_min(torch.finfo(v0.dtype).tiny)[:, None]
    op = CallableGram(matvec, rmatvec, batch_shape, event_shape, x0)
    r = lanczos(op, x0, iters=iters, tol=tol, krylov=krylov, fail_prob=fail_prob)
    out = PowerResult(r.value.reshape(batch_shape), r.converged.reshape(batch_shape),
                      r.vector.reshape(*batch_shape, *event_shape), r.products, r.rel.reshape(batch_shape),
                      None if r.upper is None else r.upper.reshape(batch_shape), fail_prob,
                      steps=r.steps.reshape(batch_shape))
    return out


def _power(matvec, rmatvec, v0, event_dims, iters, tol, on_nonconvergence) -> PowerResult:
    """Plain power iteration on A^T A / c^2, c = ||A v0|| for the unit start (see top_singular_value)."""
    batch_shape = v0.shape[: v0.dim() - event_dims]
    tiny = torch.finfo(v0.dtype).tiny
    v = v0 / _bcast(_norm(v0, event_dims).clamp_min(tiny), event_dims)
    u0 = matvec(v)
    c = _norm(u0, u0.dim() - len(batch_shape))
    c = torch.where(torch.isfinite(c) & (c > 0), c, torch.ones_like(c))
    lam = torch.zeros(batch_shape, dtype=v0.dtype, device=v0.device)
    done = torch.zeros(batch_shape, dtype=torch.bool, device=v0.device)
    rel = torch.full(batch_shape, float("inf"), dtype=v0.dtype, device=v0.device)
    it = 0
    for it in range(1, iters + 1):
        u = matvec(v)
        u = u / _bcast(c, u.dim() - len(batch_shape))
        w = rmatvec(u)
        w = w / _bcast(c, event_dims)  # (*batch, *event) = A^T A v / c^2
        lam_new = (w * v).flatten(start_dim=v.dim() - event_dims).sum(-1) if event_dims else w * v  # Rayleigh
        nrm = _norm(w, event_dims)
        zero = nrm <= tiny
        rel_new = (lam_new - lam).abs() / lam_new.abs().clamp_min(tiny)
        rel_new = torch.where(zero, torch.zeros_like(rel_new), rel_new)
        rel_new = torch.where(torch.isfinite(lam_new), rel_new, torch.full_like(rel_new, float("inf")))
        # freeze elements that have converged: keep their value and vector
        upd = ~done
        lam = torch.where(upd, lam_new, lam)
        rel = torch.where(upd, rel_new, rel)
        v_new = torch.where(_bcast(zero, event_dims), v, w / _bcast(nrm.clamp_min(tiny), event_dims))
        v = torch.where(_bcast(upd, event_dims), v_new, v)
        done = done | (upd & (rel_new < tol) & (it > 1)) | zero
        if bool(done.all()):
            break
    value = lam.clamp_min(0).sqrt() * c
    done = done & torch.isfinite(value)
    report_nonconvergence(done, rel, it, tol, on_nonconvergence, "power iteration")
    return PowerResult(value, done, v, it, rel)


def operator_norm(matvec, rmatvec, shape, event_dims: int, dtype=torch.float64, device=None, seed: int = 0,
                  v0: Optional[Tensor] = None, **kw) -> PowerResult:
    """top_singular_value from a seeded Gaussian start of the given (*batch, *event) shape (or a warm start v0).

    With the seeded Gaussian start, fail_prob=... gives certified upper estimates (PowerResult.upper)."""
    random_start = v0 is None
    if v0 is None:
        v0 = _random_start(shape, dtype, device, seed)
    return top_singular_value(matvec, rmatvec, v0, event_dims, random_start=random_start, seed=seed + 1, **kw)


def jacobian_norm(f: Callable[[Tensor], Tensor], X: Tensor, tol: Optional[float] = None, iters: int = ITERS,
                  batch_dims: Optional[int] = None, seed: int = 0, v0: Optional[Tensor] = None,
                  return_info: bool = False, on_nonconvergence: str = "warn", method: str = "lanczos",
                  fail_prob: Optional[float] = None):
    """Local Lipschitz constant ||J_f(X)|| (Frobenius in, Frobenius out) by Lanczos (or power) iteration on J^T J.

    X: (n, d) or (B, n, d) (generally (*batch, *event) with `batch_dims` leading batch axes, default X.dim()-2).
    f must treat batch elements independently (every attention layer does). Uses torch.func.jvp for J u
    (element [1]: element [0] is f(X), the pitfall of the Castin et al. code, docs/math.md §3) and a single
    torch.func.vjp linearization for J^T w. Returns (*batch,) values, or (values, PowerResult) if return_info.
    fail_prob (seeded start, v0=None): PowerResult.upper holds with probability >= 1 - fail_prob (krylov.kw_epsilon).
    """
    if not isinstance(X, torch.Tensor) or not X.is_floating_point():
        raise ValueError("X must be a floating torch.Tensor")
    if not all_finite(X):
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
                        iters=iters, tol=tol, on_nonconvergence=on_nonconvergence, method=method, fail_prob=fail_prob)
    return (res.value, res) if return_info else res.value


def paper_estimator(f: Callable[[Tensor], Tensor], X: Tensor, iters: int = PAPER_ESTIMATOR_ITERS, seed: int = 0
                    ) -> Tensor:
    """The estimator of Castin et al.'s public code (docs/math.md §3), kept to quantify its bias.

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
