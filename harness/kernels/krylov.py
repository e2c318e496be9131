"""Top eigenvalue of batched PSD Gram operators: thick-restart Lanczos with deflation and certified upper estimates.

A Gram operator (`GramOperator`) acts on a flat batch V (B, N) and returns (A^T A / c^2) V per row, with a
per-operator scale c (B,) chosen so the scaled spectrum is O(1): sigma_max(A) = sqrt(theta) * c. The scale is
what keeps every finite operator finite (A^T A of ||A|| = 1e200 is 1e400 in float64; of 1e20 in float32, 1e40).

`lanczos` (docs/math.md §4, Wu & Simon's thick restart):
- reorthogonalization: two classical Gram-Schmidt passes over the basis per step ("twice is enough") when
  N < PARTIAL_MIN_DIM and the batch's basis is below PARTIAL_MIN_BYTES; in larger spaces or batches Simon's
  partial reorthogonalization in the first cycle and, after a restart, the three-term part then one pass (two
  passes on a cycle's first step). The projected matrix H = V^T M V is stored densely (its lower triangle), so
  a restart keeps the top `keep` Ritz vectors plus the residual (H becomes an arrowhead) and the top Ritz value
  never decreases across restarts;
- convergence: relative Ritz residual ||M y - theta y|| / theta < tol (bounds the relative error of theta by tol,
  Weyl), tested from the top eigenpair of the k x k matrix H (k <= krylov): every `check_every` steps near
  convergence, up to 4 x check_every apart while the residual, extrapolated from the last two tests, is far
  from tol, never before `min_steps`, always at restarts, and at once on a breakdown or a non-finite value
  (one scalar test per step);
- the iteration runs under torch.inference_mode (its many small ops skip autograd bookkeeping); results are
  ordinary tensors, and opaque callables (CallableGram) are applied outside inference mode;
- deflation: an operator that converged (or broke down: invariant subspace) leaves the batch when the operator
  supports `select`, so converged heads/inputs stop costing work;
- non-finite values are never reported as converged;
- certified upper estimate (Kuczynski-Wozniakowski 1992) when the start is a Gaussian drawn before looking:
  with k the Krylov dimension of the first (unrestarted) cycle, P(theta_k < (1 - eps) lambda_max) <= 1.648
  sqrt(N) exp(-sqrt(eps) (2k - 1)); the final theta >= theta_k (thick restart is monotone), so
  sigma_max <= sqrt(theta / (1 - eps)) c with probability >= 1 - delta over the start vector.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import scipy.linalg
import torch

from harness.kernels.linalg import safe_norm

Tensor = torch.Tensor

KW_CONST = 1.648  # Kuczynski-Wozniakowski (1992), Lanczos from a uniformly random start


def kw_epsilon(N: int, k, delta: float):
    """Relative eps with P(theta_k < (1 - eps) lambda_max) <= delta after k Lanczos steps in dimension N
    (>= 1: no bound)."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    k = torch.as_tensor(k, dtype=torch.float64)
    num = math.log(KW_CONST * math.sqrt(max(N, 1)) / delta)
    return (num / (2 * k - 1).clamp_min(1)) ** 2


def kw_steps(N: int, eps: float, delta: float) -> int:
    """Smallest k with kw_epsilon(N, k, delta) <= eps: k >= 1/2 + ln(1.648 sqrt(N)/delta) / (2 sqrt(eps))."""
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    return int(math.ceil(0.5 + math.log(KW_CONST * math.sqrt(max(N, 1)) / delta) / (2 * math.sqrt(eps))))


class GramOperator:
    """Interface: `gram(V)` (B', N) -> (B', N) scaled Gram products of the active operators, `scale` (B,),
    `dim` N, and optionally `select(keep)` returning the operator restricted to the rows where keep (B',) is True."""

    dim: int
    scale: Tensor

    def gram(self, V: Tensor) -> Tensor:  # pragma: no cover - interface
        raise NotImplementedError

    def select(self, keep: Tensor) -> Optional["GramOperator"]:
        return None


