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
  sigma_max <= sqrt(theta / (1 - eps)) c with probability >= 1 - fail_prob over the start vector.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Callable, Optional, Sequence

import torch

from harness.kernels import lanczos_steps
from harness.kernels.deflation import settle
from harness.settings import PARTIAL_MIN_BYTES, PARTIAL_MIN_DIM, RITZ_ROUNDING
from harness.kernels.linalg import safe_norm, trusted_norm

Tensor = torch.Tensor

KW_CONST = 1.648  # Kuczynski-Wozniakowski (1992), Lanczos from a uniformly random start


def kw_epsilon(N: int, k, fail_prob: float):
    """Relative eps with P(theta_k < (1 - eps) lambda_max) <= fail_prob after k Lanczos steps in dimension N
    (>= 1: no bound)."""
    if not 0 < fail_prob < 1:
        raise ValueError(f"fail_prob must be in (0, 1), got {fail_prob}")
    k = torch.as_tensor(k, dtype=torch.float64)
    num = math.log(KW_CONST * math.sqrt(max(N, 1)) / fail_prob)
    return (num / (2 * k - 1).clamp_min(1)) ** 2


def kw_steps(N: int, eps: float, fail_prob: float) -> int:
    """Smallest k with kw_epsilon(N, k, fail_prob) <= eps: k >= 1/2 + ln(1.648 sqrt(N)/fail_prob) / (2 sqrt(eps))."""
    if not 0 < eps < 1:
        raise ValueError(f"eps must be in (0, 1), got {eps}")
    return int(math.ceil(0.5 + math.log(KW_CONST * math.sqrt(max(N, 1)) / fail_prob) / (2 * math.sqrt(eps))))


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




@dataclass
class LanczosResult:
    value: Tensor  # (B,) sigma_max estimate (a Ritz value: a lower estimate)
    converged: Tensor  # (B,) bool
    vector: Tensor  # (B, N) unit top eigenvector estimate of the Gram operator
    steps: Tensor  # (B,) Gram products spent on each operator
    rel: Tensor  # (B,) last relative Ritz residual
    upper: Optional[Tensor]  # (B,) certified upper estimate (probability >= 1 - fail_prob), None if not requested
    kw_eps: Optional[Tensor]  # (B,) relative eps of the KW bound on sigma^2
    products: int  # Gram applications of the (shrinking) batch
    passes: int = 0  # full reorthogonalization passes over the basis (batch-wide)
    early: Optional[Tensor] = None  # (B,) bool: broke down on an invariant subspace before spanning the space


def lanczos(op: GramOperator, x0: Tensor, iters: int = 2000, tol: float = 1e-10, krylov: int = 40,
            keep: Optional[int] = None, check_every: int = 3, min_steps: int = 1,
            fail_prob: Optional[float] = None, reorth: str = "auto") -> LanczosResult:
    """Thick-restart Lanczos for the top eigenvalue of every Gram operator in a batch (see module docstring).

    x0 (B, N): start vectors (any norm). iters caps the Gram products per operator, krylov the basis size,
    keep the Ritz vectors kept at a restart (default krylov // 2). min_steps: no operator is declared converged
    before this many products (to reach the Krylov dimension a certificate needs). fail_prob: compute the KW upper
    estimate (only meaningful when x0 is Gaussian and drawn independently of the operator).
    reorth: "full" (every step), "partial" (Simon's PRO in the first cycle, full after a restart) or "auto"
    (partial iff N >= PARTIAL_MIN_DIM or the batch's basis takes >= PARTIAL_MIN_BYTES: where reading the basis
    twice per step costs more than the operator, e.g. many small problems at once).
    The iteration runs under torch.inference_mode (no autograd bookkeeping on its many small ops); the results
    are returned as ordinary tensors.
    """
    check_options(krylov, reorth)
    with torch.inference_mode():
        out = _lanczos(op, x0.detach(), iters, tol, int(krylov), keep, check_every, min_steps, fail_prob, reorth)
        r = LanczosResult(*out)
        settle_early(op, x0.detach(), r, fail_prob, iters)
    return LanczosResult(*(t.clone() if isinstance(t, Tensor) else t for t in (getattr(r, f.name) for f in fields(r))))


