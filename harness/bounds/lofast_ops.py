"""Matrix-free operators and input checks behind harness.bounds.lofast (LoFAST, docs/math.md §1).

Two linear operators on perturbations G in R^{n x d}, never materialized:
- Lemma 1 (eq. 12): T_X(G) = H G + sum_l P_l(X) G VO_l, adjoint T_X^*(Y) = H^T Y + sum_l P_l^T Y VO_l^T.
  In row-major vec (vec(G) = G.reshape(-1)) its matrix is H (x) I_d + sum_l P_l (x) VO_l^T.
- Lemma 2 (eq. 20): M_l(G) = G B_l X^T + X B_l G^T (n x n), adjoint S -> S X B_l^T + S^T X B_l, B_l = wq_l wk_l^T.
  With query/key biases the same maximum (Lemma 2's left side for the biased scores) is attained by
  G -> G wq_l K_l^T + Q_l wk_l^T G^T with Q_l = X wq_l + bq_l, K_l = X wk_l + bk_l (equal to eq. 20 when the
  biases are absent), which is what is implemented: all products go through the rank-dh factors
  (cost O(n d dh + n^2 dh) per head and matvec, memory O(n^2 + n d) per head).
"""
from __future__ import annotations

import math
from typing import Union

import torch

from harness.kernels.attention import AttentionWeights, causal_mask, check_pair, probs, project
from harness.kernels.linalg import prod_norm, spec  # noqa: F401 (re-exported for harness.bounds.lofast)

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
    if not torch.isfinite(e).all():
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
    if bool(torch.isfinite(P).all()):
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
class ZetaOperator:
    """T_X(G) = H G + sum_l P_l G wv_l wo_l on G (..., n, d), batched over X's leading axes (Lemma 1)."""

    def __init__(self, X: Tensor, w: AttentionWeights, residual: bool, causal: bool = False):
        self.P = probs(X, w, causal)  # (..., h, n, n), biases included
        self.PT = self.P.transpose(-1, -2)
        self.h, self.dh = w.h, w.dh
        self.Wv = w.wv.permute(1, 0, 2).reshape(w.d, w.h * w.dh)  # (d, h*dh): all heads' wv side by side
        self.Wo = w.wo.reshape(w.h * w.dh, w.d)  # (h*dh, d): stacked wo, so concat @ Wo sums the heads
        self.residual = residual

    def _heads(self, Z: Tensor) -> Tensor:  # (..., n, h*dh) -> (..., h, n, dh)
        return Z.unflatten(-1, (self.h, self.dh)).transpose(-2, -3)

    def _cat(self, Z: Tensor) -> Tensor:  # (..., h, n, dh) -> (..., n, h*dh)
        return Z.transpose(-2, -3).flatten(-2)

    def matvec(self, G: Tensor) -> Tensor:  # (..., n, d) -> (..., n, d)
        Y = self._cat(self.P @ self._heads(G @ self.Wv)) @ self.Wo  # sum_l P_l (G wv_l) wo_l
        return Y + G if self.residual else Y

    def rmatvec(self, Y: Tensor) -> Tensor:  # (..., n, d) -> (..., n, d)
        G = self._cat(self.PT @ self._heads(Y @ self.Wo.T)) @ self.Wv.T  # sum_l P_l^T (Y wo_l^T) wv_l^T
        return G + Y if self.residual else G


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


class MOperator:
    """M_l(X): G -> G B_l X^T + X B_l G^T for all heads at once; G (..., h, n, d) -> S (..., h, n, n) (eq. 20)."""

    def __init__(self, X: Tensor, w: AttentionWeights):
        self.Q, self.K = query_key(X, w)  # (..., h, n, dh)
        self.w = w

    def matvec(self, G: Tensor) -> Tensor:  # (..., h, n, d) -> (..., h, n, n)
        Gq = G @ self.w.wq  # (..., h, n, dh) = G wq_l
        Gk = G @ self.w.wk
        return Gq @ self.K.transpose(-1, -2) + self.Q @ Gk.transpose(-1, -2)

    def rmatvec(self, S: Tensor) -> Tensor:  # (..., h, n, n) -> (..., h, n, d)
        return ((S @ self.K) @ self.w.wq.transpose(-1, -2)
                + (S.transpose(-1, -2) @ self.Q) @ self.w.wk.transpose(-1, -2))


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
