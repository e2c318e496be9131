"""harness.kernels.small: the NumPy Lanczos for small CPU problems. Its values equal the dense float64 singular
values of the explicit eq. 12 / eq. 20 matrices and the torch solver's; its certified estimates lie above the truth;
one operator's run takes the torch solver's steps and certificate exactly (same schedule); rows it cannot finish in
its basis are handed to the thick-restart solver; breakdowns, non-finite operators and float32 behave as there."""
from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pytest
import torch

from harness.bounds import lofast as L
from harness.bounds.lofast_ops import m_dense_matrix, m_gram, prepare, zeta_dense_matrix, zeta_gram
from harness.kernels import krylov, lanczos_steps, small
from harness.kernels.attention import AttentionWeights

D64 = torch.float64


def lofast_case(n=9, d=8, h=2, B=3, seed=0, scale=1.0, repeat=False, dtype=D64):
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, scale=1.0, dtype=dtype, generator=g)
    X = torch.randn(B, n, d, dtype=dtype, generator=g)
    if repeat:  # every token the same: uniform attention, a degenerate (repeated) spectrum
        X = X[:, :1].expand(B, n, d).clone()
    return scale * X / X.norm(dim=-1, keepdim=True), w


def dense_sigma(M: torch.Tensor) -> float:
    return float(torch.linalg.svdvals(M)[0])


def ops(X, w):
    w = prepare(X, w)
    return {"zeta": zeta_gram(X, w, True)[0], "zeta_nores": zeta_gram(X, w, False)[0],
            "m_domain": m_gram(X, w, "domain")[0], "m_codomain": m_gram(X, w, "codomain")[0]}


