"""Input checks, the operator builders and the dense oracles behind harness.bounds.lofast (LoFAST, docs/math.md §1).

The two linear operators on perturbations G in R^{n x d} are harness.kernels.operators' Gram operators, built
here from (X, w) for every caller (the Lanczos solvers in lofast.py, the PGD in lofast_pgd.py, the benchmarks):
- Lemma 1 (eq. 12): T_X(G) = H G + sum_l P_l(X) G VO_l (`zeta_gram` -> ZetaGram). In row-major vec
  (vec(G) = G.reshape(-1)) its matrix is H (x) I_d + sum_l P_l (x) VO_l^T (`zeta_dense_matrix`, the dense oracle).
- Lemma 2 (eq. 20): M_l(G) = G B_l X^T + X B_l G^T (n x n), B_l = wq_l wk_l^T. With query/key biases the same
  maximum (Lemma 2's left side for the biased scores) is attained by G -> G wq_l K_l^T + Q_l wk_l^T G^T with
  Q_l = X wq_l + bq_l, K_l = X wk_l + bk_l (equal to eq. 20 when the biases are absent); `m_gram` -> MGram is
  its exact reduction to n x r (harness.kernels.operators), `m_dense_matrix` eq. 20 as printed (the dense oracle).
"""
from __future__ import annotations

import math
from typing import Union

import torch

from harness.kernels.attention import AttentionWeights, causal_mask, check_pair, probs, project
from harness.kernels.linalg import all_finite, prod_norm, spec  # noqa: F401 (re-exported for harness.bounds.lofast)
from harness.kernels.operators import MGram, ZetaGram, reduce_qk

Tensor = torch.Tensor


def prepare(X: Tensor, w: AttentionWeights) -> AttentionWeights:
    """Validate (X, w) by the toolkit's one input rule (kernels.attention.check_pair: float32/float64, weights of
    X's dtype and device, never cast silently) and return w."""
    check_pair(X, w)
    return w


def check_eps(eps: Union[float, Tensor], X: Tensor) -> Tensor:
    """eps as a tensor on X's device/dtype broadcastable to the batch shape X.shape[:-2]; ValueError if bad."""
    if isinstance(eps, bool) or not isinstance(eps, (int, float, torch.Tensor)):
        raise ValueError(f"eps must be a number or a tensor, got {type(eps).__name__}")
    e = torch.as_tensor(eps, dtype=X.dtype, device=X.device)
    if not all_finite(e):
        raise ValueError(f"eps must be finite, got {eps}")
    if (e < 0).any():
        raise ValueError(f"eps must be >= 0, got {eps}")
    try:
        ok = torch.broadcast_shapes(e.shape, X.shape[:-2]) == X.shape[:-2]
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(f"eps of shape {tuple(e.shape)} does not broadcast to the batch shape {tuple(X.shape[:-2])}")
    return e


def check_softmax_lip(c: float) -> float:
    """The row-softmax l2 Lipschitz constant used by eq. 17: any value >= 1/2 is valid (JaSMin Cor. 1)."""
    if not isinstance(c, (int, float)) or isinstance(c, bool) or not math.isfinite(c):
        raise ValueError(f"softmax_lip must be a finite number, got {c!r}")
    if c < 0.5:
        raise ValueError(f"softmax_lip = {c} is not a valid Lipschitz constant of the row softmax: "
                         f"the sharp constant is 1/2 (JaSMin Cor. 1), so softmax_lip must be >= 0.5")
    return float(c)


