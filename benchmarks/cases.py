"""The cases the kernel benchmarks and reports share: sizes, random attention layers at each size (`case`), and
||M_l|| / zeta by each route (ours routed by size, the torch solver alone, ARPACK's svds, the dense matrices), by
name in METHODS. Read by benchmarks.bench_kernels (the timed and plain-test runs), report, floor, threads,
mixed_refine and device; a library, not a test module.
"""
from __future__ import annotations

import time
from unittest import mock

import numpy as np
import torch

from harness.bounds import lofast as L
from harness.bounds.lofast_ops import m_dense_matrix, prepare, query_key, stable_probs, zeta_dense_matrix
from harness.kernels import small
from harness.kernels.attention import AttentionWeights
from harness.kernels.operators import reduce_qk

SIZES = {"tiny": (6, 8, 2), "small": (32, 64, 4), "mid": (128, 256, 8), "vitb": (197, 768, 12),
         "big": (512, 768, 12), "batch": (32, 64, 4), "tinybatch": (6, 8, 2)}  # (n, d, h)
BATCH = {"batch": 64, "tinybatch": 5}  # sizes measured on a batch of inputs (ARPACK: input by input, head by head)
DENSE = ("tiny", "small", "tinybatch")  # sizes where the explicit matrices fit
TOL = 1e-8


def case(size: str, dtype=torch.float64, seed: int = 0):
    """Random weights (std 1/sqrt(d)) and unit-norm tokens (LoFAST's LayerProject, R = 1)."""
    n, d, h = SIZES[size]
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, scale=1.0, dtype=dtype, generator=g)
    X = torch.randn(*((BATCH[size],) if size in BATCH else ()), n, d, dtype=dtype, generator=g)
    return X / X.norm(dim=-1, keepdim=True), w


# ---- ours ---------------------------------------------------------------------------------------------------
def ours_m(X, w, tol=TOL):
    return L.m_norms(X, w, tol=tol)


def ours_zeta(X, w, tol=TOL):
    return L.zeta(X, w, tol=tol)


def torch_solver(fn):
    """`fn` with lofast's solver held to the torch one (harness.kernels.krylov) at every size: what the size
    routing of harness.kernels.small.solve gains."""
    def run(X, w, tol=TOL):
        with mock.patch.object(small, "applies", lambda op, x0: False):
            return fn(X, w, tol)
    run.__name__ = fn.__name__ + "_torch_solver"
    return run


# ---- ARPACK -------------------------------------------------------------------------------------------------
def _svds(mv, rmv, shape, calls=None):
    """svds(k=1) at TOL; `calls` (a list) receives (kind, seconds) for every matvec / rmatvec ARPACK asked for."""
    from scipy.sparse.linalg import LinearOperator, svds

    if calls is not None:
        mv, rmv = _timed(calls, "mv", mv), _timed(calls, "rmv", rmv)
    A = LinearOperator(shape, dtype=np.float64, matvec=mv, rmatvec=rmv)
    return float(svds(A, k=1, tol=TOL, return_singular_vectors=False, random_state=0)[0])


def _timed(calls, kind, f):
    def g(x):
        t0 = time.perf_counter()
        y = f(x)
        calls.append((kind, time.perf_counter() - t0))
        return y
    return g


def _per_input(fn):
    """ARPACK and the dense route take one input (n, d); a batch (B, n, d) runs input by input."""
    def run(X, w, *a, **k):
        return torch.stack([fn(x, w, *a, **k) for x in X]) if X.dim() == 3 else fn(X, w, *a, **k)
    run.__name__, run.__doc__ = fn.__name__, fn.__doc__
    return run


@_per_input
def arpack_m(X, w):
    """svds on Z -> Z K'^T + Q' Z^T (n r -> n^2) per head, numpy throughout (no torch overhead per product)."""
    w = prepare(X, w)
    n = X.shape[-2]
    Q, K = query_key(X, w)
    U, Rq, Rk = reduce_qk(w.wq, w.wk)
    Kp, Qp = (K @ Rq.mT).numpy(), (Q @ Rk.mT).numpy()
    r = Kp.shape[-1]
    out = []
    for l in range(w.h):
        k_, q_ = Kp[l], Qp[l]
        mv = lambda z, k_=k_, q_=q_: (z.reshape(n, r) @ k_.T + q_ @ z.reshape(n, r).T).ravel()
        rmv = lambda s, k_=k_, q_=q_: (s.reshape(n, n) @ k_ + s.reshape(n, n).T @ q_).ravel()
        out.append(_svds(mv, rmv, (n * n, n * r)))
    return torch.tensor(out, dtype=X.dtype)


@_per_input
def arpack_zeta(X, w, residual=True, calls=None):
    w = prepare(X, w)
    n, d = X.shape
    P = stable_probs(X, w).numpy()  # (h, n, n)
    wv, wo = w.wv.numpy(), w.wo.numpy()
    Wv = wv.transpose(1, 0, 2).reshape(d, -1)
    Wo = wo.reshape(-1, d)
    h, dh = w.h, w.dh
    H = 1.0 if residual else 0.0

    def mv(g):
        G = g.reshape(n, d)
        Y = (G @ Wv).reshape(n, h, dh).transpose(1, 0, 2)  # (h, n, dh)
        return ((P @ Y).transpose(1, 0, 2).reshape(n, -1) @ Wo + H * G).ravel()

    def rmv(y):
        Y = y.reshape(n, d)
        Z = (Y @ Wo.T).reshape(n, h, dh).transpose(1, 0, 2)
        return ((P.transpose(0, 2, 1) @ Z).transpose(1, 0, 2).reshape(n, -1) @ Wv.T + H * Y).ravel()

    return torch.tensor(_svds(mv, rmv, (n * d, n * d), calls), dtype=X.dtype)


# ---- dense --------------------------------------------------------------------------------------------------
@_per_input
def dense_m(X, w):
    return torch.stack([torch.linalg.matrix_norm(m_dense_matrix(X, w, l), ord=2) for l in range(w.h)])


@_per_input
def dense_zeta(X, w):
    return torch.linalg.matrix_norm(zeta_dense_matrix(X, w, True), ord=2)


METHODS = {("m", "ours"): ours_m, ("m", "arpack"): arpack_m, ("m", "dense"): dense_m,
           ("m", "torch"): torch_solver(ours_m),
           ("zeta", "ours"): ours_zeta, ("zeta", "arpack"): arpack_zeta, ("zeta", "dense"): dense_zeta,
           ("zeta", "torch"): torch_solver(ours_zeta)}


def rel_diff(a, b) -> float:
    return float(((a - b).abs() / b.abs()).max())
