"""Certificates after an early Lanczos breakdown: deflate the invariant subspace found and search its complement.

A Lanczos run that breaks down at step k < N has found an invariant subspace S (its Krylov space) and the exact top
eigenvalue of the operator on S, not on the whole space. Kuczynski and Wozniakowski's bound then says nothing about
what S misses: in exact arithmetic a random start has a component along every eigenvector, but a start without one
(chosen by someone who knew it, or lost to rounding) reports the top of S as the top of the operator, and a padding
of 0 on it is wrong (a layer built against a public start made every certificate 1/3 to 1/5 of the truth).

`settle` handles every row of a certified solve that broke down before spanning its space (LanczosResult.early):
1. the Krylov space of the row's own start is rebuilt (Lanczos with full reorthogonalization, stopping at the
   breakdown), giving an orthonormal basis Q of S and the top Ritz value of S;
2. a fresh Gaussian start, seeded by a hash of the row's start and the round (harness.kernels.starts), is projected
   onto the complement of Q, and Lanczos runs on P A P (P = I - Q Q^T, reapplied at every product so rounding
   cannot leak back into S). If it breaks down again, its subspace joins Q and another round starts;
3. a round that does not break down within ROUND_STEPS products gives the Kuczynski-Wozniakowski estimate of the
   complement's top eigenvalue (its start is uniform on the complement's sphere; the bound is taken in dimension N,
   which only loosens it); when Q spans the whole space the subspaces' values are the spectrum's top, exactly.

The row's upper estimate is then max(top of the subspaces found (padded for rounding), the complement's KW
estimate); its value the largest Ritz value seen. Every round adds at least one dimension to Q or settles its
row, so N + ROUND_STEPS products always suffice; the rounds stop earlier only when Q would outgrow
settings.WORKSPACE_BYTES, and rows still unsettled then get an infinite upper estimate (the callers' deterministic
caps, eq. 9 and xi_l, still apply): never a certificate that rests on a subspace alone. The products are counted
in the result's `products`.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from harness.kernels.starts import gaussian_rows
from harness.settings import RITZ_ROUNDING, WORKSPACE_BYTES

Tensor = torch.Tensor

ROUND_STEPS = 60  # products per deflation round before the complement's KW estimate is taken


def _project(w: Tensor, Q: Tensor) -> Tensor:
    """w (B, N) minus its components in the rows' bases Q (B, K, N) (orthonormal rows, zero rows allowed), twice."""
    if Q.shape[1] == 0:
        return w
    for _ in range(2):
        w = w - torch.einsum("bk,bkn->bn", torch.einsum("bkn,bn->bk", Q, w), Q)
    return w


def _round(gram, x: Tensor, Q: Tensor, live: Tensor, kmax: int):
    """Lanczos with full reorthogonalization on P A P from x (B, N), rows `live` only (others carry zeros).
    Returns (V (B, kmax, N), H (B, kmax, kmax), k (B,) basis size, broke (B,) bool: stopped on an invariant
    subspace or on spanning the complement)."""
    B, N = x.shape
    dt, dev = x.dtype, x.device
    tiny = torch.finfo(dt).tiny
    eps = torch.finfo(dt).eps
    V = torch.zeros(B, kmax, N, dtype=dt, device=dev)
    H = torch.zeros(B, kmax, kmax, dtype=dt, device=dev)
    k = torch.zeros(B, dtype=torch.long, device=dev)
    broke = torch.zeros(B, dtype=torch.bool, device=dev)
    v = _project(x, Q)
    nrm = v.norm(dim=-1)
    go = live & (nrm > math.sqrt(tiny)) & torch.isfinite(nrm)
    broke |= live & ~go  # nothing left of the start outside Q: the complement is empty (Q spans the space)
    v = torch.where(go[:, None], v / torch.where(go, nrm, torch.ones_like(nrm))[:, None], torch.zeros_like(v))
    hmax = torch.zeros(B, dtype=dt, device=dev)
    for j in range(kmax):
        if not bool(go.any()):
            break
        V[:, j] = v
        k = torch.where(go, k + 1, k)
        w = _project(gram(v), Q)
        for sweep in range(2):  # against this round's basis; the first sweep's coefficients are H's new row
            c = torch.einsum("bkn,bn->bk", V[:, :j + 1], w)
            w = w - torch.einsum("bk,bkn->bn", c, V[:, :j + 1])
            if sweep == 0:
                H[:, j, :j + 1] = torch.where(go[:, None], c, H[:, j, :j + 1])
        H[:, :j + 1, j] = H[:, j, :j + 1].clone()
        hmax = torch.maximum(hmax, H[:, j, :j + 1].abs().amax(-1))
        beta = w.norm(dim=-1)
        stop = go & ((beta <= 100 * eps * hmax.clamp_min(tiny)) | ~torch.isfinite(beta))
        broke |= stop
        go = go & ~stop
        v = torch.where(go[:, None], w / torch.where(go, beta, torch.ones_like(beta))[:, None], torch.zeros_like(w))
    return V, H, k, broke


