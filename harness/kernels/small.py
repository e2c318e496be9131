"""Lanczos for small problems on the CPU in NumPy: the same contract as `harness.kernels.krylov.lanczos`, without
torch's per-operation dispatch.

Why: at n = 32, d = 64 one input's zeta or ||M_l|| is a few milliseconds of arithmetic, and the torch solver spends
most of it dispatching some 30 small operations per Lanczos step (about 5 us each) beside a product that itself
costs tens of microseconds (docs/notes/kernels.md, "Where the time goes"). The same iteration written on NumPy
arrays pays about 1 us per operation, and the reduced operators' products (`MGram`, `ZetaGram`) are written here
on NumPy views of their factors (zero-copy), so a step costs a handful of small BLAS calls.

What it computes is what `krylov.lanczos` computes for a batch that converges within its first cycle, row for
row: Lanczos from the same unit start, the active rows in lockstep (one step of each at a time), two classical
Gram-Schmidt passes per step ("twice is enough"), the same relative Ritz residual test (beta |y_k| / theta < tol,
never before `min_steps`) on the same schedule (`lanczos_steps.next_check`, over the active rows, and at once on
a breakdown or a non-finite value), the same breakdown rule (beta <= 100 eps ||H||, or a basis spanning the
space) and the same outputs through `krylov.Outputs` (sigma = sqrt(theta) c; the Kuczynski-Wozniakowski estimate
from the first cycle's Krylov dimension, padded for rounding). So every row takes the torch solver's steps and
gets its certificate, and the values agree to rounding: the projected matrix is kept tridiagonal here (the
reorthogonalization coefficients off the tridiagonal are at rounding level). Tested against the torch solver and
against dense float64 singular values.

It does not restart: rows still unconverged when the basis (`krylov` vectors) is full are handed to
`krylov.lanczos` from their own start, which then decides their results: a slow problem gets the thick-restart
solver's answer, steps and certificate (with the test schedule of the rows handed over), at the cost of its first
cycle twice (`products` counts both). Where the torch solver would reorthogonalize partially (large spaces or
bases) this module hands the whole batch to it.

`applies(op, x0)` says where it is meant to run: reduced LoFAST operators on the CPU, float32 / float64, dimension
<= SMALL_MAX_DIM and at most SMALL_MAX_BATCH operators (larger batches amortize torch's dispatch over the batch,
and larger spaces are bound by their products, where torch's kernels are as fast). `solve` picks the solver by
that rule.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, List, Optional

import numpy as np
import torch

from harness.kernels.krylov import (GramOperator, LanczosResult, Outputs, basis_size, check_options, is_lean,
                                    settle_early, unit_start)
from harness.kernels.krylov import lanczos as restarted_lanczos
from harness.kernels.lanczos_steps import next_check, routine, stemr_top
from harness.kernels.operators import MGram, ZetaGram
from harness.settings import CHECK_EVERY, ITERS, KRYLOV, MIN_STEPS, NORM_TOL, PARTIAL_MIN_DIM, SMALL_MAX_BATCH

Tensor = torch.Tensor

SMALL_MAX_DIM = PARTIAL_MIN_DIM - 1  # larger N: products dominate, and the torch solver reorthogonalizes partially
# SMALL_MAX_BATCH (harness.settings): operators per call above which the batched torch solver amortizes its dispatch


def applies(op: GramOperator, x0: Tensor) -> bool:
    """Whether the NumPy solver is the faster one for this batch (module docstring)."""
    B, N = x0.shape
    return _handles(op, x0) and N <= SMALL_MAX_DIM and B <= SMALL_MAX_BATCH


def _handles(op: GramOperator, x0: Tensor) -> bool:
    """Operators this module has NumPy products for, on the CPU, in the start's float dtype (a mismatch goes to
    the torch solver, which refuses it)."""
    factor = op.K if isinstance(op, MGram) else op.P if isinstance(op, ZetaGram) else None
    return (factor is not None and x0.shape[0] > 0 and x0.device.type == "cpu" and factor.device.type == "cpu"
            and x0.dtype in (torch.float32, torch.float64) and factor.dtype == x0.dtype)


def solve(op: GramOperator, x0: Tensor, **opts) -> LanczosResult:
    """`lanczos` below where it `applies`, else `krylov.lanczos`; same arguments and result."""
    return (lanczos if applies(op, x0) else restarted_lanczos)(op, x0, **opts)


def _products(op: GramOperator, dt) -> List[Callable[[np.ndarray], np.ndarray]]:
    """The scaled Gram product of each operator of the batch on flat NumPy vectors (N,) -> (N,), on zero-copy
    views of the operator's factors: the formulas of `MGram.gram` and `ZetaGram.gram`, one operator at a time."""
    as_np = lambda t: t.detach().numpy().astype(dt, copy=False)
    if isinstance(op, MGram):
        n, r, K, Q = op.n, op.r, as_np(op.K), as_np(op.Q)
        if op.side == "domain":
            C, QK = as_np(op.C), np.concatenate([Q, K], -1)  # QK: [Q', K'] (B, n, 2r)

            def m_domain(v, K, Q, C, QK, T):  # T: (2r, r) scratch for [Z^T K'; Z^T Q']
                Z = v.reshape(n, r)
                np.matmul(Z.T, K, out=T[:r])
                np.matmul(Z.T, Q, out=T[r:])
                out = Z @ C
                out += QK @ T  # Q' Z^T K' + K' Z^T Q'
                return out.ravel()
            return [partial(m_domain, K=K[i], Q=Q[i], C=C[i], QK=QK[i], T=np.empty((2 * r, r), dt))
                    for i in range(len(K))]

        def m_codomain(v, K, Q):
            S = v.reshape(n, n)
            Y = S @ K + S.T @ Q
            return (Y @ K.T + Q @ Y.T).ravel()
        return [partial(m_codomain, K=K[i], Q=Q[i]) for i in range(len(K))]
    n, d, h, dh = op.n, op.d, op.h, op.dh
    P, Wv, Wo = as_np(op.P), as_np(op.Wv), as_np(op.Wo)
    PT = np.ascontiguousarray(P.transpose(0, 1, 3, 2))
    WvT, WoT = np.ascontiguousarray(Wv.T), np.ascontiguousarray(Wo.T)
    res = op.res.detach().reshape(-1).tolist()  # (B,): 1 / scale with the residual, else 0

    def zeta(v, P, PT, res, heads, proj, T, tmp, by_head, proj_by_head):
        # scratch: heads, proj (n, h dh); T, tmp (n, d); by_head, proj_by_head: (h, n, dh) strided views of heads and
        # proj, each head's columns. Every intermediate goes to the scratch (the per-head products write their
        # columns of `heads` through by_head), so the result is the product's only allocation and no copy rejoins
        # the heads: the same BLAS calls, the same values
        G = v.reshape(n, d)
        np.matmul(G, Wv, out=proj)
        np.matmul(P, proj_by_head, out=by_head)
        np.matmul(heads, Wo, out=T)  # the heads' outputs summed
        np.multiply(G, res, out=tmp)
        T += tmp
        np.matmul(T, WoT, out=proj)
        np.matmul(PT, proj_by_head, out=by_head)
        out = heads @ WvT
        np.multiply(T, res, out=tmp)
        out += tmp
        return out.ravel()

    def scratch():
        heads, proj = np.empty((n, h * dh), dt), np.empty((n, h * dh), dt)
        return dict(heads=heads, proj=proj, T=np.empty((n, d), dt), tmp=np.empty((n, d), dt),
                    by_head=heads.reshape(n, h, dh).transpose(1, 0, 2),
                    proj_by_head=proj.reshape(n, h, dh).transpose(1, 0, 2))
    return [partial(zeta, P=P[i], PT=PT[i], res=res[i], **scratch()) for i in range(len(P))]


