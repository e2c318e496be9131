"""Exact reduced Gram operators for LoFAST's Lemma 1 (zeta) and Lemma 2 (||M_l||), batched, with deflation.

Both implement harness.kernels.krylov.GramOperator on a flat batch (B, N) and carry a per-operator scale c (B,)
(a cheap upper bound of the norm), so the scaled Gram spectrum lies in [0, 1] and nothing overflows. `matvec` /
`rmatvec` apply the scaled operator and its adjoint (the operator itself is scale * matvec): the one implementation
of eqs. 12 and 20 that the Lanczos solvers, the PGD lower bounds and the benchmarks use
(harness.bounds.lofast_ops builds them from (X, w)).

Lemma 2, reduced (docs/math.md §1): M_l(G) = G wq K^T + Q wk^T G^T depends on G only through G [wq wk].
With the QR [wq wk] = U [Rq Rk] (U: d x r orthonormal, r = min(d, 2 dh)) and Z = G U (n x r):
    M_l(G) = Z K'^T + Q' Z^T,  K' = K Rq^T, Q' = Q Rk^T  (n x r),
and ||G||_F >= ||Z||_F with equality at G = Z U^T, so ||M_l|| is the norm of R: Z -> Z K'^T + Q' Z^T exactly.
Gram on the domain side (N = n r, O(n r^2) per product, no n x n intermediate):
    R^T R Z = Z (K'^T K' + Q'^T Q') + Q' (Z^T K') + K' (Z^T Q'),
or on the codomain side (N = n^2, O(n^2 r)) when n < r: R R^T S = Y K'^T + Q' Y^T with Y = S K' + S^T Q'.
Scale c = ||K'||_F + ||Q'||_F >= ||R||. Deterministic upper bound: ||K'|| + ||Q'|| (= xi_l, eq. 21).

Lemma 1: T(G) = H G + sum_l P_l G wv_l wo_l on G (n x d); Gram T^T T by matvec then rmatvec (no reduction exists
when h dh = d: [wv_1 .. wv_h] is square). Scale c = ||H|| + sum_l ||P_l||_F ||wv_l||_F ||wo_l||_F >= ||T||
(Frobenius norms of the factors: no d x d product is formed).
"""
from __future__ import annotations

import torch

from harness.kernels.krylov import GramOperator
from harness.kernels.linalg import safe_norm
from harness.settings import GRAM_ROUNDING

Tensor = torch.Tensor


def _fro(t: Tensor) -> Tensor:
    """Overflow-free Frobenius norm over the last two axes."""
    return safe_norm(t.flatten(-2), -1)


def reduce_qk(wq: Tensor, wk: Tensor):
    """QR of [wq_l wk_l]: U (h, d, r), Rq, Rk (h, r, dh), r = min(d, 2 dh)."""
    dh = wq.shape[-1]
    U, R = torch.linalg.qr(torch.cat([wq, wk], -1))
    return U, R[..., :dh], R[..., dh:]


