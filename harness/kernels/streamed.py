"""The layer Jacobian's products without an n x n map: query blocks x key blocks, FlashAttention style
(docs/math.md §3 and §4, docs/notes/kernels.md "Long contexts").

Setup (once per X): q, k, v per head (..., h, n, dh), RoPE applied to q and k when given, then one pass over key
blocks per query block with the online-softmax recurrence (running row max m, running sum l, rescaled output)
gives every row's log-sum-exp `lse` (..., h, n) and the head outputs O = P v (..., h, n, dh). Nothing n x n is
kept: a block of probabilities P_ij = exp(q_i k_j^T / sqrt(dh) - lse_i) (masked above the diagonal when causal)
is recomputed whenever a product needs it.

Products, with the notation of kernels.layer (dS the score differential, c_i = rowsum(P * dS)_i):
    jvp:  dF = sum_l (sum_j (P * dS)_ij v_j - c_i O_i + sum_j P_ij dv_j) wo_l,
    vjp:  D_i = (G wo_l^T)_i . O_i / sqrt(dh) = rowsum(P * (G wo_l^T v^T / sqrt(dh)))_i (FlashAttention's D),
          dS_ij = P_ij ((G wo_l^T)_i . v_j / sqrt(dh) - D_i),  dq = dS k,  dk = dS^T q,  dv = P^T G wo_l^T,
each a sum over blocks with accumulators of size n x dh. Memory is linear in n (block sizes STREAM_BLOCK_Q x
STREAM_BLOCK_K from harness.settings); the flops are the materialised route's plus one recomputed score block per
product and direction. RoPE (cos, sin (n, dh), rotate-half convention) acts on q and k before the scores: dq, dk
are rotated in the jvp and rotated back (the transpose) in the vjp. GQA / MQA layers are per-query-head weights
with shared key/value columns (harness.models.adapters_modern), which this operator reads like any other.

Lemma 1's zeta operator needs only products with P and P^T (StreamedZetaGram); Lemma 2's reduced ||M_l|| operator
(kernels.operators.MGram) acts on n x r on its domain side, which it takes whenever n >= r, so it holds nothing
n x n at long n already.

Public: StreamedLayer (setup + products + P-products for zeta), StreamedZetaGram, streamed_operator ((matvec,
rmatvec) like kernels.layer.layer_operator), rope_tables, rotate, rotate_t (RoPE tables and rotations).
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import torch

from harness.settings import STREAM_BLOCK_K, STREAM_BLOCK_Q

from .attention import check_input
from .operators import ZetaGram

Tensor = torch.Tensor


def _heads(t: Tensor, h: int) -> Tensor:  # (..., n, h*dh) -> (..., h, n, dh)
    return t.unflatten(-1, (h, -1)).transpose(-2, -3)


def _merge(t: Tensor) -> Tensor:  # (..., h, n, dh) -> (..., n, h*dh)
    return t.transpose(-2, -3).flatten(-2)


def rope_tables(n: int, dh: int, theta: float, dtype=torch.float64, device=None) -> Tuple[Tensor, Tensor]:
    """(cos, sin) (n, dh) of rotary embeddings at positions 0..n-1 (Llama's rotate-half layout, base `theta`)."""
    inv = 1.0 / theta ** (torch.arange(0, dh, 2, dtype=torch.float64, device=device) / dh)
    ang = torch.arange(n, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], -1)
    return ang.cos().to(dtype), ang.sin().to(dtype)


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """x cos + rotate_half(x) sin, rotate_half(x) = [-x2, x1]."""
    h = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., h:], x[..., :h]), -1) * sin