def settle_early(op, x0: Tensor, r: LanczosResult, fail_prob: Optional[float], iters: int) -> None:
    """With a certificate requested, the rows that broke down on an invariant subspace before spanning the space get
    theirs from harness.kernels.deflation.settle (in place on r): the subspace deflated, its complement searched from
    fresh starts. Without one, nothing changes."""
    if fail_prob is None or r.early is None or not bool(r.early.any()):
        return
    scale = op.scale.detach().to(x0.dtype)
    r.value, r.vector, r.upper, r.products = settle(op.gram, unit_start(x0), r.value, r.vector, r.upper, r.early,
                                                    scale, fail_prob, kw_epsilon, r.products)


def basis_size(krylov: int, iters: int, N: int) -> int:
    """Vectors in the Lanczos basis: `krylov`, fewer when iters or the space is smaller (a basis of N vectors spans
    the space: the Ritz value is exact)."""
    return max(1, min(int(krylov), iters + 1, N))


def check_options(krylov: int, reorth: str) -> None:
    """The solvers' argument rules (this module's and harness.kernels.small's)."""
    if reorth not in ("auto", "full", "partial"):
        raise ValueError(f"reorth must be 'auto', 'full' or 'partial', got {reorth!r}")
    if int(krylov) < 2:  # a thick restart keeps >= 1 Ritz vector plus the residual
        raise ValueError(f"krylov (the basis size) must be >= 2, got {krylov}")


def is_lean(B: int, m: int, N: int, itemsize: int) -> bool:
    """A large space or a batch's basis beyond the cache, where reading the basis costs more than the operator:
    the solver then reorthogonalizes partially under reorth="auto" (see lanczos)."""
    return N >= PARTIAL_MIN_DIM or B * (m + 1) * N * itemsize >= PARTIAL_MIN_BYTES


def unit_start(x0: Tensor) -> Tensor:
    """x0 (B, N) normalized row by row; a zero or non-finite row becomes the constant unit vector. On the CPU the
    usual case, every norm finite and at least sqrt(tiny) / eps (`linalg.trusted_norm`), is one division;
    otherwise each row is divided by its largest magnitude before its norm is taken, so rows whose norm overflows
    or is tiny (a subnormal norm carries too few bits to divide by) come out unit too."""
    N = x0.shape[-1]
    nrm = trusted_norm(x0)  # every norm normal (above sqrt(tiny) / eps) and finite, else None
    if nrm is not None:
        return x0 / nrm[:, None]
    m = x0.abs().amax(-1, keepdim=True)  # NaN where the row holds one
    ok = torch.isfinite(m) & (m > 0)
    x = x0 / torch.where(ok, m, torch.ones_like(m))
    x = x / x.norm(dim=-1, keepdim=True).clamp_min(1)  # entries <= 1 with one of them +-1: norm in [1, sqrt(N)]
    return torch.where(ok, x, torch.ones_like(x) / math.sqrt(N))