class CallableGram(GramOperator):
    """A^T A / c^2 from a batched matvec/rmatvec pair on (*batch, *event) tensors (no deflation: callables are opaque).

    The scale c = ||A x0|| for the unit start x0 (<= sigma_max, so A^T (A v / c) / c never overflows when sigma_max
    itself is finite); c = 1 where that is 0 or not finite.
    """

    def __init__(self, matvec: Callable, rmatvec: Callable, batch_shape: Sequence[int], event_shape: Sequence[int],
                 x0: Tensor):
        self.mv, self.rmv = matvec, rmatvec
        self.batch_shape, self.event_shape = tuple(batch_shape), tuple(event_shape)
        self.dim = math.prod(self.event_shape)
        self.B = math.prod(self.batch_shape)
        out = matvec(self._unflat(x0))
        self._out_event = tuple(out.shape[len(self.batch_shape):])
        c = safe_norm(out.reshape(self.B, -1))
        self.scale = torch.where(torch.isfinite(c) & (c > 0), c, torch.ones_like(c))

    def _unflat(self, v: Tensor) -> Tensor:
        return v.reshape(*self.batch_shape, *self.event_shape)

    def gram(self, V: Tensor) -> Tensor:
        # lanczos iterates under inference mode; callables may differentiate (torch.func.jvp / vjp), so they get an
        # ordinary tensor outside it
        with torch.inference_mode(False):
            V, c = V.clone(), self.scale[:, None].clone()
            u = self.mv(self._unflat(V)).reshape(self.B, -1) / c
            return self.rmv(u.reshape(*self.batch_shape, *self._out_event)).reshape(self.B, -1) / c


PARTIAL_MIN_DIM = 4096  # reorth="auto": partial reorthogonalization from this dimension on (docs/notes/kernels.md)
PARTIAL_MIN_BYTES = 32 * 2**20  # ... or from this size of the whole batch's basis on (it no longer stays in cache)


def _omega_step(H: Tensor, omega: Tensor, omega_prev: Tensor, j: int, beta: Tensor, N: int, eps: float) -> Tensor:
    """Simon's (1984) recurrence for the loss of orthogonality of v_{j+1} against v_0..v_j (first cycle: H tridiagonal).

    omega (B, m+1): estimates of v_j . v_i; omega_prev: of v_{j-1} . v_i; beta (B,) = ||w|| before normalization.
    beta_j w_{j+1,i} = b_i w_{j,i+1} + (a_i - a_j) w_{j,i} + b_{i-1} w_{j,i-1} - b_{j-1} w_{j-1,i}, plus a rounding
    term of the same sign, _noise(N) ||H|| (a: diagonal, b: subdiagonal of H); v_{j+1} . v_j is set to
    sqrt(N) eps ||H|| / beta_j.
    Returns the estimates for v_{j+1} (B, m+1) at indices 0..j (the caller sets index j+1 to 1).
    """
    a = torch.diagonal(H[:, :j + 1, :j + 1], dim1=-2, dim2=-1)  # (B, j+1)
    b = torch.diagonal(H[:, :j + 1, :j + 1], offset=-1, dim1=-2, dim2=-1)  # (B, j): b_i = H[i+1, i]
    bj = beta.clamp_min(torch.finfo(beta.dtype).tiny)[:, None]
    num = b * omega[:, 1:j + 1] + (a[:, :j] - a[:, j:]) * omega[:, :j] - b[:, j - 1:j] * omega_prev[:, :j]
    num[:, 1:] += b[:, :j - 1] * omega[:, :j - 1]
    anorm = a.abs().amax(-1, keepdim=True) + 2 * b.abs().amax(-1, keepdim=True)
    new = torch.zeros_like(omega)
    new[:, :j] = (num + torch.where(num >= 0, 1.0, -1.0).to(num.dtype) * _noise(N, eps) * anorm) / bj
    new[:, j] = math.sqrt(N) * eps * anorm[:, 0] / bj[:, 0]
    return new


def _noise(N: int, eps: float) -> float:
    """Rounding level of an inner product of two unit N-vectors (PROPACK's sqrt(N) eps / 2): the omega
    recurrence's rounding term per step (times ||H||) and the estimates' value after a full pass."""
    return math.sqrt(N) * eps / 2


