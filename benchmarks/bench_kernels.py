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

import pytest
import torch

from benchmarks.cases import BATCH, DENSE, METHODS, SIZES, case, rel_diff


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
