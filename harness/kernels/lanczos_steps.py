"""The named steps of thick-restart Lanczos (`harness.kernels.krylov.lanczos`; docs/math.md §4).

One iteration on the batch held by a `LanczosState`:
- `expand`: one Gram product of the newest basis vector;
- `reorthogonalize`: classical Gram-Schmidt passes over the basis (`cgs_pass`), or in the first cycle of partial
  reorthogonalization the three-term part (`three_term`) and a pass only when Simon's estimates (`omega_step`)
  say orthogonality is lost;
- `append`: the new row of the projected matrix H, the next norm beta and the breakdown check;
- at a test, `convergence_test`: the top eigenpair of H (`top_eigh`) and the relative Ritz residual; then
  `Outputs.record` stores the finished rows and `deflate` drops them from the batch; `next_check` schedules the
  next test;
- `extend` the basis by the normalized residual, or `restart` it when full (top Ritz vectors + residual).
"""
from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass, fields

import numpy as np
import scipy.linalg
import torch

from harness.kernels.linalg import all_finite, safe_norm
from harness.settings import WORKSPACE_BYTES

Tensor = torch.Tensor

_WORKSPACE = threading.local()  # per thread: buf, one CPU byte buffer kept between runs; busy, whether a run holds it


def basis_buffer(B: int, rows: int, N: int, dtype: torch.dtype, device) -> tuple:
    """An uninitialized (B, rows, N) tensor for a Lanczos basis, and the callable that ends the run's use of it.

    On the CPU a basis of up to `WORKSPACE_BYTES` is a view of one byte buffer kept between runs (per thread, shared
    by every dtype, grown when a run needs more). A fresh block of tens of MB is mapped by the C library on
    allocation, unmapped on free and faulted in page by page on its first writes: 28,000 page faults per call for
    64 inputs' ||M_l|| at n = 32 (a 130 MiB basis; docs/notes/kernels.md, "Batches and paper-size analyze"). Only
    what a run writes is read, so reuse changes no value; an operator must not keep the vectors it is given (they
    are views of the buffer, which later runs overwrite). While a run holds the buffer (a solver called inside an
    operator) another run gets a fresh tensor. Other devices get torch's allocator (CUDA's caches already), and
    so do larger bases. The cost is memory held after the run, up to `WORKSPACE_BYTES` per thread that ran a
    solver; `release_workspace` drops the calling thread's buffer."""
    nbytes = B * rows * N * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes > WORKSPACE_BYTES or getattr(_WORKSPACE, "busy", False):
        return torch.empty(B, rows, N, dtype=dtype, device=device), lambda: None
    buf = getattr(_WORKSPACE, "buf", None)
    if buf is None or buf.numel() < nbytes:
        buf = _WORKSPACE.buf = None  # the old buffer is freed before the larger one is mapped
        buf = _WORKSPACE.buf = torch.empty(nbytes, dtype=torch.uint8)
    _WORKSPACE.busy = True

    def done():
        _WORKSPACE.busy = False
    return buf[:nbytes].view(dtype).view(B, rows, N), done


def release_workspace() -> None:
    """Drop this thread's kept basis buffer (`basis_buffer`); harness.process.release_freed_memory calls it."""
    _WORKSPACE.buf = None


def rounding_level(N: int, eps: float) -> float:
    """Rounding level of an inner product of two unit N-vectors (PROPACK's sqrt(N) eps / 2): the omega
    recurrence's rounding term per step (times ||H||) and the estimates' value after a full pass."""
    return math.sqrt(N) * eps / 2


