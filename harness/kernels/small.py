"""Lanczos for small problems on the CPU in NumPy: the same contract as `harness.kernels.krylov.lanczos`, without
torch's per-operation dispatch.

Why: at n = 32, d = 64 one input's zeta or ||M_l|| is a few milliseconds of arithmetic, and the torch solver spends
most of it dispatching some 30 small operations per Lanczos step (about 5 us each) beside a product that itself
costs tens of microseconds (docs/notes/kernels.md, "Where the time goes"). The same iteration written on NumPy
arrays pays about 1 us per operation, and the reduced operators' products (`MGram`, `ZetaGram`) are written here
on NumPy views of their factors (zero-copy), so a step costs a handful of small BLAS calls.

What it computes is what `krylov.lanczos` computes for a run that converges within its first cycle: Lanczos from
the same unit start, two classical Gram-Schmidt passes per step ("twice is enough"), the same relative Ritz
residual test (beta |y_k| / theta < tol, never before `min_steps`, on the schedule of `lanczos_steps.next_check`,
and at once on a breakdown or a non-finite value), the same breakdown rule (beta <= 100 eps ||H||, or a basis
spanning the space) and the same outputs through `krylov.Outputs` (sigma = sqrt(theta) c; the Kuczynski-Wozniakowski estimate from
the first cycle's Krylov dimension, padded for rounding). The projected matrix is kept tridiagonal (the
reorthogonalization coefficients off the tridiagonal are at rounding level), so values equal the torch solver's to
rounding (tested against it and against dense float64 eigenvalues).

It does not restart: rows still unconverged when the basis (`krylov` vectors) is full are handed to
`krylov.lanczos` from their own start, which then decides their results (its products are added), so a slow
problem gets the thick-restart solver's answer and certificate exactly.

`applies(op, x0)` says where it is meant to run: CPU tensors, float32 / float64, dimension <= SMALL_MAX_DIM and at
most SMALL_MAX_BATCH operators (larger batches amortize torch's dispatch over the batch, and larger spaces are
bound by their products, where torch's kernels are as fast). `solve` picks between the two solvers by that rule.
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, List, Optional

import numpy as np
import scipy.linalg
import torch

from harness.kernels.krylov import GramOperator, LanczosResult, Outputs, unit_start
from harness.kernels.krylov import lanczos as restarted_lanczos
from harness.kernels.operators import MGram, ZetaGram

Tensor = torch.Tensor

SMALL_MAX_DIM = 4096  # N above which the products dominate (n = 32, d = 64: zeta's N = 2048, ||M_l||'s 1024)
SMALL_MAX_BATCH = 8  # operators per call above which the batched torch solver amortizes its dispatch


def applies(op: GramOperator, x0: Tensor) -> bool:
    """Whether the NumPy solver is the faster one for this batch (module docstring)."""
    B, N = x0.shape
    return (isinstance(op, (MGram, ZetaGram)) and x0.device.type == "cpu" and op.scale.device.type == "cpu"
            and x0.dtype in (torch.float32, torch.float64) and N <= SMALL_MAX_DIM and 0 < B <= SMALL_MAX_BATCH)


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
            C, KQ = as_np(op.C), as_np(op.KQ)

            def m_domain(v, K, Q, C, KQ):
                Z = v.reshape(n, r)
                T = Z.T @ KQ  # [Z^T K', Z^T Q']
                return (Z @ C + Q @ T[:, :r] + K @ T[:, r:]).ravel()
            return [partial(m_domain, K=K[i], Q=Q[i], C=C[i], KQ=KQ[i]) for i in range(len(K))]

        def m_codomain(v, K, Q):
            S = v.reshape(n, n)
            Y = S @ K + S.T @ Q
            return (Y @ K.T + Q @ Y.T).ravel()
        return [partial(m_codomain, K=K[i], Q=Q[i]) for i in range(len(K))]
    n, d, h, dh = op.n, op.d, op.h, op.dh
    P, Wv, Wo = as_np(op.P), as_np(op.Wv), as_np(op.Wo)
    PT = np.ascontiguousarray(P.transpose(0, 1, 3, 2))
    res = as_np(op.res.reshape(-1).expand(len(P)))

    def zeta(v, P, PT, res):
        G = v.reshape(n, d)
        T = (P @ (G @ Wv).reshape(n, h, dh).transpose(1, 0, 2)).transpose(1, 0, 2).reshape(n, h * dh) @ Wo + res * G
        Z = (T @ Wo.T).reshape(n, h, dh).transpose(1, 0, 2)
        return ((PT @ Z).transpose(1, 0, 2).reshape(n, h * dh) @ Wv.T + res * T).ravel()
    return [partial(zeta, P=P[i], PT=PT[i], res=float(res[i])) for i in range(len(P))]


def _top(a: np.ndarray, b: np.ndarray):
    """Top eigenpair of the symmetric tridiagonal (a, b) by LAPACK's stemr on that index only: (theta, y); NaN
    where an entry is not finite or LAPACK fails."""
    k = len(a)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return math.nan, np.full(k, np.nan)
    (stemr,) = scipy.linalg.get_lapack_funcs(("stemr",), (a,))
    e = np.zeros_like(a)
    e[:k - 1] = b
    _, w, z, info = stemr(a.copy(), e, 2, 0.0, 0.0, k, k, compute_v=1)
    return (float(w[0]), z[:, 0]) if info == 0 else (math.nan, np.full(k, np.nan))


def next_test(k: int, rel_now: float, rel_prev: float, k_prev: int, tol: float, check_every: int, min_steps: int,
              steps: int) -> int:
    """`lanczos_steps.next_check` for one operator, on Python floats (its torch form costs more than a step here):
    every `check_every` steps near convergence, up to 4 x further while the residual, extrapolated geometrically
    from the last two tests, is far from tol; never before `min_steps` products."""
    gap = check_every
    if all(map(math.isfinite, (rel_now, rel_prev))) and 0 < rel_now < rel_prev and k > k_prev:
        rate = (math.log(rel_now) - math.log(rel_prev)) / (k - k_prev)
        need = max((math.log(tol) - math.log(rel_now)) / rate, 0.0)
        gap = int(min(max(check_every, need // 2), 4 * check_every))
    return k + max(gap, min_steps - steps)


def lanczos(op: GramOperator, x0: Tensor, iters: int = 2000, tol: float = 1e-10, krylov: int = 40,
            keep: Optional[int] = None, check_every: int = 3, min_steps: int = 1, fail_prob: Optional[float] = None,
            reorth: str = "auto") -> LanczosResult:
    """`krylov.lanczos`'s arguments and result for an `MGram` or `ZetaGram` batch on the CPU (module docstring);
    anything else goes to `krylov.lanczos`. `keep` and `reorth` reach the restarted solver only, for the rows it
    takes over: this one reorthogonalizes fully, as the torch solver does in spaces this small."""
    if reorth not in ("auto", "full", "partial"):
        raise ValueError(f"reorth must be 'auto', 'full' or 'partial', got {reorth!r}")
    if int(krylov) < 2:
        raise ValueError(f"krylov (the basis size) must be >= 2, got {krylov}")
    B, N = x0.shape
    if not (isinstance(op, (MGram, ZetaGram)) and B and x0.device.type == "cpu"):
        return restarted_lanczos(op, x0, iters, tol, krylov, keep, check_every, min_steps, fail_prob, reorth)
    m = max(1, min(int(krylov), iters + 1, N))
    x = unit_start(x0.detach()).numpy()
    rec = dict(theta=np.zeros(B, x.dtype), conv=np.zeros(B, bool), vec=np.zeros((B, N), x.dtype),
               steps=np.zeros(B, np.int64), rel=np.full(B, np.inf, x.dtype), first=np.zeros(B, np.int64),
               broke=np.zeros(B, bool))
    products = 0
    for i, gram in enumerate(_products(op, x.dtype)):
        row = _run(gram, x[i], m, iters, tol, check_every, min(min_steps, N))
        for name, v in row.items():
            rec[name][i] = v
        products = max(products, int(row["steps"]))  # the torch solver counts products of the shrinking batch
    out = Outputs(B, N, x0.dtype, x0.device)
    for name, arr in rec.items():
        setattr(out, name, torch.from_numpy(arr))
    value, conv, vec, steps, rel, upper, kw = out.result(op.scale.to(x0.dtype), N, m, fail_prob)
    handed = ~conv & (steps == m) & (steps < iters) & torch.isfinite(value)
    if bool(handed.any()):  # the basis filled up: the thick-restart solver decides these rows, from their own start
        r = restarted_lanczos(op.select(handed), x0[handed], iters, tol, krylov, keep, check_every, min_steps,
                              fail_prob, reorth)
        for mine, theirs in ((value, r.value), (conv, r.converged), (vec, r.vector), (rel, r.rel)):
            mine[handed] = theirs
        steps[handed] += r.steps  # the products of the first cycle here, then the restarted solver's
        if fail_prob is not None:
            upper[handed], kw[handed] = r.upper, r.kw_eps
        products += r.products
    return LanczosResult(value, conv, vec, steps, rel, upper, kw, products, 2 * products)


def _run(gram, x: np.ndarray, m: int, iters: int, tol: float, check_every: int, min_steps: int) -> dict:
    """Lanczos on one operator until its relative Ritz residual passes (or a breakdown, a non-finite value, the
    product cap, or a full basis): theta, conv, vec, steps, rel, first (the Krylov dimension) and broke."""
    N, dt = len(x), x.dtype
    eps, tiny = float(np.finfo(dt).eps), float(np.finfo(dt).tiny)
    V = np.zeros((m + 1, N), dt)
    V[0] = x
    a, b = np.zeros(m, dt), np.zeros(m, dt)
    hmax, k = 0.0, 0
    check_at, last_k, last_rel = max(check_every, min_steps), 0, math.inf
    while True:
        w = gram(V[k])
        Vk = V[:k + 1]
        c = Vk @ w  # classical Gram-Schmidt, twice
        w -= c @ Vk
        c2 = Vk @ w
        w -= c2 @ Vk
        c += c2
        a[k] = c[k]
        beta = math.sqrt(float(w @ w))  # NaN or inf when w is not finite (the scaled spectrum lies in [0, 1])
        hm = max(hmax, float(np.abs(c).max()))
        odd = not beta > 100 * eps * max(hm, beta, tiny)
        hmax = max(hm, beta) if beta == beta else hm
        b[k] = beta
        k += 1
        full, last = k == m, k >= iters
        if full or last or odd or k >= check_at or k >= N:
            th, y = _top(a[:k], b[:k - 1])
            broke = beta <= 100 * eps * max(hmax, tiny) or k >= N
            rel = 0.0 if broke or not th > 0 else beta * abs(float(y[-1])) / max(th, tiny)
            finite = math.isfinite(th) and math.isfinite(beta) and math.isfinite(rel)
            conv = finite and ((rel < tol and k >= min_steps) or broke)
            if conv or not finite or last or broke or full:
                vec = y.astype(dt) @ V[:k]
                return dict(theta=th, conv=conv, vec=vec / max(math.sqrt(float(vec @ vec)), tiny), steps=k,
                            rel=rel if finite else math.inf, first=k, broke=broke and finite)
            check_at = next_test(k, rel, last_rel, last_k, tol, check_every, min_steps, k)
            last_k, last_rel = k, rel
        V[k] = w / max(beta, tiny)