def settle(gram, x0: Tensor, value: Tensor, vector: Tensor, upper: Tensor, early: Tensor, scale: Tensor,
           fail_prob: float, kw_epsilon, products: int = 0):
    """(value, vector, upper, products) with every `early` row's certificate settled (module docstring). gram: the
    scaled Gram operator on the whole batch (B, N) -> (B, N); x0 (B, N) the starts the rows broke down from;
    value / upper in sigma units (sqrt(theta) * scale); kw_epsilon(N, k, fail_prob): the KW relative eps
    (harness.kernels.krylov.kw_epsilon, passed in by the solver that calls this)."""

    rows = early.clone()
    if not bool(rows.any()):
        return value, vector, upper, products
    B, N = x0.shape
    dt, dev = x0.dtype, x0.device
    eps = torch.finfo(dt).eps
    scale = scale.to(dt)
    value, vector, upper = value.clone(), vector.clone(), upper.clone()
    Q = x0.new_zeros(B, 0, N)
    top = torch.zeros(B, dtype=dt, device=dev)  # top eigenvalue (scaled Gram) of the subspaces found
    rest = torch.zeros(B, dtype=dt, device=dev)  # KW estimate on the complement, once a round gives one
    settled = ~rows
    x = x0.clone()
    spent, rnd = 0, 0
    budget = N + ROUND_STEPS
    room = max(1, WORKSPACE_BYTES // max(1, B * N * x0.element_size()))  # basis vectors Q may hold
    while not bool(settled.all()) and spent < budget and Q.shape[1] + ROUND_STEPS <= max(room, ROUND_STEPS + 1):
        kmax = min(ROUND_STEPS, N)
        V, H, k, broke = _round(gram, x, Q, ~settled, kmax)
        spent += int(k.max())
        for b in (~settled).nonzero()[:, 0].tolist():
            kb = int(k[b])
            if kb == 0:  # the start had nothing outside Q: Q spans the space
                settled[b] = True
                continue
            th, y = torch.linalg.eigh(H[b, :kb, :kb])
            t = th[-1]
            sigma = math.sqrt(max(float(t), 0.0)) * float(scale[b])
            if sigma > float(value[b]):  # a larger Ritz value than any seen: it and its vector become the row's
                cand = y[:, -1] @ V[b, :kb]
                value[b] = sigma
                vector[b] = cand / cand.norm().clamp_min(torch.finfo(dt).tiny)
            if bool(broke[b]):  # an invariant subspace: its top is exact; deflate it
                top[b] = torch.maximum(top[b], t)
            else:  # the complement's estimate (k = kb products of an unrestarted Lanczos from a uniform start)
                kw = float(kw_epsilon(N, kb, fail_prob))
                pad = 1 + RITZ_ROUNDING * eps * (kb + Q.shape[1])
                rest[b] = float(t) * pad / (1 - kw) if kw < 1 else math.inf
                settled[b] = True
        new = V[:, :int(k.max())]
        Q = torch.cat([Q, torch.where(broke[:, None, None], new, torch.zeros_like(new))], 1)  # subspaces found
        full = (Q.norm(dim=-1) > 0.5).sum(-1) >= N  # the found subspaces span the whole space
        settled |= full
        rnd += 1
        x = gaussian_rows(x0.reshape(B, 1, N), N, 0, f"deflation;round={rnd}")
    pad = 1 + RITZ_ROUNDING * eps * max(1, Q.shape[1])
    sub = (top.clamp_min(0) * pad).sqrt() * scale
    done = rows & settled
    bound = torch.maximum(sub, torch.where(torch.isfinite(rest), rest.clamp_min(0).sqrt() * scale, rest))
    upper = torch.where(done, torch.maximum(bound, value), upper)
    upper = torch.where(rows & ~settled, torch.full_like(upper, math.inf), upper)
    return value, vector, upper, products + spent