def start(op, seed=1, dtype=D64):
    return torch.randn(op.scale.shape[0], op.dim, dtype=dtype, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kind", ["zeta", "zeta_nores", "m_domain", "m_codomain"])
@pytest.mark.parametrize("case", [dict(), dict(scale=30.0), dict(repeat=True)], ids=["random", "one-hot", "repeated"])
def test_equals_the_torch_solver(kind, case):
    """Same values (to rounding), same convergence, the same vectors up to sign; near-one-hot attention (tokens
    scaled 30x) and repeated tokens (a degenerate spectrum) included."""
    X, w = lofast_case(**case)
    op = ops(X, w)[kind]
    x0 = start(op)
    a = krylov.lanczos(op, x0, tol=1e-12, krylov=40, fail_prob=1e-9)
    b = small.lanczos(op, x0, tol=1e-12, krylov=40, fail_prob=1e-9)
    assert bool(b.converged.all()) and torch.equal(a.converged, b.converged)
    assert float(((a.value - b.value) / a.value).abs().max()) < 1e-12
    assert float((a.vector * b.vector).sum(-1).abs().min()) > 1 - 1e-8
    assert torch.equal(a.steps, b.steps) and torch.equal(a.kw_eps, b.kw_eps)


@pytest.mark.parametrize("B", [1, 5])
def test_every_row_takes_the_torch_solvers_steps_and_certificate(B):
    """The test schedule is the torch solver's (next_check over the active rows): the same products per row and
    for the batch, the same first-cycle Krylov dimension, hence the same Kuczynski-Wozniakowski estimate."""
    X, w = lofast_case(n=16, d=18, h=3, B=B)
    spread = []  # rows finishing at different tests: the schedule after some rows left is exercised too
    for op in ops(X, w).values():
        x0 = start(op)
        a = krylov.lanczos(op, x0, tol=1e-10, krylov=60, min_steps=12, fail_prob=1e-9)
        b = small.lanczos(op, x0, tol=1e-10, krylov=60, min_steps=12, fail_prob=1e-9)
        assert torch.equal(a.steps, b.steps) and a.products == b.products
        assert torch.equal(a.kw_eps, b.kw_eps)
        assert float(((a.upper - b.upper) / a.upper).abs().max()) < 1e-12
        spread.append(len(set(b.steps.tolist())) > 1)
    assert any(spread) or B == 1
    for op in ops(X, w).values():  # min_steps holds for every operator, however early it would converge
        r = small.lanczos(op, start(op), tol=1e-3, krylov=60, min_steps=30, fail_prob=1e-9)
        assert bool((r.steps >= 30).all()) and bool((r.kw_eps == krylov.kw_epsilon(op.dim, r.steps, 1e-9)).all())


@pytest.mark.parametrize("residual", [True, False])
def test_values_equal_dense_float64_and_certificates_lie_above(residual):
    """Through lofast.zeta / m_norms, which route small CPU problems here: every value equals the top singular value
    of the explicit eq. 12 / eq. 20 matrix, and the certified estimate is >= it."""
    X, w = lofast_case(n=7, d=6, h=2, B=4, seed=3)
    with mock.patch.object(small, "restarted_lanczos", side_effect=AssertionError("the torch solver ran")):
        z, zi = L.zeta(X, w, residual, tol=1e-12, return_info=True)
        m, mi = L.m_norms(X, w, tol=1e-12, return_info=True)
    for b in range(len(X)):
        truth = dense_sigma(zeta_dense_matrix(X[b], w, residual))
        assert abs(float(z[b]) - truth) <= 1e-10 * truth
        assert float(zi.zeta.upper[b]) >= truth
        for l in range(w.h):
            t = dense_sigma(m_dense_matrix(X[b], w, l))
            assert abs(float(m[b, l]) - t) <= 1e-10 * t and float(mi.m.upper[b, l]) >= t


@pytest.mark.parametrize("iters", [2000, 20])
def test_rows_unconverged_in_the_basis_go_to_the_thick_restart_solver(iters):
    """A basis of 4 vectors cannot reach tol 1e-12: those rows get the restarted solver's answer, steps and
    certificate, from their own start (the product cap holds per row); `products` counts the first cycle twice."""
    X, w = lofast_case(n=9, d=8, h=2, B=2)
    op = ops(X, w)["m_domain"]
    x0 = start(op)
    ref = krylov.lanczos(op, x0, iters=iters, tol=1e-12, krylov=4, fail_prob=1e-9)
    got = small.lanczos(op, x0, iters=iters, tol=1e-12, krylov=4, fail_prob=1e-9)
    assert torch.equal(got.converged, ref.converged) and bool(got.converged.all()) == (iters > 20)
    assert float(((ref.value - got.value) / ref.value).abs().max()) < 1e-12
    assert torch.equal(got.steps, ref.steps) and int(got.steps.max()) <= iters and got.products == ref.products + 4
    assert torch.equal(got.upper, ref.upper)


def test_breakdown_is_exact():
    """A rank-deficient operator: the Krylov space becomes invariant, the value is exact and the KW eps is 0."""
    X, w = lofast_case(n=3, d=8, h=1, B=1)
    op = ops(X, w)["m_domain"]  # N = n r = 3 x 8 = 24, rank <= 9
    r = small.lanczos(op, start(op), tol=1e-14, krylov=40, fail_prob=1e-9)
    truth = dense_sigma(m_dense_matrix(X[0], w, 0))
    assert bool(r.converged.all()) and float(r.rel[0]) == 0.0 and float(r.kw_eps[0]) == 0.0
    assert abs(float(r.value[0]) - truth) <= 1e-12 * truth and int(r.steps[0]) < op.dim


def test_non_finite_operators_are_never_converged():
    X, w = lofast_case(B=2)
    op = ops(X, w)["zeta"]
    op.P = op.P.clone()
    op.P[1, 0, 0, 0] = float("nan")
    x0 = start(op)
    a = krylov.lanczos(op, x0, tol=1e-10, fail_prob=1e-9)
    b = small.lanczos(op, x0, tol=1e-10, fail_prob=1e-9)
    assert torch.equal(a.converged, b.converged) and b.converged.tolist() == [True, False]
    assert math.isnan(float(b.upper[1])) and math.isinf(float(b.rel[1]))
    assert float((a.value[0] - b.value[0]).abs() / a.value[0]) < 1e-12


def test_float32():
    X, w = lofast_case(dtype=torch.float32)
    for kind, op in ops(X, w).items():
        x0 = start(op, dtype=torch.float32)
        a = krylov.lanczos(op, x0, tol=1e-5, fail_prob=1e-9)
        b = small.lanczos(op, x0, tol=1e-5, fail_prob=1e-9)
        assert b.value.dtype == torch.float32 and bool(b.converged.all()), kind
        assert float(((a.value - b.value) / a.value).abs().max()) < 1e-5, kind
        assert torch.equal(a.steps, b.steps) and torch.equal(a.kw_eps, b.kw_eps), kind
    with pytest.raises(RuntimeError):  # a float64 operator with a float32 start: refused, as by the torch solver
        small.lanczos(ops(*lofast_case())["zeta"], x0)


def test_results_are_detached_as_the_torch_solvers():
    """Operators built from inputs that require grad: the results carry no graph (a gradient through the scale
    alone would be wrong), as krylov.lanczos's do."""
    X, w = lofast_case(B=1)
    X.requires_grad_(True)
    for op in ops(X, w).values():
        r = small.lanczos(op, start(op), tol=1e-8, fail_prob=1e-9)
        assert not r.value.requires_grad and not r.upper.requires_grad and not r.vector.requires_grad


def _torch_next_check(k, rel_now, rel_prev, k_prev, tol, check_every, min_steps, steps):
    """The schedule's formula in torch arithmetic (the reference: the torch solver's former implementation)."""
    gap = check_every
    ok = torch.isfinite(rel_now) & torch.isfinite(rel_prev) & (rel_now > 0) & (rel_now < rel_prev) & (k > k_prev)
    if bool(ok.any()):
        rate = (rel_now[ok].log() - rel_prev[ok].log()) / (k - k_prev)
        need = float(((math.log(tol) - rel_now[ok].log()) / rate).clamp_min(0).min())
        gap = int(min(max(check_every, need // 2), 4 * check_every))
    return k + max(gap, min_steps - steps)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_next_check_is_the_schedule_in_the_residuals_dtype(dtype):
    """The one test schedule of both solvers, in the residuals' dtype: by hand on a geometric residual, equal to the
    formula in torch arithmetic for tensors and NumPy arrays alike (up to a logarithm rounded differently at an
    exact step boundary), and the edges (no rate yet, a zero rate, min_steps)."""
    tol, ce = 1e-10, 3
    T = lambda *v: torch.tensor(v, dtype=dtype)
    # 1e-4 -> 1e-5 in 3 steps: 15 more steps to 1e-10, so the next test is half of that ahead (7), at most 4 x 3
    assert lanczos_steps.next_check(10, T(1e-5), T(1e-4), 7, tol, ce, 1, 10) == 17
    assert lanczos_steps.next_check(10, T(1e-5), T(1e-2), 7, 1e-6, ce, 1, 10) == 13  # one step away: check_every
    assert lanczos_steps.next_check(10, T(1e-2), T(1.01e-2), 7, tol, ce, 1, 10) == 22  # slow: 4 x check_every
    assert lanczos_steps.next_check(10, T(1e-5), T(math.inf), 7, tol, ce, 1, 10) == 13  # no rate yet
    assert lanczos_steps.next_check(10, T(1e-5), T(1e-4), 7, tol, ce, 40, 10) == 40  # not before min_steps
    big = T(1e10 if dtype == torch.float64 else 1e5)  # one rounding step apart: a zero rate in this dtype, "test soon"
    assert lanczos_steps.next_check(10, torch.nextafter(big, T(0)), big, 7, tol, ce, 1, 10) == 13
    rng = np.random.default_rng(0)
    for _ in range(400):
        rows = torch.from_numpy(10 ** rng.uniform(-14, 0, size=(2, 4))).to(dtype)
        rows[1, torch.from_numpy(rng.random(4) < 0.3)] = math.inf
        if rng.random() < 0.2:  # residuals one or two rounding steps apart
            rows[1] = torch.nextafter(torch.nextafter(rows[0], T(1.0)), T(1.0))
        args = (int(rng.integers(30, 40)), int(rng.integers(0, 30)), tol, *(int(rng.integers(lo, hi))
                                                                           for lo, hi in ((1, 5), (0, 40), (0, 40))))
        got = lanczos_steps.next_check(args[0], *rows, *args[1:])
        assert got == lanczos_steps.next_check(args[0], *(r.numpy() for r in rows), *args[1:])
        ref = _torch_next_check(args[0], *rows, *args[1:])
        assert got == ref or abs(got - ref) == 1, (rows, args)  # a log one ulp apart at a step boundary
        assert args[0] + args[3] <= got <= args[0] + max(4 * args[3], args[4] - args[5])


def test_where_it_applies():
    X, w = lofast_case(B=2)
    op = ops(X, w)["zeta"]
    x0 = start(op)
    assert small.applies(op, x0)
    assert not small.applies(op, x0.half()) and not small.applies(op, x0.float())  # the factors are float64
    assert not small.applies(op, torch.zeros(small.SMALL_MAX_BATCH + 1, op.dim, dtype=D64))
    assert not small.applies(op, torch.zeros(2, small.SMALL_MAX_DIM + 1, dtype=D64))
    gram = krylov.CallableGram(lambda v: v, lambda v: v, (2,), (op.dim,), x0)
    assert not small.applies(gram, x0)
    with mock.patch.object(small, "restarted_lanczos", wraps=krylov.lanczos) as torch_solver:
        small.solve(op, x0, tol=1e-8)
        assert torch_solver.call_count == 0
        small.solve(gram, x0, tol=1e-8)
        assert torch_solver.call_count == 1


def test_bad_arguments():
    X, w = lofast_case(B=1)
    op = ops(X, w)["zeta"]
    with pytest.raises(ValueError, match="reorth"):
        small.lanczos(op, start(op), reorth="some")
    with pytest.raises(ValueError, match="krylov"):
        small.lanczos(op, start(op), krylov=1)