class MGram(GramOperator):
    """Reduced Lemma 2 operators, one per row: Kp, Qp (B, n, r) (unscaled); side "domain" or "codomain"."""

    def __init__(self, Kp: Tensor, Qp: Tensor, side: str = "auto"):
        n, r = Kp.shape[-2:]
        self.side = ("domain" if r <= n else "codomain") if side == "auto" else side
        if self.side not in ("domain", "codomain"):
            raise ValueError(f"side must be 'auto', 'domain' or 'codomain', got {side!r}")
        self.scale = _fro(Kp) + _fro(Qp)
        c = torch.where(self.scale > 0, self.scale, torch.ones_like(self.scale))[:, None, None]
        self.scale = torch.where(torch.isfinite(self.scale), self.scale, torch.ones_like(self.scale))
        self.K, self.Q = Kp / c, Qp / c  # scaled: ||R|| <= 1
        self.n, self.r = n, r
        self.dim = n * r if self.side == "domain" else n * n
        if self.side == "domain":
            self.C = self.K.transpose(-1, -2) @ self.K + self.Q.transpose(-1, -2) @ self.Q  # (B, r, r)
            self.KQ = torch.cat([self.K, self.Q], -1)  # (B, n, 2r)

    def matvec(self, Z: Tensor) -> Tensor:
        """The scaled reduced operator R(Z) = Z K'^T + Q' Z^T: (B, n, r) -> (B, n, n)."""
        return Z @ self.K.transpose(-1, -2) + self.Q @ Z.transpose(-1, -2)

    def rmatvec(self, S: Tensor) -> Tensor:
        """Its adjoint R^T(S) = S K' + S^T Q': (B, n, n) -> (B, n, r)."""
        return S @ self.K + S.transpose(-1, -2) @ self.Q

    def gram(self, V: Tensor) -> Tensor:
        B = V.shape[0]
        if self.side == "domain":
            Z = V.reshape(B, self.n, self.r)
            T = Z.transpose(-1, -2) @ self.KQ  # (B, r, 2r) = [Z^T K', Z^T Q']
            out = torch.baddbmm(Z @ self.C, self.Q, T[..., : self.r])
            return torch.baddbmm(out, self.K, T[..., self.r:]).reshape(B, -1)
        return self.matvec(self.rmatvec(V.reshape(B, self.n, self.n))).reshape(B, -1)

    def select(self, keep: Tensor) -> "MGram":
        new = MGram.__new__(MGram)
        new.__dict__.update({k: (v[keep] if isinstance(v, Tensor) else v) for k, v in self.__dict__.items()})
        return new

    def to(self, dtype) -> "MGram":
        new = MGram.__new__(MGram)
        new.__dict__.update({k: (v.to(dtype) if isinstance(v, Tensor) and k != "scale" else v)
                             for k, v in self.__dict__.items()})
        return new

    def spectral_upper(self) -> Tensor:
        """Deterministic ||K'|| + ||Q'|| >= ||R|| (= xi_l, eq. 21), unscaled, from r x r Gram eigenvalues: (B,)."""
        KtK = self.K.transpose(-1, -2) @ self.K
        QtQ = self.Q.transpose(-1, -2) @ self.Q
        top = lambda G: torch.linalg.eigvalsh(G)[..., -1].clamp_min(0).sqrt()
        slack = 1 + GRAM_ROUNDING * torch.finfo(self.K.dtype).eps * self.r  # rounding of the Gram eigenvalues
        return (top(KtK) + top(QtQ)) * slack * self.scale

    def right_vector(self, V: Tensor) -> Tensor:
        """Unit right singular vector Z (B, n, r) from the Lanczos vector of this side."""
        B = V.shape[0]
        if self.side == "domain":
            Z = V.reshape(B, self.n, self.r)
        else:
            Z = self.rmatvec(V.reshape(B, self.n, self.n))
        return Z / _fro(Z).clamp_min(torch.finfo(V.dtype).tiny)[:, None, None]


class ZetaGram(GramOperator):
    """Lemma 1 operators T(G) = H G + sum_l P_l G wv_l wo_l, one per row of P (B, h, n, n); Gram on G (n x d)."""

    def __init__(self, P: Tensor, wv: Tensor, wo: Tensor, residual: bool):
        h, d, dh = wv.shape
        self.h, self.dh, self.d, self.n = h, dh, d, P.shape[-1]
        self.Wv = wv.permute(1, 0, 2).reshape(d, h * dh)  # (d, h*dh): all heads' wv side by side
        self.Wo = wo.reshape(h * dh, d)  # (h*dh, d): concat @ Wo sums the heads
        vo = _fro(wv) * _fro(wo)  # (h,): ||wv_l||_F ||wo_l||_F >= ||VO_l||_F, without forming a product
        c = (1.0 if residual else 0.0) + (_fro(P) * vo).sum(-1)  # (B,) >= ||T||
        self.scale = torch.where(torch.isfinite(c) & (c > 0), c, 1.0)
        self.P = P / self.scale[:, None, None, None]
        self.res = (1.0 if residual else 0.0) / self.scale  # (B,)
        self.dim = self.n * d

    def _heads(self, Z: Tensor) -> Tensor:  # (B, n, h*dh) -> (B, h, n, dh)
        return Z.unflatten(-1, (self.h, self.dh)).transpose(-2, -3)

    def _cat(self, Z: Tensor) -> Tensor:  # (B, h, n, dh) -> (B, n, h*dh)
        return Z.transpose(-2, -3).flatten(-2)

    def matvec(self, G: Tensor) -> Tensor:  # (B, n, d), scaled T: T_X(G) = scale * matvec(G)
        return self._cat(self.P @ self._heads(G @ self.Wv)) @ self.Wo + self.res[:, None, None] * G

    def rmatvec(self, Y: Tensor) -> Tensor:
        return (self._cat(self.P.transpose(-1, -2) @ self._heads(Y @ self.Wo.T)) @ self.Wv.T
                + self.res[:, None, None] * Y)

    def gram(self, V: Tensor) -> Tensor:
        B = V.shape[0]
        return self.rmatvec(self.matvec(V.reshape(B, self.n, self.d))).reshape(B, -1)

    def to(self, dtype) -> "ZetaGram":
        new = ZetaGram.__new__(ZetaGram)
        new.__dict__.update({k: (v.to(dtype) if isinstance(v, Tensor) and k != "scale" else v)
                             for k, v in self.__dict__.items()})
        return new

    def select(self, keep: Tensor) -> "ZetaGram":
        new = ZetaGram.__new__(ZetaGram)
        new.__dict__.update(self.__dict__)
        new.P, new.res, new.scale = self.P[keep], self.res[keep], self.scale[keep]
        return new