@dataclass
class LanczosResult:
    value: Tensor  # (B,) sigma_max estimate (a Ritz value: a lower estimate)
    converged: Tensor  # (B,) bool
    vector: Tensor  # (B, N) unit top eigenvector estimate of the Gram operator
    steps: Tensor  # (B,) Gram products spent on each operator
    rel: Tensor  # (B,) last relative Ritz residual
    upper: Optional[Tensor]  # (B,) certified upper estimate (probability >= 1 - delta), None if not requested
    kw_eps: Optional[Tensor]  # (B,) relative eps of the KW bound on sigma^2
    products: int  # Gram applications of the (shrinking) batch
    passes: int = 0  # full reorthogonalization passes over the basis (batch-wide)


def _top_eigh(H: Tensor, p: int):
    """Top p eigenpairs of small symmetric matrices H (B, k, k) given by their lower triangles, ascending:
    values (B, p), vectors (B, k, p).

    On CPU through LAPACK's syevr on the wanted indices only, called directly (scipy.linalg.eigh's checks cost more
    than the decomposition at k <= 64): torch's batched CPU eigh of (12, 40, 40) takes ~100x longer with 2 threads,
    which dominated the iteration."""
    k = H.shape[-1]
    p = min(p, k)
    if H.device.type == "cpu":
        Hn = H.detach().numpy()
        (syevr,) = scipy.linalg.get_lapack_funcs(("syevr",), (Hn,))
        vals, vecs = [], []
        for a in Hn:
            w, z, _, _, info = (syevr(a, compute_v=1, range="I", il=k - p + 1, iu=k, lower=1)
                                if np.isfinite(a).all() else (None, None, 0, None, 1))
            vals.append(w[:p] if info == 0 else np.full(p, np.nan))
            vecs.append(z[:, :p] if info == 0 else np.full((k, p), np.nan))
        return torch.from_numpy(np.stack(vals)).to(H.dtype), torch.from_numpy(np.stack(vecs)).to(H.dtype)
    ev, Y = torch.linalg.eigh(H)  # UPLO="L"
    return ev[:, -p:], Y[:, :, -p:]


def _cgs_pass(Vk: Tensor, w: Tensor):
    """One classical Gram-Schmidt pass of w (B, 1, N) against the basis Vk (B, k, N): (w - c Vk, c (B, 1, k))."""
    c = w @ Vk.transpose(-1, -2)
    return torch.baddbmm(w, c, Vk, alpha=-1), c


def _three_term(V: Tensor, w: Tensor, j: int, k: int):
    """The three-term part: w (B, 1, N) against v_j and v_{j-1} (modified Gram-Schmidt): (w, h (B, 1, k))."""
    h = w.new_zeros(w.shape[0], 1, k)
    for i in (j, j - 1):
        c = w @ V[:, i, :, None]  # (B, 1, 1)
        w = w - c * V[:, None, i]
        h[:, :, i] = c[:, :, 0]
    return w, h


