"""LoFAST (Havens et al.): local sensitivity bounds of (residual) multi-head self-attention, docs/math.md §1.

F(X) = H X + sum_l P_l(X) X VO_l with H = I (residual=True) or 0. For ||X' - X||_F <= eps (Theorem 1):

    ||F(X') - F(X)||_F <= eps * ( zeta(X) + c/sqrt(dh) sum_l (m_l + ||B_l|| eps)(||X VO_l|| + ||VO_l|| eps) )
                        = delta1 + sum_l delta21_l * delta22_l

with zeta (Lemma 1, eq. 12, exact), m_l = ||M_l(X)|| (Lemma 2, eq. 20, exact; fine=True) or xi_l (eq. 21,
fine=False), c = softmax_lip (1 in the paper; 1/2 is also valid, JaSMin Cor. 1).

Every function takes X (n, d) or (..., n, d), follows X's device and dtype (the weights are cast to it) and
returns plain tensors: (...,) per input or (..., h) per head. Exact norms are computed matrix-free by Lanczos on
exact reduced operators (harness.kernels.operators): the thick-restart torch solver (harness.kernels.krylov), or for
small problems on the CPU its NumPy form (harness.kernels.small); pass return_info=True to get
(value, LofastInfo) with convergence flags and certified upper estimates (PowerResult.upper, probability >= 1 - FAIL_PROB).

Biases (beyond the paper, derived): bo and bv cancel in Delta_1, so zeta is exact for the biased layer (its
P_l include bq, bk). For Delta_2 the biased scores change by Gamma wq K^T + Q wk^T Gamma^T + Gamma B Gamma^T
with Q = X wq + bq, K = X wk + bk, so m_l and xi_l use Q, K in place of X B, B X^T, and the value term uses
V_l = (X wv_l + bv_l) wo_l in place of X VO_l. Without biases all of these are exactly the paper's quantities.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, fields
from functools import partial
from typing import Optional, Union

import torch

from harness.bounds.lofast_ops import (check_eps, check_softmax_lip, m_gram, prepare, prod_norm, query_key, spec,
                                       stable_probs, zeta_gram)
from harness.bounds.lofast_pgd import pgd_delta1, pgd_delta2, pgd_delta21, pgd_delta22, pgd_sensitivity
from harness.kernels.attention import AttentionWeights, project
from harness.kernels import small
from harness.kernels.krylov import kw_steps
from harness.kernels.mixed import applies as mixed_applies, lanczos_mixed
from harness.kernels.power import PowerResult, check_args, default_tol, report_nonconvergence
from harness.settings import FAIL_PROB, ITERS, KRYLOV_BYTES, KRYLOV_MAX, KRYLOV_MIN, SUSPICIOUS_STEPS
from harness.kernels.linalg import all_finite
from harness.kernels.starts import gaussian_rows, weight_tensors

Tensor = torch.Tensor
Eps = Union[float, Tensor]

__all__ = ["zeta", "m_norms", "xi", "delta1", "naive_delta1", "delta21", "delta22", "naive_delta22", "delta2",
           "delta", "theorem1", "theorem1_limit", "lipschitz_upper", "LofastInfo", "pgd_sensitivity", "pgd_delta1",
           "pgd_delta2", "pgd_delta21", "pgd_delta22"]


@dataclass
class LofastInfo:
    """Diagnostics of the power iterations behind a LoFAST value (None where a quantity was not needed)."""

    converged: Tensor  # (...,) bool: every power iteration for this input converged
    zeta: Optional[PowerResult] = None  # batch (...,)
    m: Optional[PowerResult] = None  # batch (..., h)




def _krylov(numel: int, dtype, krylov: Optional[int]) -> int:
    """Basis size keeping the Lanczos basis within KRYLOV_BYTES (KRYLOV_MIN to KRYLOV_MAX vectors), unless given."""
    if krylov is not None:
        return int(krylov)
    per = numel * torch.finfo(dtype).bits // 8
    return int(min(KRYLOV_MAX, max(KRYLOV_MIN, KRYLOV_BYTES // max(per, 1))))


def _solve(op, batch_shape, x0, X, tol, iters, random_start, on_nonconvergence, kw, det_upper, restart):
    """Lanczos on a reduced Gram operator (harness.kernels.small.solve: NumPy for small problems on the CPU, else the
    thick-restart torch solver, harness.kernels.krylov; same steps and certificates); suspicious caller starts are
    rerun from the seeded Gaussian `restart()`; certified upper = min(KW estimate, deterministic bound)."""
    method = kw.pop("method", "lanczos")
    if method != "lanczos":
        raise ValueError(f"LoFAST's exact norms use Lanczos (method='lanczos'), got method={method!r}")
    check_args(iters, tol, on_nonconvergence)
    tol = default_tol(X.dtype) if tol is None else tol
    fail_prob = kw.pop("fail_prob", FAIL_PROB)
    opts = dict(iters=iters, tol=tol, krylov=_krylov(x0.numel(), X.dtype, kw.pop("krylov", None)),
                min_steps=kw.pop("min_steps", 1), check_every=kw.pop("check_every", 3))
    cert_eps = kw.pop("certify_eps", None)
    if cert_eps is not None and random_start:  # first cycle long enough for a KW eps of cert_eps
        k = min(kw_steps(op.dim, cert_eps, fail_prob), iters)
        opts.update(krylov=max(opts["krylov"], k + 1), min_steps=max(opts["min_steps"], k))
    mixed = kw.pop("mixed", False) and mixed_applies(X) and random_start
    if kw:
        raise TypeError(f"unexpected keyword arguments {sorted(kw)}")
    if mixed:
        r, products0 = lanczos_mixed(op, op.to(torch.float32), x0, fail_prob, **opts)  # kernels.mixed
    else:
        r, products0 = small.solve(op, x0, fail_prob=fail_prob if random_start else None, **opts), 0
    value, vec, conv, rel, steps, products = r.value, r.vector, r.converged, r.rel, r.steps, r.products + products0
    upper = r.upper if random_start else torch.full_like(value, float("inf"))
    restarted = None
    if not random_start:
        restarted = conv & (steps <= SUSPICIOUS_STEPS)
        if bool(restarted.any()):
            r2 = small.solve(op, restart(), fail_prob=fail_prob, **opts)
            better = restarted & (r2.value > value)
            value = torch.where(better, r2.value, value)
            vec = torch.where(better[:, None], r2.vector, vec)
            conv = torch.where(restarted, r2.converged, conv)
            rel = torch.where(restarted, r2.rel, rel)
            upper = torch.where(restarted, r2.upper, upper)
            products += r2.products
    if callable(det_upper):
        det_upper = det_upper(upper)
    upper = torch.minimum(upper, det_upper.reshape(-1)) if det_upper is not None else upper
    report_nonconvergence(conv, rel, products, tol, on_nonconvergence, "Lanczos iteration")
    sh = tuple(batch_shape)
    res = PowerResult(value.reshape(sh), conv.reshape(sh), vec, products, rel.reshape(sh), upper.reshape(sh), fail_prob,
                      None if restarted is None else restarted.reshape(sh), steps.reshape(sh))
    return res


def _gauss(shape, X, seed, tag, w):
    """The certified start (B, N): Gaussian rows seeded by a hash of X, the weights and the quantity
    (harness.kernels.starts), so no one can know it before fixing the model and the input."""
    return gaussian_rows(X, shape[1], seed, tag, weight_tensors(w), rows=shape[0])


def _out(value: Tensor, info: LofastInfo, return_info: bool):
    return (value, info) if return_info else value


def _empty(X: Tensor, batch, event, return_info: bool, which: str):
    """An empty batch (0, n, d) gives an empty result (the toolkit's input rule), info included."""
    v = X.new_zeros(batch)
    res = PowerResult(v, torch.ones(batch, dtype=torch.bool, device=X.device), X.new_zeros(*batch, *event), 0,
                      v.clone(), upper=v.clone())
    return _out(v, LofastInfo(torch.ones(tuple(X.shape[:-2]), dtype=torch.bool, device=X.device), **{which: res}),
                return_info)


def _ordinary(obj):
    """Tensors made under inference mode as ordinary ones (usable in autograd and in place), inside results."""
    if isinstance(obj, Tensor):
        return obj.clone()
    if isinstance(obj, tuple):
        return tuple(_ordinary(o) for o in obj)
    if isinstance(obj, (LofastInfo, PowerResult)):
        for f in fields(obj):
            setattr(obj, f.name, _ordinary(getattr(obj, f.name)))
    return obj


def _inference(fn):
    """Run an exact norm under torch.inference_mode (its many small tensor operations dispatch faster there: about
    3 % of zeta at n = 32, where the work is milliseconds) and hand back ordinary tensors, detached: the values
    come from Lanczos, and the certified upper estimates carry no autograd history either."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        with torch.inference_mode():
            out = fn(*args, **kwargs)
        return _ordinary(out)
    return run


# ---- exact metrics ----------------------------------------------------------------------------------------
@_inference
def zeta(X: Tensor, w: AttentionWeights, residual: bool = True, *, causal: bool = False, tol: Optional[float] = None,
         iters: int = ITERS, seed: int = 0, v0: Optional[Tensor] = None, return_info: bool = False,
         on_nonconvergence: str = "warn", P_norm: Optional[Tensor] = None, **kw):
    """Lemma 1 (eq. 12, I_n -> I_d fixed): ||H (x) I_d + sum_l P_l(X) (x) VO_l^T||, matrix-free: (..., n, d) -> (...,).

    causal=True (ours, beyond the paper) uses the masked P_l; Lemma 1's argument holds for any fixed P_l.
    Lanczos on T^T T (harness.kernels.operators.ZetaGram, solver by size: _solve); info.zeta.upper: certified upper
    estimate (probability >= 1 - fail_prob over the seeded start, or the deterministic eq. 9 bound if smaller).
    P_norm: ||P_l(X)|| (..., h) for that eq. 9 bound when the caller has it (bounds.input_state.InputState
    computes it once per input); computed here when absent or not finite, and only where eq. 9 can be below the
    certified estimate (`_eq9_cap`).
    kw: krylov (basis size), fail_prob (default FAIL_PROB), certify_eps (run an unrestarted first cycle long enough
    for a KW relative eps on zeta^2 of certify_eps), min_steps, check_every, mixed (float64 inputs: float32
    iterations, then float64 refinement; harness.kernels.mixed).
    """
    w = prepare(X, w)
    batch = X.shape[:-2]
    n, d = X.shape[-2:]
    op, P = zeta_gram(X, w, residual, causal)  # P: (B, h, n, n)
    B = P.shape[0]
    tag = f"zeta;residual={bool(residual)};causal={bool(causal)}"
    restart = lambda: _gauss((B, n * d), X, seed + 1, tag, w)
    x0 = _gauss((B, n * d), X, seed, tag, w) if v0 is None else v0.reshape(B, n * d).to(X.dtype)
    given = P_norm is not None and all_finite(P_norm)
    res = _solve(op, batch, x0, X, tol, iters, v0 is None, on_nonconvergence, dict(kw),
                 partial(_eq9_cap, P, w, residual, P_norm if given else None), restart)
    res.vector = res.vector.reshape(*batch, n, d)
    return _out(res.value, LofastInfo(res.converged, zeta=res), return_info)


def _eq9_cap(P: Tensor, w: AttentionWeights, residual: bool, P_norm: Optional[Tensor], upper: Tensor) -> Tensor:
    """The deterministic cap on zeta's certified estimate `upper` (B,): eq. 9, H + sum_l ||P_l|| ||VO_l|| >= zeta.

    Where it cannot bind it is not computed (inf): eq. 9 >= H + sum_l ||VO_l||_F / sqrt(dh), since ||P_l|| >= 1
    (P_l 1 = 1) and VO_l has rank <= dh; when `upper` lies below that for every input (typical: eq. 9 is loose) the
    minimum is `upper` itself and the spectral norms of P_l and VO_l (two small SVDs per head) are not needed.
    The lower bound is taken in float64 with room for rounding on both sides: ||wv wo||_F^2 = <wv^T wv, wo wo^T>_F
    less its rounding error (which scales with ||wv||_F^2 ||wo||_F^2, large where wv wo cancels), and a margin of
    1000 (n + d) eps of X's dtype times the scale of eq. 9's terms (||P_l|| <= sqrt(n), ||VO_l|| <= ||wv||_F ||wo||_F)
    for the rounding of eq. 9 as computed."""
    h0 = 1.0 if residual else 0.0
    if P_norm is None:
        wv, wo = w.wv.double(), w.wo.double()  # (h, d, dh), (h, dh, d)
        d, dh, n = wv.shape[-2], wv.shape[-1], P.shape[-1]
        sq = ((wv.transpose(-1, -2) @ wv) * (wo @ wo.transpose(-1, -2))).sum((-1, -2)).tolist()  # ||VO_l||_F^2
        size2 = ((wv * wv).sum((-1, -2)) * (wo * wo).sum((-1, -2))).tolist()  # (||wv||_F ||wo||_F)^2 >= ||VO_l||^2
        err = 4 * (d + dh * dh) * torch.finfo(torch.float64).eps  # the Gram form's rounding, relative to size2
        vo_low = sum(math.sqrt(max(a - err * b, 0.0)) for a, b in zip(sq, size2))  # <= sum_l ||VO_l||_F
        margin = 1000 * (n + d) * torch.finfo(P.dtype).eps * (h0 + math.sqrt(n) * sum(map(math.sqrt, size2)))
        low = h0 + vo_low / math.sqrt(dh) - margin
        if math.isfinite(low) and bool((upper <= low).all()):
            return torch.full_like(upper, float("inf"))
        P_norm = spec(P)
    return h0 + (P_norm.reshape(P.shape[0], w.h) * w.VO_norm()).sum(-1)


@_inference
def m_norms(X: Tensor, w: AttentionWeights, *, tol: Optional[float] = None, iters: int = ITERS, seed: int = 0,
            v0: Optional[Tensor] = None, return_info: bool = False, on_nonconvergence: str = "warn", **kw):
    """Lemma 2 (eq. 20): exact ||M_l(X)|| of G -> G B_l X^T + X B_l G^T (B_l unscaled), all heads: (..., h).

    Computed on the exact reduced operator Z -> Z K'^T + Q' Z^T (harness.kernels.operators.MGram, Z = G U,
    n x r with r = min(d, 2 dh)) by Lanczos with per-head deflation (solver by size: _solve). info.m.vector: the right
    singular vector G = Z U^T (..., h, n, d); info.m.upper: certified upper estimate (min of the KW estimate
    and xi_l). v0 (..., h, n, d) is projected onto the reduced space. kw: side ("auto"), krylov, fail_prob, ...
    """
    w = prepare(X, w)
    batch = (*X.shape[:-2], w.h)
    n = X.shape[-2]
    if X.shape[:-2].numel() == 0:
        return _empty(X, batch, (n, X.shape[-1]), return_info, "m")
    kw = dict(kw)
    op, U = m_gram(X, w, kw.pop("side", "auto"))
    B = op.K.shape[0]
    tag = f"m_norms;side={op.side}"
    restart = lambda: _gauss((B, op.dim), X, seed + 1, tag, w)
    if v0 is None:
        x0 = _gauss((B, op.dim), X, seed, tag, w)
    else:
        Z = (v0.to(X.dtype) @ U).reshape(B, n, -1)  # (B, n, r)
        x0 = (Z if op.side == "domain" else op.matvec(Z)).reshape(B, -1)
    det = op.spectral_upper()  # xi_l >= ||M_l|| (triangle inequality)
    res = _solve(op, batch, x0, X, tol, iters, v0 is None, on_nonconvergence, kw, det, restart)
    Z = op.right_vector(res.vector).reshape(*batch, n, -1)  # (..., h, n, r)
    res.vector = Z @ U.transpose(-1, -2)  # (..., h, n, d), unit: U has orthonormal columns
    return _out(res.value, LofastInfo(res.converged.all(-1), m=res), return_info)


def xi(X: Tensor, w: AttentionWeights) -> Tensor:
    """Eq. 21: xi_l(X) = ||B_l X^T|| + ||X B_l|| >= ||M_l(X)||: (..., n, d) -> (..., h)."""
    w = prepare(X, w)
    Q, K = query_key(X, w)  # (..., h, n, dh); X B_l = Q_l wk_l^T, B_l X^T = wq_l K_l^T
    return prod_norm(w.wq, K) + prod_norm(Q, w.wk)


# ---- Delta_1 (eqs. 9-12) ----------------------------------------------------------------------------------
def delta1(X: Tensor, w: AttentionWeights, eps: Eps, residual: bool = True, causal: bool = False, **power) -> Tensor:
    """Lemma 1: max Delta_1 over the eps-ball = zeta(X) eps (exact): (...,)."""
    e = check_eps(eps, X)
    return zeta(X, w, residual, causal=causal, **power) * e


def naive_delta1(X: Tensor, w: AttentionWeights, eps: Eps, residual: bool = True, causal: bool = False) -> Tensor:
    """Eq. 9: Delta_1 <= (||H|| + sum_l ||VO_l|| ||P_l(X)||) eps: (...,)."""
    w = prepare(X, w)
    e = check_eps(eps, X)
    vo = w.VO_norm()  # (h,) ||VO_l||
    s = (vo * spec(stable_probs(X, w, causal))).sum(-1)  # (...,)
    return ((1.0 if residual else 0.0) + s) * e


# ---- Delta_2 pieces (eqs. 13-22) --------------------------------------------------------------------------
def _value_norm(X: Tensor, w: AttentionWeights) -> Tensor:
    """||X VO_l|| (with bv: ||(X wv_l + bv_l) wo_l||): (..., h)."""
    return prod_norm(project(X, w.wv, w.bv), w.wo.transpose(-1, -2))  # V: (..., h, n, dh)


def centered_value_norm(X: Tensor, w: AttentionWeights) -> Tensor:
    """||(X - 1 xbar) wv_l wo_l|| (..., h), xbar the mean token: every row of P_l' - P_l (and of its derivatives)
    sums to 0, so (P_l' - P_l) V = (P_l' - P_l)(V - 1 c) for any row c: the value bias and the tokens' common part
    drop out (docs/math.md §1, "Centered values"). Ours; the paper's certificates keep ||(X wv_l + bv_l) wo_l||."""
    Xc = X - X.mean(-2, keepdim=True)
    return prod_norm(project(Xc, w.wv, None), w.wo.transpose(-1, -2))


def _head_eps(e: Tensor) -> Tensor:
    return e.unsqueeze(-1) if e.dim() else e


def delta21(X: Tensor, w: AttentionWeights, eps: Eps, fine: bool = True, softmax_lip: float = 1.0,
            *, return_info: bool = False, **power):
    """Eqs. 16-21: max ||P_l(X') - P_l(X)||_F <= c eps/sqrt(dh) (m_l + ||B_l|| eps), m_l = ||M_l|| or xi_l: (..., h)."""
    c = check_softmax_lip(softmax_lip)
    w = prepare(X, w)
    e = _head_eps(check_eps(eps, X))
    if fine:
        m, info = m_norms(X, w, return_info=True, **power)
    else:
        m, info = xi(X, w), LofastInfo(torch.ones(X.shape[:-2], dtype=torch.bool, device=X.device))
    b = w.B_norm()  # (h,) ||B_l||
    return _out(c * e / math.sqrt(w.dh) * (m + b * e), info, return_info)


def delta22(X: Tensor, w: AttentionWeights, eps: Eps) -> Tensor:
    """Eqs. 15/22 delta_22^(1): max ||X' VO_l|| <= ||X VO_l|| + ||VO_l|| eps: (..., h)."""
    w = prepare(X, w)
    e = _head_eps(check_eps(eps, X))
    return _value_norm(X, w) + w.VO_norm() * e


def naive_delta22(X: Tensor, w: AttentionWeights, eps: Eps) -> Tensor:
    """Eq. 22 delta_22^(2): ||VO_l|| (||X|| + eps) (+ sqrt(n) ||bv_l wo_l|| with a value bias): (..., h)."""
    w = prepare(X, w)
    e = _head_eps(check_eps(eps, X))
    out = w.VO_norm() * (spec(X).unsqueeze(-1) + e)
    if w.bv is not None:
        out = out + math.sqrt(X.shape[-2]) * (w.bv.unsqueeze(-2) @ w.wo).squeeze(-2).norm(dim=-1)
    return out


def delta2(X: Tensor, w: AttentionWeights, eps: Eps, fine: bool = True, softmax_lip: float = 1.0,
           *, return_info: bool = False, **power):
    """Eq. 14 with Theorem 1's pieces: Delta_2 <= sum_l delta21_l delta22_l: (...,)."""
    d21, info = delta21(X, w, eps, fine, softmax_lip, return_info=True, **power)
    return _out((d21 * delta22(X, w, eps)).sum(-1), info, return_info)


# ---- Theorem 1 and its eps -> 0 limit --------------------------------------------------------------------
def _theorem1(d1, m, b, xvo, vo, dh: int, eps, c, heads: bool = False, limit: bool = False) -> Tensor:
    """Theorem 1's polynomial, the one place it is written: d1 eps + sum_l c_l eps/sqrt(dh) (m_l + ||B_l|| eps)
    (||X VO_l|| + ||VO_l|| eps). limit=True: lim_{eps -> 0} of it divided by eps (the outer factor eps divided out,
    eps -> 0 inside: b and vo drop out). heads: the per-head terms (..., h) instead of their sum."""
    outer, head_outer, inner = (1.0, 1.0, 0.0) if limit else (eps, _head_eps(eps), _head_eps(eps))
    t = c * head_outer / math.sqrt(dh) * (m + b * inner) * (xvo + vo * inner)
    return d1 * outer + (t if heads else t.sum(-1))


def theorem1(d1: Tensor, m: Tensor, b: Tensor, xvo: Tensor, vo: Tensor, dh: int, eps: Tensor,
             c: Union[float, Tensor] = 1.0) -> Tensor:
    """Theorem 1's polynomial in eps: d1 eps + sum_l c_l eps/sqrt(dh) (m_l + ||B_l|| eps) (||X VO_l|| + ||VO_l|| eps).
    d1: (...,) the Delta_1 coefficient (zeta, or eq. 9's for the naive bound); m, xvo: (..., h); b, vo: (h,);
    eps: () or (...,); c: the softmax constant, a number or (..., h)."""
    return _theorem1(d1, m, b, xvo, vo, dh, eps, c)


def theorem1_limit(d1: Tensor, m: Tensor, xvo: Tensor, dh: int, c: Union[float, Tensor] = 1.0,
                   heads: bool = False) -> Tensor:
    """lim_{eps -> 0} theorem1(eps)/eps = d1 + sum_l c_l/sqrt(dh) m_l ||X VO_l||: (...,); heads=True keeps the
    per-head values d1_l + c_l/sqrt(dh) m_l ||X VO_l|| (..., h) (for a per-head d1, e.g. ||P_l|| ||VO_l||)."""
    return _theorem1(d1, m, 0.0, xvo, 0.0, dh, None, c, heads=heads, limit=True)


def delta(X: Tensor, w: AttentionWeights, eps: Eps, residual: bool = True, fine: bool = True,
          softmax_lip: float = 1.0, *, causal: bool = False, return_info: bool = False, **power):
    """Theorem 1: ||F(X') - F(X)||_F <= delta(X, eps) for ||X' - X||_F <= eps: (..., n, d) -> (...,).

    causal=True (ours): zeta uses the masked P_l; the Delta_2 terms are unchanged and stay valid, because a masked
    row's score change is the unmasked one restricted to j <= i (a projection, which can only shrink its norm).
    """
    w = prepare(X, w)
    e = check_eps(eps, X)
    c = check_softmax_lip(softmax_lip)
    z, zi = zeta(X, w, residual, causal=causal, return_info=True, **power)
    if fine:
        m, mi = m_norms(X, w, return_info=True, **power)
    else:
        m, mi = xi(X, w), LofastInfo(torch.ones_like(zi.converged))
    val = theorem1(z, m, w.B_norm(), _value_norm(X, w), w.VO_norm(), w.dh, e, c)
    return _out(val, LofastInfo(zi.converged & mi.converged, zeta=zi.zeta, m=mi.m), return_info)


def lipschitz_upper(X: Tensor, w: AttentionWeights, residual: bool = True, fine: bool = True,
                    softmax_lip: float = 1.0, *, causal: bool = False, return_info: bool = False, **power):
    """lim_{eps->0} delta(X, eps)/eps = zeta + c/sqrt(dh) sum_l m_l ||X VO_l|| >= ||J_F(X)||: (...,). causal: see delta."""
    c = check_softmax_lip(softmax_lip)
    w = prepare(X, w)
    z, zi = zeta(X, w, residual, causal=causal, return_info=True, **power)
    if fine:
        m, mi = m_norms(X, w, return_info=True, **power)
    else:
        m, mi = xi(X, w), LofastInfo(torch.ones_like(zi.converged))
    val = theorem1_limit(z, m, _value_norm(X, w), w.dh, c)
    return _out(val, LofastInfo(zi.converged & mi.converged, zeta=zi.zeta, m=mi.m), return_info)
