"""LoFAST benchmarks: matrix-free ||M_l|| and zeta vs dense SVD and scipy svds; ViT-B / MiniLM scale; batching.

Run timed: `pytest benchmarks --benchmark-only`; as plain tests (tiny sizes, each function run once):
`pytest benchmarks --benchmark-disable`. `python -m benchmarks.report` prints the markdown table with peak memory.
"""
from __future__ import annotations

import os
import threading
import time

import numpy as np
import psutil
import pytest
import torch

from harness.bounds import lofast as L
from harness.bounds.lofast_ops import m_dense_matrix, m_gram, zeta_dense_matrix, zeta_gram
from harness.kernels.attention import AttentionWeights, attention
from harness.kernels.power import jacobian_norm

# (n, d, h) per scale; "tiny" replaces every size when benchmarks are disabled (plain test run)
SIZES = {"dense": (32, 64, 4), "vitb": (197, 768, 12), "minilm": (256, 384, 12), "tiny": (6, 8, 2)}
JAC_BATCH, JAC_ITERS = 8, 10  # jacobian_norm: 8 inputs, a fixed budget of 10 Lanczos steps (J^T J products)


def case(scale: str, dtype=torch.float64, batch=(), seed: int = 0):
    """Random weights (std 1/sqrt(d)) and tokens projected to unit norm (LoFAST's LayerProject, R = 1)."""
    n, d, h = SIZES[scale]
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, scale=1.0, dtype=dtype, generator=g)
    X = torch.randn(*batch, n, d, dtype=dtype, generator=g)
    return X / X.norm(dim=-1, keepdim=True), w


# ---- the competitors --------------------------------------------------------------------------------------
def dense_m_norms(X, w):
    """Explicit eq. 20 matrices (n^2 x nd per head) and a full SVD each: (h,)."""
    return torch.stack([torch.linalg.matrix_norm(m_dense_matrix(X, w, l), ord=2) for l in range(w.h)])


def dense_zeta(X, w):
    """Explicit eq. 12 Kronecker matrix (nd x nd) and a full SVD."""
    return torch.linalg.matrix_norm(zeta_dense_matrix(X, w, True), ord=2)


def _linop(mv, rmv, shape_in, shape_out, m, k):
    from scipy.sparse.linalg import LinearOperator

    t = lambda v, s: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float64).reshape(s))
    return LinearOperator((m, k), dtype=np.float64, matvec=lambda v: mv(t(v, shape_in)).reshape(-1).numpy(),
                          rmatvec=lambda u: rmv(t(u, shape_out)).reshape(-1).numpy())


def svds_m_norms(X, w, tol=1e-10):
    """scipy.sparse.linalg.svds (ARPACK) on our (reduced, exact) M_l operator wrapped in a LinearOperator, one head
    at a time: ||M_l|| = scale_l ||R_l||, R_l: Z (n x r) -> Z K'^T + Q' Z^T (harness.kernels.operators.MGram)."""
    from scipy.sparse.linalg import svds

    n = X.shape[0]
    ops, _ = m_gram(X, w)  # one row per head
    out = []
    for l in range(w.h):
        op = ops.select(torch.tensor([l]))
        A = _linop(op.matvec, op.rmatvec, (1, n, op.r), (1, n, n), n * n, n * op.r)
        out.append(float(op.scale[0]) * svds(A, k=1, tol=tol, return_singular_vectors=False, random_state=0)[0])
    return torch.tensor(out)


def svds_zeta(X, w, tol=1e-10):
    """scipy svds (ARPACK) on the Lemma 1 operator as a LinearOperator."""
    from scipy.sparse.linalg import svds

    n, d = X.shape
    op, _ = zeta_gram(X, w, True)  # T_X = scale * op.matvec (harness.kernels.operators.ZetaGram)
    A = _linop(op.matvec, op.rmatvec, (1, n, d), (1, n, d), n * d, n * d)
    return torch.tensor(float(op.scale[0]) * svds(A, k=1, tol=tol, return_singular_vectors=False, random_state=0)[0])


def jac_batched(X, w, iters=JAC_ITERS):
    return jacobian_norm(lambda Z: attention(Z, w, residual=True), X, iters=iters, on_nonconvergence="ignore")


def jac_loop(X, w, iters=JAC_ITERS):
    return torch.stack([jac_batched(x, w, iters) for x in X])


