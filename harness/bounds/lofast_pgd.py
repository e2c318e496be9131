"""PGD lower bounds for the LoFAST quantities (eqs. 5, 10, 13, 16, 22), via harness.kernels.pgd.

Each function maximizes the paper's quantity over X' in {||X' - X||_F <= eps} by projected normalized-gradient
ascent with random restarts (pgd_maximize) and returns the best value found: a lower bound of the maximum,
so each must stay below the matching LoFAST upper bound. Per-head quantities run one independent PGD per head
(X is replicated over a head axis), because the paper maximizes each head's term separately (eq. 14).
"""
from __future__ import annotations

import math
from typing import Union

import torch

from harness.bounds.lofast_ops import check_eps, prepare, spec, zeta_gram
from harness.kernels.attention import AttentionWeights, attention_unchecked
from harness.kernels.pgd import pgd_maximize
from harness.settings import PGD_RESTARTS, PGD_STEPS

Tensor = torch.Tensor
Eps = Union[float, Tensor]


def _fro(t: Tensor) -> Tensor:
    return t.flatten(-2).norm(dim=-1)


def _run(obj, X0: Tensor, e: Tensor, steps: int, restarts: int, seed: int) -> Tensor:
    batch = X0.shape[:-2]
    return pgd_maximize(obj, X0, e.expand(batch), steps=steps, restarts=restarts, batch_dims=len(batch),
                        seed=seed).value


def _per_head(X: Tensor, w: AttentionWeights, e: Tensor):
    """X replicated per head (..., h, n, d) and eps broadcast to (..., h)."""
    Xh = X.unsqueeze(-3).expand(*X.shape[:-2], w.h, *X.shape[-2:]).contiguous()
    eh = (e.unsqueeze(-1) if e.dim() else e).expand(Xh.shape[:-2])
    return Xh, eh


def _probs_heads(Xh: Tensor, w: AttentionWeights) -> Tensor:
    """P_l(X_l) where head l reads its own copy X_l: (..., h, n, d) -> (..., h, n, n)."""
    q, k = Xh @ w.wq, Xh @ w.wk  # (..., h, n, dh)
    if w.bq is not None:
        q = q + w.bq[:, None, :]
    if w.bk is not None:
        k = k + w.bk[:, None, :]
    return torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(w.dh), dim=-1)


def _values_heads(Xh: Tensor, w: AttentionWeights) -> Tensor:
    """(X_l wv_l + bv_l) wo_l per head: (..., h, n, d) -> (..., h, n, d)."""
    v = Xh @ w.wv  # (..., h, n, dh)
    if w.bv is not None:
        v = v + w.bv[:, None, :]
    return v @ w.wo


def pgd_sensitivity(X: Tensor, w: AttentionWeights, eps: Eps, residual: bool = True, steps: int = PGD_STEPS,
                    restarts: int = PGD_RESTARTS, seed: int = 0) -> Tensor:
    """Eq. 5: max_{||X'-X||_F<=eps} ||F(X') - F(X)||_F (end-to-end, F with biases), PGD lower bound: (...,)."""
    w = prepare(X, w)
    e = check_eps(eps, X)
    X = X.detach()
    F0 = attention_unchecked(X, w, residual)
    return _run(lambda Z: _fro(attention_unchecked(Z, w, residual) - F0), X, e, steps, restarts, seed)


def pgd_delta1(X: Tensor, w: AttentionWeights, eps: Eps, residual: bool = True, steps: int = PGD_STEPS,
               restarts: int = PGD_RESTARTS, seed: int = 0) -> Tensor:
    """Eq. 10: max ||H(X'-X) + sum_l P_l(X)(X'-X) VO_l||_F; Lemma 1 says it equals zeta(X) eps: (...,)."""
    w = prepare(X, w)
    e = check_eps(eps, X)
    X = X.detach()
    T, _ = zeta_gram(X, w, residual)  # T_X(G) = T.scale * T.matvec(G), on a flat batch (B, n, d)
    flat = (-1, *X.shape[-2:])
    return _run(lambda Z: (T.scale * _fro(T.matvec((Z - X).reshape(flat)))).reshape(X.shape[:-2]), X, e, steps,
                restarts, seed)


def pgd_delta2(X: Tensor, w: AttentionWeights, eps: Eps, steps: int = PGD_STEPS, restarts: int = PGD_RESTARTS,
               seed: int = 0) -> Tensor:
    """Eq. 13: max ||sum_l (P_l(X') - P_l(X)) X' VO_l||_F (with bv: (X' wv_l + bv_l) wo_l): (...,)."""
    w = prepare(X, w)
    e = check_eps(eps, X)
    X = X.detach()
    P0 = _probs_heads(X.unsqueeze(-3), w)  # (..., h, n, n)

    def obj(Z):
        Zh = Z.unsqueeze(-3)  # (..., 1, n, d)
        return _fro(((_probs_heads(Zh, w) - P0) @ _values_heads(Zh, w)).sum(-3))

    return _run(obj, X, e, steps, restarts, seed)


def pgd_delta21(X: Tensor, w: AttentionWeights, eps: Eps, steps: int = PGD_STEPS, restarts: int = PGD_RESTARTS,
                seed: int = 0) -> Tensor:
    """Eq. 16 per head: max ||P_l(X') - P_l(X)||_F, one PGD per head: (..., h)."""
    w = prepare(X, w)
    e = check_eps(eps, X)
    Xh, eh = _per_head(X.detach(), w, e)
    P0 = _probs_heads(Xh, w)  # (..., h, n, n)
    return _run(lambda Z: _fro(_probs_heads(Z, w) - P0), Xh, eh, steps, restarts, seed)


def pgd_delta22(X: Tensor, w: AttentionWeights, eps: Eps, steps: int = PGD_STEPS, restarts: int = PGD_RESTARTS,
                seed: int = 0) -> Tensor:
    """Eq. 22's Delta_22 per head: max ||X' VO_l|| (spectral; with bv: (X' wv_l + bv_l) wo_l): (..., h)."""
    w = prepare(X, w)
    e = check_eps(eps, X)
    Xh, eh = _per_head(X.detach(), w, e)
    return _run(lambda Z: spec(_values_heads(Z, w)), Xh, eh, steps, restarts, seed)