def lanczos(op: GramOperator, x0: Tensor, iters: int = ITERS, tol: float = NORM_TOL["float64"], krylov: int = KRYLOV,
            keep: Optional[int] = None, check_every: int = CHECK_EVERY, min_steps: int = MIN_STEPS,
            fail_prob: Optional[float] = None, reorth: str = "auto") -> LanczosResult:
    """`krylov.lanczos`'s arguments and result for an `MGram` or `ZetaGram` batch on the CPU (module docstring);
    anything else goes to `krylov.lanczos`. `keep` and `reorth` reach the restarted solver only, for the rows it
    takes over: this one reorthogonalizes fully, as the torch solver does in spaces this small."""
    check_options(krylov, reorth)
    B, N = x0.shape
    m = basis_size(krylov, iters, N)
    if not _handles(op, x0) or is_lean(B, m, N, x0.element_size()) or reorth == "partial":  # the torch solver's
        return restarted_lanczos(op, x0, iters, tol, krylov, keep, check_every, min_steps, fail_prob, reorth)
    x = unit_start(x0.detach()).numpy()
    rec, products = _iterate(_products(op, x.dtype), x, m, iters, tol, check_every, min(min_steps, N))
    out = Outputs.of(**{name: torch.from_numpy(arr) for name, arr in rec.items()})
    value, conv, vec, steps, rel, upper, kw, early = out.result(op.scale.detach().to(x0.dtype), N, m, fail_prob)
    passes = 2 * products
    full = m < iters and int(rec["steps"].max()) == m  # some row filled the basis with products left
    handed = (~conv & (steps == m) & torch.isfinite(value)) if full else None
    if full and bool(handed.any()):  # the thick-restart solver decides these rows, from their own start
        r = restarted_lanczos(op.select(handed), x0[handed], iters, tol, krylov, keep, check_every, min_steps,
                              fail_prob, reorth)
        for mine, theirs in ((value, r.value), (conv, r.converged), (vec, r.vector), (rel, r.rel), (steps, r.steps)):
            mine[handed] = theirs
        if fail_prob is not None:
            upper[handed], kw[handed] = r.upper, r.kw_eps
        early[handed] = False  # settled by the thick-restart solver already
        products, passes = products + r.products, passes + r.passes  # the work done: the first cycle twice
    res = LanczosResult(value, conv, vec, steps, rel, upper, kw, products, passes, early)
    settle_early(op, x0.detach(), res, fail_prob, iters)
    return res