def _next_check(k: int, rel_now: Tensor, rel_prev: Tensor, k_prev: int, tol: float, check_every: int,
                min_steps: int, steps: int) -> int:
    """Krylov dimension of the next convergence test (cheap steps between tests; docs/notes/kernels.md).

    Every `check_every` steps near convergence; further apart (at most 4 x check_every) while the fastest active
    row's residual, extrapolated geometrically from the last two tests, is predicted to need more than twice as
    many steps; never before `min_steps` products can have been spent (no row may converge earlier)."""
    gap = check_every
    ok = torch.isfinite(rel_now) & torch.isfinite(rel_prev) & (rel_now > 0) & (rel_now < rel_prev) & (k > k_prev)
    if bool(ok.any()):
        rate = (rel_now[ok].log() - rel_prev[ok].log()) / (k - k_prev)  # < 0 per step
        need = float(((math.log(tol) - rel_now[ok].log()) / rate).clamp_min(0).min())
        gap = int(min(max(check_every, need // 2), 4 * check_every))
    return k + max(gap, min_steps - steps)


def lanczos(op: GramOperator, x0: Tensor, iters: int = 2000, tol: float = 1e-10, krylov: int = 40,
            keep: Optional[int] = None, check_every: int = 3, min_steps: int = 1,
            delta: Optional[float] = None, reorth: str = "auto") -> LanczosResult:
    """Thick-restart Lanczos for the top eigenvalue of every Gram operator in a batch (see module docstring).

    x0 (B, N): start vectors (any norm). iters caps the Gram products per operator, krylov the basis size,
    keep the Ritz vectors kept at a restart (default krylov // 2). min_steps: no operator is declared converged
    before this many products (to reach the Krylov dimension a certificate needs). delta: compute the KW upper
    estimate (only meaningful when x0 is Gaussian and drawn independently of the operator).
    reorth: "full" (every step), "partial" (Simon's PRO in the first cycle, full after a restart) or "auto"
    (partial iff N >= PARTIAL_MIN_DIM or the batch's basis takes >= PARTIAL_MIN_BYTES: where reading the basis
    twice per step costs more than the operator, e.g. many small problems at once).
    The iteration runs under torch.inference_mode (no autograd bookkeeping on its many small ops); the results
    are returned as ordinary tensors.
    """
    if reorth not in ("auto", "full", "partial"):
        raise ValueError(f"reorth must be 'auto', 'full' or 'partial', got {reorth!r}")
    if int(krylov) < 2:  # a thick restart keeps >= 1 Ritz vector plus the residual
        raise ValueError(f"krylov (the basis size) must be >= 2, got {krylov}")
    with torch.inference_mode():
        out = _lanczos(op, x0.detach(), iters, tol, int(krylov), keep, check_every, min_steps, delta, reorth)
    return LanczosResult(*(t.clone() if isinstance(t, Tensor) else t for t in out))


def _lanczos(op, x0, iters, tol, krylov, keep, check_every, min_steps, delta, reorth):
    B, N = x0.shape
    dt, dev = x0.dtype, x0.device
    tiny, eps_m = torch.finfo(dt).tiny, torch.finfo(dt).eps
    m = max(1, min(krylov, iters + 1, N))  # a basis of N vectors spans the space: the Ritz value is exact
    p = max(1, min(keep if keep is not None else m // 2, m - 1))
    min_steps = min(min_steps, N)
    out_theta = torch.zeros(B, dtype=dt, device=dev)
    out_conv = torch.zeros(B, dtype=torch.bool, device=dev)
    out_vec = torch.zeros(B, N, dtype=dt, device=dev)
    out_steps = torch.zeros(B, dtype=torch.long, device=dev)
    out_rel = torch.full((B,), float("inf"), dtype=dt, device=dev)
    out_first = torch.zeros(B, dtype=torch.long, device=dev)  # Krylov dimension of the unrestarted first cycle
    out_broke = torch.zeros(B, dtype=torch.bool, device=dev)  # invariant subspace reached (Ritz value exact)
    idx = torch.arange(B, device=dev)  # active row -> original operator
    scale0 = op.scale.to(dt)  # (B,) before any deflation
    nrm = safe_norm(x0)
    x = x0 / nrm.clamp_min(tiny)[:, None]
    x = torch.where(torch.isfinite(x).all(-1, keepdim=True) & (nrm > 0)[:, None], x, torch.ones_like(x) / math.sqrt(N))
    V = torch.empty(B, m + 1, N, dtype=dt, device=dev)  # only V[:, :k] is ever read
    H = torch.zeros(B, m + 1, m + 1, dtype=dt, device=dev)  # lower triangle only (what the eigensolver reads)
    V[:, 0] = x
    hmax = torch.zeros(B, dtype=dt, device=dev)  # running max |H_ij| (breakdown threshold)
    k, steps, products, restarted, fresh, n_passes = 1, 0, 0, False, 0, 0
    # a large space or a basis beyond the cache: reading the basis costs more than the operator (see lanczos)
    lean = N >= PARTIAL_MIN_DIM or B * (m + 1) * N * x0.element_size() >= PARTIAL_MIN_BYTES
    partial = reorth == "partial" or (reorth == "auto" and lean)
    if partial:  # omega[:, i] estimates v_k . v_i for the newest vector v_k (omega_prev: for v_{k-1}); Simon 1984
        omega = torch.zeros(B, m + 1, dtype=dt, device=dev)
        omega[:, 0] = 1
        omega_prev = torch.zeros_like(omega)
        force = False  # PRO reorthogonalizes two consecutive vectors
    frozen = torch.zeros(B, dtype=torch.bool, device=dev)  # finished rows still in the batch (no select support)
    any_frozen, check_at = False, max(check_every, min_steps)  # earlier: only on a breakdown (see `odd`)
    last_k, last_rel = 0, out_rel.clone()
    while idx.numel() and steps < iters:
        j = k - 1
        w = op.gram(V[:, j])[:, None]  # (B', 1, N)
        steps += 1
        products += 1
        Vk = V[:, :k]  # (B', k, N)
        pro = partial and not restarted
        if pro and j >= 1 and j != fresh:  # the three-term part (v_j, v_{j-1}); a full pass only when needed
            w, h = _three_term(V, w, j, k)
            beta = w.norm(dim=-1)[:, 0]
            H[:, j, j] = h[:, 0, j]
            new = _omega_step(H, omega, omega_prev, j, beta, N, eps_m)
            live = ~frozen & (beta > 0)  # finished rows (zero vectors, no select support) never ask for a pass
            big = (new[:, :j + 1].abs() > math.sqrt(eps_m)).any(-1) | ~torch.isfinite(new).all(-1)
            lost = bool((big & live).any())
            # two consecutive vectors per trigger; and the vector that fills the basis (it survives the restart)
            passes, force = (1, not force) if (lost or force or k == m) else (0, False)
            if passes:
                w, c = _cgs_pass(Vk, w)
                h = h + c
                n_passes += 1
                # a second pass where the first removed much of w (Daniel, Gragg, Kaufman & Stewart 1976)
                if bool((live & (w.norm(dim=-1)[:, 0] < 0.7 * beta)).any()):
                    w, c = _cgs_pass(Vk, w)
                    h = h + c
                    n_passes += 1
        else:  # full reorthogonalization: two classical Gram-Schmidt passes ("twice is enough"), or, in a large
            # space or batch after the first step of a cycle, the three-term part and one pass (reads the basis once)
            passes = 2 if (not lean or j == 0 or j == fresh) else 1
            if passes == 1:
                w, h = _three_term(V, w, j, k)
                w, c = _cgs_pass(Vk, w)
                h = h + c
            else:
                w, h = _cgs_pass(Vk, w)
                w, c = _cgs_pass(Vk, w)
                h = h + c
            n_passes += passes
        H[:, j:j + 1, :k] = h  # row j of the lower triangle
        w = w[:, 0]
        beta = w.norm(dim=-1)
        hm = torch.maximum(hmax, h.abs().amax((-1, -2)))
        # one host sync per step: a breakdown (beta <= 100 eps ||H||: invariant subspace) or a non-finite beta
        # (NaN and inf fail the comparison) forces a convergence test now
        odd = ~(beta > 100 * eps_m * torch.maximum(hm, beta).clamp_min(tiny))
        odd = bool((odd & ~frozen).any() if any_frozen else odd.any())
        if odd and not bool(torch.isfinite(beta).all()):
            beta = safe_norm(w)
        hmax = torch.maximum(hm, beta)
        if pro:
            if passes:  # v_{j+1} orthogonal to the basis to working precision
                new = torch.zeros_like(omega)
                new[:, :k] = _noise(N, eps_m)
            new[:, k] = 1
            omega_prev, omega = omega, new
        full, last = k == m, steps >= iters
        if full or last or odd or k >= check_at or k >= N:
            ev, Y = _top_eigh(H[:, :k, :k], p if full else 1)  # ascending, the wanted top ones only
            th, y = ev[:, -1], Y[:, :, -1]
            broke = (beta <= 100 * eps_m * hmax.clamp_min(tiny)) | (k >= N)
            rel = torch.where(th > 0, beta * y[:, -1].abs() / th.clamp_min(tiny), torch.zeros_like(th))
            rel = torch.where(broke, torch.zeros_like(rel), rel)
            finite = torch.isfinite(th) & torch.isfinite(beta) & torch.isfinite(rel)
            conv = finite & (((rel < tol) & (steps >= min_steps)) | broke)
            finish = (conv | ~finite | last | (broke & ~conv)) & ~frozen
            live = ~frozen
            rows = idx[live]
            out_theta[rows] = th[live]
            out_rel[rows] = torch.where(finite[live], rel[live], torch.full_like(rel[live], float("inf")))
            out_steps[rows] = steps
            out_conv[rows] = conv[live]
            out_broke[rows] = broke[live] & finite[live]
            if not restarted:
                out_first[rows] = k
            if last:
                finish = live
            if bool(finish.any()):  # Ritz vectors of the finishing rows only (no copy of the whole basis)
                fi = finish.nonzero()[:, 0]
                vec = (y[fi, None, :].to(dt) @ V[fi, :k])[:, 0]
                out_vec[idx[fi]] = vec / safe_norm(vec).clamp_min(tiny)[:, None]
            frozen = frozen | finish
            if bool(frozen.all()) or last:
                break
            if bool(finish.any()):
                sub = op.select(~frozen)
                if sub is not None:
                    keep_rows = ~frozen
                    op, idx, H, hmax = sub, idx[keep_rows], H[keep_rows], hmax[keep_rows]
                    rows = keep_rows.nonzero()[:, 0].tolist()  # ascending: row r moves to i <= r, in place
                    for i, r in enumerate(rows):  # only the basis in use, no temporary (the copy is memory-bound)
                        if i != r:
                            V[i, :k].copy_(V[r, :k])
                    V = V[:len(rows)]
                    w, beta, ev, Y, broke = w[keep_rows], beta[keep_rows], ev[keep_rows], Y[keep_rows], broke[keep_rows]
                    frozen = frozen[keep_rows]
                    if partial:
                        omega, omega_prev = omega[keep_rows], omega_prev[keep_rows]
                any_frozen = bool(frozen.any())
            act = idx[~frozen]
            check_at = _next_check(k, out_rel[act], last_rel[act], last_k, tol, check_every, min_steps, steps)
            last_k, last_rel = k, out_rel.clone()
            nxt = w / beta.clamp_min(tiny)[:, None]
            nxt = torch.where((broke | frozen)[:, None], torch.zeros_like(nxt), nxt)
        else:
            nxt = w / beta.clamp_min(tiny)[:, None]  # beta == 0 only for w == 0
            if any_frozen:
                nxt = torch.where(frozen[:, None], torch.zeros_like(nxt), nxt)
        if full:  # thick restart: top p Ritz vectors + the residual direction
            Yp = Y[:, :, -p:].flip(-1)  # (B', k, p), largest first
            V[:, :p] = Yp.transpose(-1, -2) @ V[:, :k]  # a new tensor, then copied: no aliasing
            V[:, p] = nxt
            H.zero_()
            H[:, :p, :p] = torch.diag_embed(ev[:, -p:].flip(-1))
            H[:, p, :p] = beta[:, None] * Yp[:, -1, :]  # the residual's couplings (B', p)
            hmax = torch.maximum(hmax, ev[:, -1].abs())
            check_at, last_k = check_at - k + p + 1, last_k - k + p + 1  # test positions follow the new numbering
            k, restarted, fresh = p + 1, True, p
        else:
            V[:, k] = nxt
            H[:, k, j] = beta
            k += 1
    scale = scale0
    finite = torch.isfinite(out_theta) & torch.isfinite(out_vec).all(-1)
    out_conv &= finite
    value = out_theta.clamp_min(0).sqrt() * scale
    upper = kw = None
    if delta is not None:
        kw = kw_epsilon(N, out_first, delta).to(dt).to(dev)
        # an invariant Krylov subspace stays the same for every larger k, so the KW bound holds with k -> inf
        kw = torch.where(out_broke & (out_first < m), torch.zeros_like(kw), kw)
        slack = 1 + 100 * eps_m * out_first.to(dt)  # rounding of the computed Ritz value
        up_t = out_theta.clamp_min(0) / (1 - kw).clamp_min(0) * slack
        upper = torch.where(kw < 1, up_t.sqrt() * scale, torch.full_like(value, float("inf")))
        upper = torch.where(finite, upper, torch.full_like(upper, float("nan")))
    return value, out_conv, out_vec, out_steps, out_rel, upper, kw, products, n_passes
