"""Benchmark: exact ||M_l|| (all heads) and zeta, ours vs scipy svds (ARPACK) vs dense SVD.

"ours" routes by size (harness.kernels.small.solve: NumPy Lanczos for small CPU problems, else the torch solver);
"torch": ours with the torch solver (harness.kernels.krylov) at every size, to show what the NumPy route gains.
ARPACK gets what a careful user writes: a LinearOperator over the same reduced rank-2dh factors
(Z -> Z K'^T + Q' Z^T on Z in R^{n x r}, harness.kernels.operators), head by head, the same tolerance.
For zeta it gets the Lemma 1 operator G -> G + sum_l P_l G VO_l (matvec + adjoint through the factors).
Dense: the explicit eq. 20 / eq. 12 matrices and a full SVD where they fit (n=32, d=64).

Timed: `ATTNLIP_BENCH_SIZES=small,mid,vitb,big pytest benchmarks/bench_kernels.py --benchmark-only`
(default: small,mid);
as plain tests (`--benchmark-disable`, what CI runs) every case runs once at a tiny size and checks agreement.
`python -m benchmarks.report` measures every size in one run and prints the markdown table.
"""
from __future__ import annotations

import os
import time
from unittest import mock

import numpy as np
import pytest
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


BENCH_SIZES = os.environ.get("ATTNLIP_BENCH_SIZES", "small,batch,mid").split(",")


def described(size: str) -> str:
    """A size as benchmark groups name it: its name, (n, d, h) and the inputs of a batch."""
    return f"{size} {SIZES[size]}" + (f" x{BATCH[size]} inputs" if size in BATCH else "")


@pytest.mark.parametrize("size", BENCH_SIZES)
@pytest.mark.parametrize("what", ["m", "zeta"])
@pytest.mark.parametrize("method", ["ours", "torch", "arpack", "dense"])
def test_bench_exact_norms(benchmark, size, what, method):
    if benchmark.disabled:  # plain test run (CI): one tiny case each
        size = "tinybatch" if size in BATCH else "tiny"
    if method == "dense" and size not in DENSE:
        pytest.skip("the explicit matrix does not fit at this size")
    X, w = case(size)
    benchmark.group = f"{what} {described(size)}"
    fn = METHODS[(what, method)]
    val = benchmark.pedantic(lambda: fn(X, w), rounds=1 if benchmark.disabled else 3, iterations=1)
    ref = METHODS[(what, "dense" if size in DENSE else "arpack")](X, w)
    assert rel_diff(val, ref) <= 1e-6, (what, method, size)


@pytest.mark.parametrize("size", [s for s in BENCH_SIZES if s in ("batch", "mid", "vitb", "big")] or ["batch"])
@pytest.mark.parametrize("what", ["m", "zeta"])
@pytest.mark.parametrize("basis", ["reused", "fresh"])
def test_bench_basis_reuse(benchmark, monkeypatch, size, what, basis):
    """The torch solver's basis kept between calls (kernels.lanczos_steps.basis_buffer) against a fresh one per
    call (WORKSPACE_BYTES = 0): same values to the bit; compare the two rows of a group for the faults it saves."""
    from harness.kernels import lanczos_steps

    if benchmark.disabled:
        size = "tinybatch"
    X, w = case(size)
    fn = METHODS[(what, "torch")]
    ref = fn(X, w)
    if basis == "fresh":
        monkeypatch.setattr(lanczos_steps, "WORKSPACE_BYTES", 0)
        lanczos_steps.release_workspace()
    benchmark.group = f"basis {what} {described(size)}"
    val = benchmark.pedantic(lambda: fn(X, w), rounds=1 if benchmark.disabled else 5, iterations=1)
    assert torch.equal(val, ref)


def test_report_repeats_millisecond_calls_for_a_steady_median():
    """benchmarks.timing.measure: a call faster than FAST_CALL after its warm-up is repeated FAST_REPEATS times (a
    no-op: 1 s / its time is far above), a slower one `repeats` times; the warm-up is not among the times."""
    import time as _time

    from benchmarks.timing import FAST_CALL, FAST_REPEATS, measure

    calls = []
    val, t = measure(lambda: calls.append(1) or 7, 3, True)
    assert val == 7 and len(calls) == 1 + FAST_REPEATS and t < FAST_CALL
    calls.clear()
    _, t = measure(lambda: calls.append(1) or _time.sleep(FAST_CALL * 1.2), 3, True)
    assert len(calls) == 1 + 3 and t >= FAST_CALL
    calls.clear()
    measure(lambda: calls.append(1), 2, False)  # no warm-up: exactly the repeats asked for
    assert len(calls) == 2