# ---- peak memory ------------------------------------------------------------------------------------------
def peak_rss_mb(fn, poll_s: float = 0.002):
    """(result, peak RSS increase in MB over the RSS before the call), RSS polled by a thread every 2 ms."""
    proc = psutil.Process()
    base = proc.memory_info().rss
    peak = [base]
    stop = threading.Event()

    def poll():
        while not stop.is_set():
            peak[0] = max(peak[0], proc.memory_info().rss)
            time.sleep(poll_s)

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        out = fn()
    finally:
        stop.set()
        t.join()
    peak[0] = max(peak[0], proc.memory_info().rss)
    return out, (peak[0] - base) / 2**20


def dense_m_bytes(n, d, dtype_bytes=4):
    """Memory of one explicit M_l (n^2 x nd)."""
    return n * n * n * d * dtype_bytes


# ---- pytest-benchmark tests -------------------------------------------------------------------------------
@pytest.fixture
def disabled(request):
    return bool(request.config.getoption("benchmark_disable", default=False))


def _size(scale, disabled):
    return "tiny" if disabled else scale


def _rel(a, b):
    return float(((a - b).abs() / b.abs()).max())


@pytest.fixture(autouse=True)
def _threads(disabled):
    """1 intra-op thread unless ATTNLIP_BENCH_THREADS says otherwise: on the shared 2-core CI box 2 threads made
    every case 3-20x slower (see docs/notes/bounds-lofast.md)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1 if disabled else int(os.environ.get("ATTNLIP_BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(n)


@pytest.mark.parametrize("method", ["matrix_free", "dense", "svds"])
def test_bench_m_norms_small(benchmark, disabled, method):
    X, w = case(_size("dense", disabled))
    ref = dense_m_norms(X, w) if method != "dense" else None
    f = {"matrix_free": lambda: L.m_norms(X, w), "dense": lambda: dense_m_norms(X, w),
         "svds": lambda: svds_m_norms(X, w)}[method]
    benchmark.group = "m_norms n=32 d=64 h=4"
    val = benchmark.pedantic(f, rounds=1 if method == "dense" else 3, iterations=1)
    if ref is not None:
        assert _rel(val, ref) <= 1e-6


@pytest.mark.parametrize("method", ["matrix_free", "dense", "svds"])
def test_bench_zeta_small(benchmark, disabled, method):
    X, w = case(_size("dense", disabled))
    ref = dense_zeta(X, w) if method != "dense" else None
    f = {"matrix_free": lambda: L.zeta(X, w), "dense": lambda: dense_zeta(X, w),
         "svds": lambda: svds_zeta(X, w)}[method]
    benchmark.group = "zeta n=32 d=64"
    val = benchmark.pedantic(f, rounds=1 if method == "dense" else 3, iterations=1)
    if ref is not None:
        assert _rel(val, ref) <= 1e-6


@pytest.mark.parametrize("scale", ["vitb", "minilm"])
@pytest.mark.parametrize("what", ["m_norms", "zeta"])
def test_bench_large_scale(benchmark, disabled, scale, what):
    X, w = case(_size(scale, disabled), dtype=torch.float32)
    f = {"m_norms": lambda: L.m_norms(X, w), "zeta": lambda: L.zeta(X, w)}[what]
    benchmark.group = f"{what} large (float32)"
    val, mb = peak_rss_mb(lambda: benchmark.pedantic(f, rounds=1, iterations=1))
    benchmark.extra_info["peak_rss_mb"] = mb
    assert torch.isfinite(val).all()
    if not disabled and scale == "vitb":
        n, d, _ = SIZES[scale]
        assert mb < 500, f"matrix-free {what} used {mb:.0f} MB (dense M_l alone: {dense_m_bytes(n, d) / 1e9:.1f} GB)"


@pytest.mark.parametrize("scale", ["vitb", "minilm"])
@pytest.mark.parametrize("mode", ["batched", "loop"])
def test_bench_jacobian_norm(benchmark, disabled, scale, mode):
    X, w = case(_size(scale, disabled), dtype=torch.float32, batch=(JAC_BATCH if not disabled else 2,))
    f = {"batched": lambda: jac_batched(X, w), "loop": lambda: jac_loop(X, w)}[mode]
    benchmark.group = f"jacobian_norm {scale} x{X.shape[0]} ({JAC_ITERS} Lanczos steps)"
    val = benchmark.pedantic(f, rounds=1, iterations=1)
    assert val.shape == (X.shape[0],)
    if disabled:  # at tiny size, converged batched and looped values agree in float64
        X64, w64 = X.double(), w.to(torch.float64)
        f64 = lambda Z: attention(Z, w64, residual=True)
        assert _rel(torch.stack([jacobian_norm(f64, x) for x in X64]), jacobian_norm(f64, X64)) <= 1e-6