def omega_step(H: Tensor, omega: Tensor, omega_prev: Tensor, j: int, beta: Tensor, N: int, eps: float) -> Tensor:
    """Simon's (1984) recurrence for the loss of orthogonality of v_{j+1} against v_0..v_j (first cycle: H tridiagonal).

    omega (B, m+1): estimates of v_j . v_i; omega_prev: of v_{j-1} . v_i; beta (B,) = ||w|| before normalization.
    beta_j w_{j+1,i} = b_i w_{j,i+1} + (a_i - a_j) w_{j,i} + b_{i-1} w_{j,i-1} - b_{j-1} w_{j-1,i}, plus a rounding
    term of the same sign, rounding_level(N) ||H|| (a: diagonal, b: subdiagonal of H); v_{j+1} . v_j is set to
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
    new[:, :j] = (num + torch.where(num >= 0, 1.0, -1.0).to(num.dtype) * rounding_level(N, eps) * anorm) / bj
    new[:, j] = math.sqrt(N) * eps * anorm[:, 0] / bj[:, 0]
    return new


def stemr_top(d: np.ndarray, e: np.ndarray, p: int):
    """Top p eigenpairs of the symmetric tridiagonal matrix with diagonal d (k,) and subdiagonal e (k - 1,), by
    LAPACK's stemr on those indices only: (values (p,) ascending, vectors (k, p)), or None where LAPACK fails."""
    k = len(d)
    sub = np.zeros_like(d)  # stemr reads k - 1 subdiagonal entries from a k-array
    sub[:k - 1] = e
    _, w, z, info = routine("stemr", d.dtype.char)(d.copy(), sub, 2, 0.0, 0.0, k - p + 1, k, compute_v=1)
    return (w[:p], z[:, :p]) if info == 0 else None


@functools.lru_cache(maxsize=None)
def routine(name: str, char: str):
    """scipy's BLAS routine `name` for a real NumPy dtype character ("f", "d"), else its LAPACK one ("gemv";
    "stemr", "syevr"), looked up once (the lookup costs more than a small decomposition)."""
    if hasattr(scipy.linalg.blas, "d" + name):
        return scipy.linalg.get_blas_funcs((name,), (np.zeros(1, char),))[0]
    return scipy.linalg.get_lapack_funcs((name,), (np.zeros(1, char),))[0]


def top_eigh(H: Tensor, p: int, tridiagonal: bool = False):
    """Top p eigenpairs of small symmetric matrices H (B, k, k) given by their lower triangles, ascending:
    values (B, p), vectors (B, k, p); NaN for a matrix with a non-finite entry.

    On CPU through LAPACK on the wanted indices only, called directly (scipy.linalg.eigh's checks cost more than the
    decomposition at k <= 64): syevr, or with tridiagonal=True (the first Lanczos cycle: the entries below the
    subdiagonal are reorthogonalization coefficients at rounding level, which the Lanczos recurrence drops) stemr on
    the diagonal and subdiagonal, 2-6x faster at k = 40. torch's batched CPU eigh of (256, 40, 40) takes 20 ms on one
    thread and 94 ms on two against 14 ms for the syevr loop (docs/notes/kernels.md). Elsewhere torch.linalg.eigh."""
    k = H.shape[-1]
    p = min(p, k)
    if H.device.type != "cpu":
        if tridiagonal:
            H = torch.diag_embed(torch.diagonal(H, dim1=-2, dim2=-1)) + torch.diag_embed(
                torch.diagonal(H, offset=-1, dim1=-2, dim2=-1), offset=-1)
        ev, Y = torch.linalg.eigh(H)  # UPLO="L"
        return ev[:, -p:], Y[:, :, -p:]
    Hn = H.detach().numpy()
    vals = np.full((len(Hn), p), np.nan, dtype=Hn.dtype)
    vecs = np.full((len(Hn), k, p), np.nan, dtype=Hn.dtype)
    ok = np.flatnonzero(np.isfinite(Hn).all((1, 2)))
    if tridiagonal:
        d = np.ascontiguousarray(np.diagonal(Hn, 0, 1, 2))
        e = np.diagonal(Hn, -1, 1, 2)
        for i in ok:
            top = stemr_top(d[i], e[i], p)
            if top is not None:
                vals[i], vecs[i] = top
    else:
        syevr = routine("syevr", Hn.dtype.char)
        for i in ok:
            w, z, _, _, info = syevr(Hn[i], compute_v=1, range="I", il=k - p + 1, iu=k, lower=1)
            if info == 0:
                vals[i], vecs[i] = w[:p], z[:, :p]
    return torch.from_numpy(vals).to(H.dtype), torch.from_numpy(vecs).to(H.dtype)


def cgs_pass(Vk: Tensor, w: Tensor):
    """One classical Gram-Schmidt pass of w (B, 1, N) against the basis Vk (B, k, N): (w - c Vk, c (B, 1, k))."""
    c = w @ Vk.transpose(-1, -2)
    return torch.baddbmm(w, c, Vk, alpha=-1), c