def rotate_t(y: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """The transpose of rotate: y cos + rotate_half^T(y sin), rotate_half^T(z) = [z2, -z1]."""
    h = y.shape[-1] // 2
    z = y * sin
    return y * cos + torch.cat((z[..., h:], -z[..., :h]), -1)


class StreamedLayer:
    """Forward quantities of the layer F(X) = sum_l P_l (X wv_l + bv_l) wo_l + bo at X (..., n, d), kept at O(n d),
    and the blockwise products (module docstring). w: AttentionWeights or kernels.layer.BatchedWeights;
    rope: (cos, sin) (n, dh) or None; block: (query rows, key columns) per block, default from harness.settings."""

    def __init__(self, X: Tensor, w, causal: bool = False, rope: Optional[Tuple[Tensor, Tensor]] = None,
                 block: Optional[Tuple[int, int]] = None):
        check_input(X, w.d)
        X = X.detach()
        self.h, self.dh, self.n = w.wq.shape[-3], w.dh, X.shape[-2]
        self.causal, self.rope = bool(causal), rope
        self.bq, self.bk = block if block is not None else (STREAM_BLOCK_Q, STREAM_BLOCK_K)
        if self.bq < 1 or self.bk < 1:
            raise ValueError(f"block sizes must be >= 1, got {(self.bq, self.bk)}")
        self.sc = 1.0 / math.sqrt(self.dh)
        self.Wqkv = torch.cat([t.transpose(-2, -3).flatten(-2) for t in (w.wq, w.wk, w.wv)], dim=-1)
        self.Wo = w.wo.flatten(-3, -2)  # (..., h*dh, d)
        q, k, v = (_heads(t, self.h) for t in (X @ self.Wqkv).chunk(3, dim=-1))
        q = q if w.bq is None else q + w.bq.unsqueeze(-2)
        k = k if w.bk is None else k + w.bk.unsqueeze(-2)
        self.v = v if w.bv is None else v + w.bv.unsqueeze(-2)
        if rope is not None:
            q, k = self._rot(q), self._rot(k)
        self.q, self.k = q, k
        self.lse, self.O = self._forward()

    # ---- blocks -------------------------------------------------------------------------------------------
    def _rot(self, x: Tensor) -> Tensor:
        return x if self.rope is None else rotate(x, *self.rope)

    def _rot_t(self, x: Tensor) -> Tensor:
        return x if self.rope is None else rotate_t(x, *self.rope)

    def _keys(self, i0: int, i1: int):
        """Key block ranges that query rows [i0, i1) see (all, or up to i1 - 1 when causal)."""
        end = i1 if self.causal else self.n
        return [(j0, min(j0 + self.bk, end)) for j0 in range(0, end, self.bk)]

    def _queries(self):
        return [(i0, min(i0 + self.bq, self.n)) for i0 in range(0, self.n, self.bq)]

    def _scores(self, i0: int, i1: int, j0: int, j1: int) -> Tensor:
        """q_i k_j^T / sqrt(dh) (..., h, bi, bj), -inf above the diagonal when causal."""
        S = (self.q[..., i0:i1, :] * self.sc) @ self.k[..., j0:j1, :].transpose(-1, -2)
        if self.causal and j1 - 1 > i0:
            above = (torch.arange(j0, j1, device=S.device)[None, :]
                     > torch.arange(i0, i1, device=S.device)[:, None])
            S = S.masked_fill(above, float("-inf"))
        return S

    def probs(self, i0: int, i1: int, j0: int, j1: int) -> Tensor:
        """The block P[i0:i1, j0:j1] of every head's attention map, recomputed from the row log-sum-exps."""
        return torch.exp(self._scores(i0, i1, j0, j1) - self.lse[..., i0:i1, None])

    def _forward(self):
        """Row log-sum-exps and O = P v by the online-softmax recurrence over key blocks."""
        lse, O = torch.empty_like(self.q[..., 0]), torch.empty_like(self.v)
        for i0, i1 in self._queries():
            m = l = acc = None
            for j0, j1 in self._keys(i0, i1):
                S = self._scores(i0, i1, j0, j1)
                mb = S.amax(-1)
                if m is None:
                    m = mb
                    p = torch.exp(S - m[..., None])
                    l, acc = p.sum(-1), p @ self.v[..., j0:j1, :]
                    continue
                mn = torch.maximum(m, mb)
                a = torch.exp(m - mn)
                p = torch.exp(S - mn[..., None])
                l = l * a + p.sum(-1)
                acc = acc * a[..., None] + p @ self.v[..., j0:j1, :]
                m = mn
            lse[..., i0:i1] = m + torch.log(l)
            O[..., i0:i1, :] = acc / l[..., None]
        return lse, O

    # ---- P products (zeta's operator) ---------------------------------------------------------------------
    def p_apply(self, Y: Tensor, transpose: bool = False) -> Tensor:
        """P Y (or P^T Y) per head: Y (..., h, n, c) -> (..., h, n, c), blockwise."""
        out = torch.zeros(torch.broadcast_shapes(Y.shape[:-2], self.q.shape[:-2]) + Y.shape[-2:],
                          dtype=Y.dtype, device=Y.device)
        for i0, i1 in self._queries():
            for j0, j1 in self._keys(i0, i1):
                P = self.probs(i0, i1, j0, j1)
                if transpose:
                    out[..., j0:j1, :] += P.transpose(-1, -2) @ Y[..., i0:i1, :]
                else:
                    out[..., i0:i1, :] += P @ Y[..., j0:j1, :]
        return out

    def fro(self) -> Tensor:
        """||P_l||_F of every head (..., h), blockwise."""
        sq = 0
        for i0, i1 in self._queries():
            for j0, j1 in self._keys(i0, i1):
                sq = sq + self.probs(i0, i1, j0, j1).square().sum((-1, -2))
        return torch.as_tensor(sq).sqrt()

    # ---- the layer Jacobian -------------------------------------------------------------------------------
    def matvec(self, U: Tensor) -> Tensor:
        """J_F(X) U: (..., n, d) -> (..., n, d) (U may carry more batch dims than X)."""
        dq, dk, dv = (_heads(t, self.h) for t in (U @ self.Wqkv).chunk(3, dim=-1))
        dq, dk = self._rot(dq) * self.sc, self._rot(dk)
        shape = torch.broadcast_shapes(dq.shape[:-2], self.q.shape[:-2])
        out = torch.empty(shape + self.v.shape[-2:], dtype=U.dtype, device=U.device)
        for i0, i1 in self._queries():
            A = B = c = 0
            dqi, qsi = dq[..., i0:i1, :], self.q[..., i0:i1, :] * self.sc
            for j0, j1 in self._keys(i0, i1):
                P = self.probs(i0, i1, j0, j1)
                dS = dqi @ self.k[..., j0:j1, :].transpose(-1, -2) + qsi @ dk[..., j0:j1, :].transpose(-1, -2)
                PdS = P * dS
                c = c + PdS.sum(-1, keepdim=True)
                A = A + PdS @ self.v[..., j0:j1, :]
                B = B + P @ dv[..., j0:j1, :]
            out[..., i0:i1, :] = A - c * self.O[..., i0:i1, :] + B
        return _merge(out) @ self.Wo

    def rmatvec(self, G: Tensor) -> Tensor:
        """J_F(X)^T G: (..., n, d) -> (..., n, d)."""
        Gh = _heads(G @ self.Wo.transpose(-1, -2), self.h)  # (..., h, n, dh)
        Gs = Gh * self.sc
        D = (Gs * self.O).sum(-1, keepdim=True)  # (..., h, n, 1)
        shape = torch.broadcast_shapes(Gh.shape[:-2], self.q.shape[:-2]) + self.q.shape[-2:]
        dq, dk, dv = (torch.zeros(shape, dtype=G.dtype, device=G.device) for _ in range(3))
        for i0, i1 in self._queries():
            Gsi, Ghi, Di = Gs[..., i0:i1, :], Gh[..., i0:i1, :], D[..., i0:i1, :]
            for j0, j1 in self._keys(i0, i1):
                P = self.probs(i0, i1, j0, j1)
                dS = P * (Gsi @ self.v[..., j0:j1, :].transpose(-1, -2) - Di)
                dq[..., i0:i1, :] += dS @ self.k[..., j0:j1, :]
                dk[..., j0:j1, :] += dS.transpose(-1, -2) @ self.q[..., i0:i1, :]
                dv[..., j0:j1, :] += P.transpose(-1, -2) @ Ghi
        dq, dk = self._rot_t(dq), self._rot_t(dk)
        return torch.cat([_merge(dq), _merge(dk), _merge(dv)], dim=-1) @ self.Wqkv.transpose(-1, -2)


class StreamedZetaGram(ZetaGram):
    """Lemma 1's operators T(G) = H G + sum_l P_l G wv_l wo_l (kernels.operators.ZetaGram) with the P products
    streamed from a StreamedLayer of a flat batch X (B, n, d): same scale (||P_l||_F summed blockwise), same
    products to rounding, nothing n x n kept. No deflation (select: None): rows stay in the batch."""

    def __init__(self, s: StreamedLayer, wv: Tensor, wo: Tensor, residual: bool):
        h, d, dh = wv.shape
        self.s, self.h, self.dh, self.d, self.n = s, h, dh, d, s.n
        self.Wv, self.Wo = wv.permute(1, 0, 2).reshape(d, h * dh), wo.reshape(h * dh, d)
        vo = wv.flatten(-2).norm(dim=-1) * wo.flatten(-2).norm(dim=-1)  # (h,)
        c = (1.0 if residual else 0.0) + (s.fro() * vo).sum(-1)  # (B,) >= ||T||
        self.scale = torch.where(torch.isfinite(c) & (c > 0), c, 1.0)
        self.res = (1.0 if residual else 0.0) / self.scale
        self.dim = self.n * d

    def matvec(self, G: Tensor) -> Tensor:
        Y = self._cat(self.s.p_apply(self._heads(G @ self.Wv))) @ self.Wo
        return Y / self.scale[:, None, None] + self.res[:, None, None] * G

    def rmatvec(self, Y: Tensor) -> Tensor:
        Z = self._cat(self.s.p_apply(self._heads(Y @ self.Wo.T), transpose=True)) @ self.Wv.T
        return Z / self.scale[:, None, None] + self.res[:, None, None] * Y

    def select(self, keep: Tensor):
        return None

    def to(self, dtype):
        raise NotImplementedError("StreamedZetaGram: build it from a StreamedLayer of the wanted dtype")


def streamed_operator(X: Tensor, w, causal: bool = False, rope: Optional[Tuple[Tensor, Tensor]] = None,
                      block: Optional[Tuple[int, int]] = None):
    """(matvec, rmatvec) of J_F(X), like kernels.layer.layer_operator, with no n x n map held (StreamedLayer)."""
    s = StreamedLayer(X, w, causal, rope, block)
    return s.matvec, s.rmatvec