def stable_probs(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """P_l(X) (..., h, n, n), finite for every finite X: scores that overflow (|S| > max float, e.g. X * 1e200)
    are computed from the normalized Q, K and clamped to +-max, so the rows become the limit (hard) softmax
    instead of NaN. Equal to kernels.attention.probs whenever the scores are finite."""
    P = probs(X, w, causal)
    if all_finite(P):
        return P
    Q, K = query_key(X, w)  # (..., h, n, dh)
    sq = Q.abs().amax((-1, -2), keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)
    sk = K.abs().amax((-1, -2), keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)
    S = ((Q / sq) @ (K / sk).transpose(-1, -2)) * (sq / math.sqrt(w.dh)) * sk  # +-inf, never NaN
    big = torch.finfo(X.dtype).max
    S = S.nan_to_num(nan=0.0, posinf=big, neginf=-big)
    if causal:
        S = S.masked_fill(causal_mask(X.shape[-2], X.device), float("-inf"))
    return torch.softmax(S, dim=-1)


# ---- Lemma 1 operator -------------------------------------------------------------------------------------
def zeta_gram(X: Tensor, w: AttentionWeights, residual: bool, causal: bool = False):
    """(op, P): the Lemma 1 operators T_X of every input of X (..., n, d), one row of a flat batch
    B = prod(X.shape[:-2]) (ZetaGram, scaled: T_X(G) = op.scale * op.matvec(G) for G (B, n, d)), and their
    P_l(X) (B, h, n, n) by stable_probs."""
    n = X.shape[-2]
    P = stable_probs(X, w, causal).reshape(-1, w.h, n, n)
    return ZetaGram(P, w.wv, w.wo, residual), P


def zeta_dense_matrix(X: Tensor, w: AttentionWeights, residual: bool = True, causal: bool = False) -> Tensor:
    """Explicit eq. 12 matrix H (x) I_d + sum_l P_l (x) VO_l^T (nd x nd) for one X (n, d): the dense oracle."""
    n, d = X.shape
    P = probs(X, w, causal)  # (h, n, n)
    VO = w.VO()  # (h, d, d)
    T = sum(torch.kron(P[l], VO[l].T.contiguous()) for l in range(w.h))
    if residual:
        T = T + torch.kron(torch.eye(n, dtype=X.dtype, device=X.device), torch.eye(d, dtype=X.dtype, device=X.device))
    return T


# ---- Lemma 2 operator -------------------------------------------------------------------------------------
def query_key(X: Tensor, w: AttentionWeights):
    """Q_l = X wq_l + bq_l, K_l = X wk_l + bk_l: (..., n, d) -> two (..., h, n, dh) (unscaled)."""
    return project(X, w.wq, w.bq), project(X, w.wk, w.bk)  # (..., h, n, dh) each


def m_gram(X: Tensor, w: AttentionWeights, side: str = "auto"):
    """The reduced Lemma 2 operators of every input and head of X (..., n, d), one row of a flat batch
    B = prod(X.shape[:-2]) h (MGram, scaled by op.scale (B,)), and U (h, d, r): ||M_l(X)|| = op.scale * ||R||,
    R: Z -> Z K'^T + Q' Z^T on Z = G U_l (n x r), harness.kernels.operators."""
    n = X.shape[-2]
    Q, K = query_key(X, w)  # (..., h, n, dh)
    U, Rq, Rk = reduce_qk(w.wq, w.wk)  # (h, d, r), (h, r, dh)
    Kp = (K @ Rq.transpose(-1, -2)).reshape(-1, n, U.shape[-1])  # (B, n, r)
    Qp = (Q @ Rk.transpose(-1, -2)).reshape(-1, n, U.shape[-1])
    return MGram(Kp, Qp, side), U


def m_dense_matrix(X: Tensor, w: AttentionWeights, l: int) -> Tensor:
    """Explicit eq. 20 matrix M_l(X) (n^2 x nd) for one bias-free X (n, d), from the paper's formula.

    M_l = I_n (x) [x_1^T B^T; ...; x_n^T B^T] + sum_i (e_i (x) I_n) (x) (x_i^T B), B = wq_l wk_l^T,
    acting on the row-major vec of G (rows Gamma_1, ..., Gamma_n stacked) and returning beta_{ij} at i*n+j.
    """
    w.require_no_bias("m_dense_matrix (eq. 20 as printed)")
    n, d = X.shape
    B = w.B()[l]  # (d, d)
    eye = torch.eye(n, dtype=X.dtype, device=X.device)
    rows = torch.stack([X[j] @ B.T for j in range(n)])  # (n, d): x_j^T B^T
    M = torch.kron(eye, rows)
    for i in range(n):
        M = M + torch.kron(torch.kron(eye[:, i:i + 1], eye), (X[i] @ B)[None, :])
    return M