def _iterate(grams: List[Callable], x: np.ndarray, m: int, iters: int, tol: float, check_every: int,
             min_steps: int):
    """The first cycle, every active row one step at a time (so the test schedule is the batch's, as in the torch
    solver). Returns the per-row records for `Outputs` (theta, conv, vec, steps, rel, first, broke) and the
    products of the shrinking batch. Without restarts a row's products equal its Krylov dimension k."""
    B, N = x.shape
    dt = x.dtype
    eps, tiny = float(np.finfo(dt).eps), float(np.finfo(dt).tiny)
    rec = dict(theta=np.zeros(B, dt), conv=np.zeros(B, bool), vec=np.zeros((B, N), dt), steps=np.zeros(B, np.int64),
               rel=np.full(B, np.inf, dt), first=np.zeros(B, np.int64), broke=np.zeros(B, bool))
    V = np.empty((B, m + 1, N), dt)  # row k is written before it is read (no zero-filling of the whole basis)
    V[:, 0] = x
    gemv = routine("gemv", dt.char)  # BLAS: w -= V^T c in one call, with no temporary
    a, b = np.zeros((B, m), dt), np.zeros((B, m), dt)
    hmax, beta = [0.0] * B, [0.0] * B
    res: List[Optional[np.ndarray]] = [None] * B
    active = list(range(B))
    k = last_k = 0
    check_at = max(check_every, min_steps)
    last_rel = np.full(B, np.inf, dt)
    while active and k < iters:
        odd = False
        for i in active:
            w = grams[i](V[i, k])
            Vt = V[i, :k + 1].T  # (N, k + 1), Fortran-ordered: BLAS reads it in place
            c = gemv(1.0, Vt, w, trans=1)  # classical Gram-Schmidt, twice: c = V_k w, w -= V_k^T c in place
            gemv(-1.0, Vt, c, beta=1.0, y=w, overwrite_y=1)
            c2 = gemv(1.0, Vt, w, trans=1)
            gemv(-1.0, Vt, c2, beta=1.0, y=w, overwrite_y=1)
            c += c2
            a[i, k] = c[k]
            bt = math.sqrt(float(w @ w))  # NaN or inf when w is not finite (the scaled spectrum lies in [0, 1])
            hm = max(hmax[i], float(np.abs(c).max()))
            odd = odd or not bt > 100 * eps * max(hm, bt, tiny)
            hmax[i], beta[i], res[i] = (max(hm, bt) if bt == bt else hm), bt, w
            b[i, k] = bt
        k += 1
        full, last = k == m, k >= iters
        if full or last or odd or k >= check_at or k >= N:
            for i in list(active):
                if _test(i, rec, a[i, :k], b[i, :k - 1], beta[i], hmax[i], V[i, :k], k, N, tol, min_steps, eps,
                         tiny, last or full):
                    active.remove(i)
            if last or not active:
                break
            check_at = next_check(k, rec["rel"][active], last_rel[active], last_k, tol, check_every, min_steps, k)
            last_k, last_rel = k, rec["rel"].copy()
        for i in active:
            np.divide(res[i], max(beta[i], tiny), out=V[i, k])
    return rec, k


def _test(i: int, rec: dict, a, b, beta: float, hmax: float, Vk, k: int, N: int, tol: float, min_steps: int,
          eps: float, tiny: float, stop: bool) -> bool:
    """The convergence test of row i (krylov's `convergence_test` and `Outputs.record`): records it; True when the
    row finishes (converged, broken down, non-finite, or `stop`: out of products or basis), with its Ritz vector."""
    top = stemr_top(a, b, 1) if np.isfinite(a).all() and np.isfinite(b).all() else None
    th, y = (float(top[0][0]), top[1][:, 0]) if top is not None else (math.nan, np.full(len(a), np.nan))
    broke = beta <= 100 * eps * max(hmax, tiny) or k >= N
    rel = 0.0 if broke or not th > 0 else beta * abs(float(y[-1])) / max(th, tiny)
    finite = math.isfinite(th) and math.isfinite(beta) and math.isfinite(rel)
    conv = finite and ((rel < tol and k >= min_steps) or broke)
    rec["theta"][i], rec["steps"][i], rec["first"][i] = th, k, k
    rec["rel"][i], rec["conv"][i], rec["broke"][i] = (rel if finite else math.inf), conv, broke and finite
    if not (conv or not finite or broke or stop):
        return False
    vec = y.astype(Vk.dtype) @ Vk
    rec["vec"][i] = vec / max(math.sqrt(float(vec @ vec)), tiny)
    return True