def test_compared_calls_take_turns():
    """benchmarks.timing.measure_alternating: after one warm-up each, the timed calls come in rounds, one block of
    each callable per round (as many rounds as the slow one's `repeats`; the fast one's FAST_REPEATS calls spread
    evenly over them), each median is over its own calls only, and each value is its callable's."""
    import time as _time

    from benchmarks.timing import FAST_CALL, FAST_REPEATS, measure_alternating

    order = []
    slow = lambda: order.append("slow") or _time.sleep(FAST_CALL * 1.2) or "s"
    out = measure_alternating({"fast": lambda: order.append("fast") or "f", "slow": slow}, 3)
    block = ["fast"] * (FAST_REPEATS // 3) + ["slow"]
    assert order == ["fast", "slow"] + block * 3  # the warm-ups, then three rounds
    assert out["fast"][0] == "f" and out["fast"][1] < FAST_CALL
    assert out["slow"][0] == "s" and out["slow"][1] >= FAST_CALL


def test_arpack_reports_its_products():
    """The floor report's ARPACK columns count and time ARPACK's operator calls; the value is the dense one."""
    X, w = case("tiny")
    calls = []
    val = arpack_zeta(X, w, calls=calls)
    kinds = [c[0] for c in calls]
    # one Gram product = a matvec and an rmatvec; svds adds one matvec after the iteration
    assert kinds.count("rmv") >= 1 and 0 <= kinds.count("mv") - kinds.count("rmv") <= 1
    assert all(c[1] >= 0 for c in calls)
    assert rel_diff(val, dense_zeta(X, w)) <= 1e-6


def test_floor_report_runs():
    """`python -m benchmarks.report --part floor` at the tiny sizes, one input and a batch: a row each, every column
    filled."""
    from benchmarks.floor import floor_report

    rows = [l for l in floor_report(["tiny", "tinybatch"], 1).splitlines() if l.startswith("| n=6 d=8 h=2")]
    assert len(rows) == 2 and "5 inputs" in rows[1]
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 11 and all(cells), cells
        assert int(cells[2]) >= 1 and float(cells[6].split()[0]) >= 1  # our products, ARPACK's products
        assert cells[9].endswith("x") and cells[10].endswith("x")  # the ratios our products allow


@pytest.fixture
def report_threads():
    """benchmarks.report with torch's thread count and the BLAS pools given back after the test."""
    import benchmarks.report as R
    from benchmarks.timing import restore_threads

    before = torch.get_num_threads()
    yield R
    torch.set_num_threads(before)
    restore_threads()


def test_report_threads_apply_to_torch_and_blas(capsys, monkeypatch, report_threads):
    """`--threads 1,2`: one table per count in the same run, and during each pass torch's AND numpy's BLAS thread
    counts are that count (ARPACK runs on numpy: an unset BLAS pool would give it another count than ours); the BLAS
    pools get their original counts back afterwards."""
    from threadpoolctl import threadpool_info
    from benchmarks.timing import restore_threads

    R = report_threads
    blas = lambda: sorted({p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"})
    seen, original = [], blas()
    monkeypatch.setattr(R, "floor_report", lambda sizes, repeats: seen.append((torch.get_num_threads(), blas()))
                        or "| row |")
    R.main(["--part", "floor", "--quick", "--repeats", "1", "--threads", "1,2"])
    out = capsys.readouterr().out
    assert "### 1 thread (torch and BLAS)" in out and "### 2 threads (torch and BLAS)" in out
    assert seen == [(1, [1]), (2, [2])]
    for bad in (["--part", "analyze", "--threads", "1,2"], ["--threads", "0"], ["--threads", "2,2"],
                ["--threads", "x"]):
        with pytest.raises(SystemExit):
            R.main(bad)
    restore_threads()
    assert blas() == original


def test_best_of_report_pairs_each_side_at_its_own_best_count(capsys, report_threads):
    """The fair ratio: ours (routed by size, as shipped) and ARPACK each at the thread count where they were fastest,
    from the same run; the torch-solver-only column does not enter it."""
    R = report_threads
    row = lambda o, r, a: dict(size="n=6 d=8 h=2", quantity="zeta", ours=o, torch=r, arpack=a, dense=float("nan"),
                               rel=0.0, ref="dense")
    table = R.best_of_report({1: [row(4.0, 3.0, 1.0)], 2: [row(2.0, 2.5, 6.0)]})
    assert "| n=6 d=8 h=2 | zeta | 2 at 2 | 1 at 1 | 0.5x |" in table
    table = R.best_of_report({1: [row(1.6, 1.0, 1.0)], 2: [row(2.0, 0.5, 6.0)]})  # the torch-only column: ignored
    assert "| n=6 d=8 h=2 | zeta | 1.6 at 1 | 1 at 1 | 0.6x |" in table
    targets = R.targets_report({1: [dict(row(4.0, 3.0, 9.0), key="small"), dict(row(1.0, 1.0, 1.0), key="tiny")],
                                2: [dict(row(2.0, 2.5, 6.0), key="small"), dict(row(1.0, 1.0, 1.0), key="tiny")]})
    assert "| n=6 d=8 h=2 | zeta | 3.00x | 1.5x | yes |" in targets and targets.count("| zeta |") == 1
    assert "| 1.00x | 5x | no |" in R.targets_report({1: [dict(row(1.0, 1.0, 1.0), key="batch")]})
    R.main(["--part", "kernels", "--quick", "--repeats", "1", "--threads", "1,2"])
    out = capsys.readouterr().out
    assert "### Each side at its best thread count" in out and out.count("| n=6 d=8 h=2 | zeta |") == 3


# ---- the certified truth: float64 throughout vs mixed precision (harness.kernels.mixed) --------------------------
TRUTH_SIZES = os.environ.get("ATTNLIP_BENCH_TRUTH_SIZES", "mid,vitb").split(",")
CERTIFY = dict(steps=24, fail_prob=1e-6)


@pytest.mark.parametrize("size", TRUTH_SIZES)
@pytest.mark.parametrize("heads", [False, True], ids=["layer", "heads"])
@pytest.mark.parametrize("route", ["float64", "mixed"])
def test_bench_certified_truth(benchmark, size, heads, route):
    """analyze's certified truth of the layer or of every head, float64 Lanczos throughout vs float32 iterations
    refined in float64; the values agree to 1e-9 and the certified estimates stay above them (timed:
    `pytest benchmarks/bench_kernels.py -k certified_truth --benchmark-only`)."""
    from harness.kernels import layer, mixed

    if benchmark.disabled:
        size = "tiny"
    X, w = case(size)
    benchmark.group = f"certified truth ({'heads' if heads else 'layer'}) {size} {SIZES[size]}"
    fn = (lambda: mixed.truth(X, w, heads=heads, certify=CERTIFY)) if route == "mixed" else \
        (lambda: layer.truth(X, w, heads=heads, certify=CERTIFY))
    r = benchmark.pedantic(fn, rounds=1 if benchmark.disabled else 3, iterations=1)
    ref = layer.truth(X, w, heads=heads, certify=CERTIFY) if route == "mixed" else r
    assert rel_diff(r.value, ref.value) <= 1e-9 and bool((r.upper >= r.value).all())


def test_mixed_refine_prototype_meets_the_float64_tolerance_explicitly():
    """benchmarks.mixed_refine (a measured prototype, not a product route): values equal the float64 route's to
    rounding, and its explicit float64 residual is below tol, row by row."""
    from benchmarks import mixed_refine

    rows = mixed_refine.compare("tinybatch", repeats=1)
    assert [r[0] for r in rows] == ["zeta", "‖M_l‖ all heads"] and all(r[3] < 1e-12 for r in rows)
    X, w = case("small")
    log: list = []
    with mixed_refine.prototype_route(log, 1e-5):
        v, info = L.zeta(X, w, tol=1e-10, mixed=True, return_info=True)
    assert bool(info.zeta.converged.all()) and float(info.zeta.rel_change.max()) < 1e-10
    torch.testing.assert_close(v, L.zeta(X, w, tol=1e-10), rtol=1e-12, atol=0)
    assert len(log) == 1 and "float32" in log[0]
    assert L.lanczos_mixed is mixed_refine.mixed.lanczos_mixed  # the block restores lofast's route