class Outputs:
    """Per original operator (B,): the last Ritz value, convergence flag, Ritz vector, products spent, residual,
    Krylov dimension of the unrestarted first cycle (the KW certificate's k) and breakdown flag."""

    @classmethod
    def of(cls, **fields: Tensor) -> "Outputs":
        """Outputs holding given per-operator tensors (all seven fields of __init__), e.g. another solver's."""
        out = cls.__new__(cls)
        out.__dict__.update(fields)
        return out

    def __init__(self, B: int, N: int, dt, dev):
        self.theta = torch.zeros(B, dtype=dt, device=dev)
        self.conv = torch.zeros(B, dtype=torch.bool, device=dev)
        self.vec = torch.zeros(B, N, dtype=dt, device=dev)
        self.steps = torch.zeros(B, dtype=torch.long, device=dev)
        self.rel = torch.full((B,), float("inf"), dtype=dt, device=dev)
        self.first = torch.zeros(B, dtype=torch.long, device=dev)
        self.broke = torch.zeros(B, dtype=torch.bool, device=dev)

    def record(self, s: lanczos_steps.LanczosState, t: lanczos_steps.RitzTest, steps: int, last: bool) -> Tensor:
        """Store a test's results for the active rows not yet finished; mark (s.frozen) and return the rows that
        finish now (converged, broken down, non-finite, or out of products), with their Ritz vectors."""
        live = ~s.frozen
        finish = (t.conv | ~t.finite | last | (t.broke & ~t.conv)) & live
        rows = s.idx[live]
        self.theta[rows] = t.th[live]
        self.rel[rows] = torch.where(t.finite[live], t.rel[live], torch.full_like(t.rel[live], float("inf")))
        self.steps[rows] = steps
        self.conv[rows] = t.conv[live]
        self.broke[rows] = t.broke[live] & t.finite[live]
        if not s.restarted:
            self.first[rows] = s.k
        if last:
            finish = live
        if bool(finish.any()):  # Ritz vectors of the finishing rows only (no copy of the whole basis)
            fi = finish.nonzero()[:, 0]
            self.vec[s.idx[fi]] = s.ritz_vectors(fi, t.y[fi])
        s.frozen = s.frozen | finish
        return finish

    def result(self, scale: Tensor, N: int, m: int, fail_prob: Optional[float]):
        """(value, converged, vector, steps, rel, upper, kw_eps, early): sigma = sqrt(theta) c, and the certified
        upper estimate sqrt(theta / (1 - eps_KW)) c (plus a 100 k eps rounding slack) when fail_prob is given;
        `early` marks rows that broke down before spanning the space, whose estimate holds on the Krylov subspace
        only until harness.kernels.deflation.settle has searched its complement (settle_early)."""
        dt = self.theta.dtype
        # the vectors are unit or zero, so a row sum is finite exactly when the row is (one reduction, not a pass
        # per entry test)
        finite = torch.isfinite(self.theta) & torch.isfinite(self.vec.sum(-1))
        self.conv &= finite
        theta = self.theta.clamp_min(0)
        value = theta.sqrt() * scale
        upper = kw = None
        if fail_prob is not None:
            k = self.first.to(torch.float64)
            kw = kw_epsilon(N, k, fail_prob).to(dt)  # in float64, then rounded once
            # a first cycle that spans the space has the spectrum exactly; one that broke down on an invariant
            # subspace earlier has that subspace's top exactly, and is settled over the complement (settle_early)
            kw = torch.where((self.first >= N) | (self.broke & (self.first < m)), 0.0, kw)
            slack = 1 + RITZ_ROUNDING * torch.finfo(dt).eps * k.to(dt)  # rounding of the computed Ritz value
            upper = torch.where(kw < 1, (theta * slack / (1 - kw)).sqrt() * scale, float("inf"))
            upper = torch.where(finite, upper, float("nan"))
        early = self.broke & finite & (self.first < N)
        return value, self.conv, self.vec, self.steps, self.rel, upper, kw, early


def _lanczos(op, x0, iters, tol, krylov, keep, check_every, min_steps, fail_prob, reorth):
    """The iteration (module docstring), as the named steps of harness.kernels.lanczos_steps."""
    B, N = x0.shape
    m = basis_size(krylov, iters, N)
    p = max(1, min(keep if keep is not None else m // 2, m - 1))
    min_steps = min(min_steps, N)
    out = Outputs(B, N, x0.dtype, x0.device)
    scale0 = op.scale.to(x0.dtype)  # (B,) before any deflation
    lean = is_lean(B, m, N, x0.element_size())
    x = unit_start(x0)
    V, release = lanczos_steps.basis_buffer(B, m + 1, N, x.dtype, x.device)
    try:  # the basis buffer goes back to the workspace however the run ends
        s = lanczos_steps.LanczosState(op, x, V, lean, reorth == "partial" or (reorth == "auto" and lean))
        steps = products = 0
        check_at = max(check_every, min_steps)  # earlier: only on a breakdown (`odd`)
        last_k, last_rel = 0, out.rel.clone()
        while s.idx.numel() and steps < iters:
            w = s.expand()
            steps += 1
            products += 1
            w, beta, odd = s.append(*s.reorthogonalize(w))
            full, last = s.k == m, steps >= iters
            t = None
            if full or last or odd or s.k >= check_at or s.k >= N:
                t = s.convergence_test(beta, p if full else 1, tol, min_steps, steps)
                finish = out.record(s, t, steps, last)
                if bool(s.frozen.all()) or last:
                    break
                if bool(finish.any()):
                    w, beta, t = s.deflate(w, beta, t)
                act = s.idx[~s.frozen]
                check_at = lanczos_steps.next_check(s.k, out.rel[act], last_rel[act], last_k, tol, check_every,
                                                    min_steps, steps)
                last_k, last_rel = s.k, out.rel.clone()
            nxt = s.next_vector(w, beta, None if t is None else t.broke)
            if full:
                shift = s.restart(nxt, beta, t, p)
                check_at, last_k = check_at - shift, last_k - shift  # test positions follow the new numbering
            else:
                s.extend(nxt, beta)
        value, conv, vec, steps, rel, upper, kw, early = out.result(scale0, N, m, fail_prob)
        return value, conv, vec, steps, rel, upper, kw, products, s.passes, early
    finally:
        release()