def three_term(V: Tensor, w: Tensor, j: int, k: int):
    """The three-term part: w (B, 1, N) against v_j and v_{j-1} (modified Gram-Schmidt): (w, h (B, 1, k)).
    Batched dot products (vecdot) and one fused multiply-subtract per vector: a batch of (1 x N) @ (N x 1)
    matmuls costs about twice as much on CPU."""
    h = w.new_zeros(w.shape[0], 1, k)
    for i in (j, j - 1):
        v = V[:, i]
        c = torch.linalg.vecdot(w[:, 0], v)  # (B,)
        w = torch.addcmul(w, c[:, None, None], v[:, None], value=-1)
        h[:, 0, i] = c
    return w, h


def next_check(k: int, rel_now, rel_prev, k_prev: int, tol: float, check_every: int, min_steps: int,
               steps: int) -> int:
    """Krylov dimension of the next convergence test (cheap steps between tests; docs/notes/kernels.md), from the
    active rows' relative residuals at this test and the last: tensors (the torch solver) or NumPy arrays (the
    NumPy one in kernels.small), computed in their dtype with NumPy so that both solvers schedule alike.

    Every `check_every` steps near convergence; further apart (at most 4 x check_every) while the fastest active
    row's residual, extrapolated geometrically from the last two tests, is predicted to need more than twice as
    many steps; never before `min_steps` products can have been spent (no row may converge earlier)."""
    now, prev = (r.detach().cpu().numpy() if isinstance(r, Tensor) else np.asarray(r) for r in (rel_now, rel_prev))
    gap = check_every
    ok = np.isfinite(now) & np.isfinite(prev) & (now > 0) & (now < prev) & (k > k_prev)
    if ok.any():
        with np.errstate(divide="ignore", invalid="ignore"):  # a zero rate (rounding): +-inf or NaN, as x / 0
            rate = (np.log(now[ok]) - np.log(prev[ok])) / (k - k_prev)  # < 0 per step
            need = float(np.maximum((math.log(tol) - np.log(now[ok])) / rate, 0).min())
        gap = int(min(max(check_every, need // 2), 4 * check_every))
    return k + max(gap, min_steps - steps)


@dataclass
class RitzTest:
    """A convergence test of the active batch (B',): top eigenpairs of H, the top Ritz value th and its vector y in
    the basis, the relative residual, and which rows converged / broke down (invariant subspace) / are finite."""

    ev: Tensor  # (B', p) top eigenvalues of H, ascending
    Y: Tensor  # (B', k, p) their eigenvectors
    th: Tensor  # (B',) top Ritz value
    y: Tensor  # (B', k)
    rel: Tensor  # (B',) relative Ritz residual (0 at a breakdown)
    broke: Tensor  # (B',) bool
    finite: Tensor  # (B',) bool
    conv: Tensor  # (B',) bool

    def select(self, keep: Tensor) -> "RitzTest":
        return RitzTest(*(getattr(self, f.name)[keep] for f in fields(self)))


class LanczosState:
    """One run's batch: basis V (B', m+1, N), the caller's (who also gives it back), of which V[:, :k] is in use,
    projected matrix H (lower triangle), the running max |H_ij| (breakdown threshold), active row -> original
    operator `idx`, finished rows still in the batch `frozen` (operators without `select`), and partial
    reorthogonalization's estimates omega (Simon 1984)."""

    def __init__(self, op, x: Tensor, V: Tensor, lean: bool, partial: bool):
        B, N = x.shape
        dt, dev, m = x.dtype, x.device, V.shape[1] - 1
        self.op, self.m, self.N, self.lean, self.partial = op, m, N, lean, partial
        self.eps, self.tiny = torch.finfo(dt).eps, torch.finfo(dt).tiny
        self.H = torch.zeros(B, m + 1, m + 1, dtype=dt, device=dev)  # lower triangle only (what top_eigh reads)
        self.hmax = torch.zeros(B, dtype=dt, device=dev)
        self.idx = torch.arange(B, device=dev)
        self.frozen = torch.zeros(B, dtype=torch.bool, device=dev)
        self.any_frozen = False
        self.k, self.restarted, self.fresh, self.passes = 1, False, 0, 0
        if partial:  # omega[:, i] estimates v_k . v_i for the newest vector v_k (omega_prev: for v_{k-1})
            self.omega = torch.zeros(B, m + 1, dtype=dt, device=dev)
            self.omega[:, 0] = 1
            self.omega_prev = torch.zeros_like(self.omega)
            self.force = False  # PRO reorthogonalizes two consecutive vectors
        self._pro = self._omega_new = None
        self.V = V  # the caller's (B, m + 1, N) basis (`basis_buffer`), uninitialized: only V[:, :k] is ever read
        self.V[:, 0] = x

    def expand(self) -> Tensor:
        """One Gram product of the newest basis vector: w (B', 1, N)."""
        return self.op.gram(self.V[:, self.k - 1])[:, None]

    def reorthogonalize(self, w: Tensor):
        """w against the basis: (w (B', 1, N), its coefficients h (B', 1, k) = row k-1 of H)."""
        j, k, V, eps = self.k - 1, self.k, self.V, self.eps
        Vk = V[:, :k]
        self._pro = pro = self.partial and not self.restarted
        if pro and j >= 1 and j != self.fresh:  # the three-term part (v_j, v_{j-1}); a full pass only when needed
            w, h = three_term(V, w, j, k)
            beta = w.norm(dim=-1)[:, 0]
            self.H[:, j, j] = h[:, 0, j]
            self._omega_new = new = omega_step(self.H, self.omega, self.omega_prev, j, beta, self.N, eps)
            live = ~self.frozen & (beta > 0)  # finished rows (zero vectors, no select support) never ask for a pass
            big = (new[:, :j + 1].abs() > math.sqrt(eps)).any(-1) | ~torch.isfinite(new).all(-1)
            lost = bool((big & live).any())
            # two consecutive vectors per trigger; and the vector that fills the basis (it survives the restart)
            passes, self.force = (1, not self.force) if (lost or self.force or k == self.m) else (0, False)
            if passes:
                w, c = cgs_pass(Vk, w)
                h = h + c
                self.passes += 1
                # a second pass where the first removed much of w (Daniel, Gragg, Kaufman & Stewart 1976)
                if bool((live & (w.norm(dim=-1)[:, 0] < 0.7 * beta)).any()):
                    w, c = cgs_pass(Vk, w)
                    h = h + c
                    self.passes += 1
        else:  # full reorthogonalization: two classical Gram-Schmidt passes ("twice is enough"), or, in a large
            # space or batch after the first step of a cycle, the three-term part and one pass (reads the basis once)
            passes = 2 if (not self.lean or j == 0 or j == self.fresh) else 1
            if passes == 1:
                w, h = three_term(V, w, j, k)
                w, c = cgs_pass(Vk, w)
                h = h + c
            else:
                w, h = cgs_pass(Vk, w)
                w, c = cgs_pass(Vk, w)
                h = h + c
            self.passes += passes
        self._full_pass = passes > 0
        return w, h

    def append(self, w: Tensor, h: Tensor):
        """Row k-1 of H from h; the residual w (B', N), its norm beta (B',) and whether some active row broke down
        (beta <= 100 eps ||H||: invariant subspace) or has a non-finite beta (NaN and inf fail the comparison): one
        host sync per step, so such a row is tested at once."""
        j, k, eps, tiny = self.k - 1, self.k, self.eps, self.tiny
        self.H[:, j:j + 1, :k] = h
        w = w[:, 0]
        beta = w.norm(dim=-1)
        hm = torch.maximum(self.hmax, h.abs().amax((-1, -2)))
        odd = ~(beta > 100 * eps * torch.maximum(hm, beta).clamp_min(tiny))
        odd = bool((odd & ~self.frozen).any() if self.any_frozen else odd.any())
        if odd and not all_finite(beta):
            beta = safe_norm(w)
        self.hmax = torch.maximum(hm, beta)
        if self._pro:
            if self._full_pass:  # v_{j+1} orthogonal to the basis to working precision
                new = torch.zeros_like(self.omega)
                new[:, :k] = rounding_level(self.N, eps)
            else:
                new = self._omega_new
            new[:, k] = 1
            self.omega_prev, self.omega = self.omega, new
        return w, beta, odd

    def convergence_test(self, beta: Tensor, p: int, tol: float, min_steps: int, steps: int) -> RitzTest:
        """Top p eigenpairs of H and the relative Ritz residual beta |y_k| / theta of the top one; a breakdown, or a
        basis spanning the whole space, makes the Ritz value exact. Non-finite rows never converge."""
        k, eps, tiny = self.k, self.eps, self.tiny
        ev, Y = top_eigh(self.H[:, :k, :k], p, not self.restarted)  # ascending, the wanted top ones only
        th, y = ev[:, -1], Y[:, :, -1]
        broke = (beta <= 100 * eps * self.hmax.clamp_min(tiny)) | (k >= self.N)
        rel = torch.where(th > 0, beta * y[:, -1].abs() / th.clamp_min(tiny), torch.zeros_like(th))
        rel = torch.where(broke, torch.zeros_like(rel), rel)
        finite = torch.isfinite(th) & torch.isfinite(beta) & torch.isfinite(rel)
        conv = finite & (((rel < tol) & (steps >= min_steps)) | broke)
        return RitzTest(ev, Y, th, y, rel, broke, finite, conv)

    def ritz_vectors(self, rows: Tensor, y: Tensor) -> Tensor:
        """Unit Ritz vectors (len(rows), N) of the given active rows from their eigenvectors y (len(rows), k): row by
        row on the basis in place (gathering the rows' bases first would copy them into fresh memory)."""
        Vk = self.V[:, :self.k]
        y = y.to(self.V.dtype)
        vec = torch.stack([y[i] @ Vk[r] for i, r in enumerate(rows.tolist())])
        return vec / safe_norm(vec).clamp_min(self.tiny)[:, None]

    def deflate(self, w: Tensor, beta: Tensor, t: RitzTest):
        """Drop the frozen rows from the batch where the operator supports `select` (the basis rows move in place,
        without a temporary: the copy is memory-bound). Returns w, beta and the test restricted to the kept rows."""
        sub = self.op.select(~self.frozen)
        if sub is not None:
            keep = ~self.frozen
            self.op, self.idx, self.H, self.hmax = sub, self.idx[keep], self.H[keep], self.hmax[keep]
            rows = keep.nonzero()[:, 0].tolist()  # ascending: row r moves to i <= r
            for i, r in enumerate(rows):
                if i != r:
                    self.V[i, :self.k].copy_(self.V[r, :self.k])
            self.V = self.V[:len(rows)]
            w, beta, t = w[keep], beta[keep], t.select(keep)
            self.frozen = self.frozen[keep]
            if self.partial:
                self.omega, self.omega_prev = self.omega[keep], self.omega_prev[keep]
        self.any_frozen = bool(self.frozen.any())
        return w, beta, t

    def next_vector(self, w: Tensor, beta: Tensor, stop=None) -> Tensor:
        """The normalized residual; zero for finished rows and for `stop` (rows that broke down at a test)."""
        nxt = w / beta.clamp_min(self.tiny)[:, None]  # beta == 0 only for w == 0
        if stop is not None:
            return torch.where((stop | self.frozen)[:, None], torch.zeros_like(nxt), nxt)
        if self.any_frozen:
            nxt = torch.where(self.frozen[:, None], torch.zeros_like(nxt), nxt)
        return nxt

    def extend(self, nxt: Tensor, beta: Tensor) -> None:
        """Append the next basis vector (H gains the subdiagonal entry beta)."""
        self.V[:, self.k] = nxt
        self.H[:, self.k, self.k - 1] = beta
        self.k += 1

    def restart(self, nxt: Tensor, beta: Tensor, t: RitzTest, p: int) -> int:
        """Thick restart: the top p Ritz vectors + the residual direction (H becomes an arrowhead). Returns the shift
        of the Krylov dimension (old k - new k)."""
        k = self.k
        Yp = t.Y[:, :, -p:].flip(-1)  # (B', k, p), largest first
        self.V[:, :p] = Yp.transpose(-1, -2) @ self.V[:, :k]  # a new tensor, then copied: no aliasing
        self.V[:, p] = nxt
        self.H.zero_()
        self.H[:, :p, :p] = torch.diag_embed(t.ev[:, -p:].flip(-1))
        self.H[:, p, :p] = beta[:, None] * Yp[:, -1, :]  # the residual's couplings (B', p)
        self.hmax = torch.maximum(self.hmax, t.ev[:, -1].abs())
        self.k, self.restarted, self.fresh = p + 1, True, p
        return k - (p + 1)
