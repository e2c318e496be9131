"""The small numerical helpers every solver leans on (harness.kernels.linalg, krylov.unit_start, the operators'
scales): overflow- and underflow-free norms with a one-operation path on the CPU, the all-finite test through
NumPy, normalized starts, and the Lemma 1 operator's scale as an upper bound of its norm."""
import math

import numpy as np
import pytest
import torch

from harness.bounds import lofast
from harness.bounds.lofast_ops import prepare, zeta_dense_matrix, zeta_gram
from harness.kernels.attention import AttentionWeights
from harness.kernels.krylov import unit_start
from harness.kernels.linalg import all_finite, safe_norm

DTYPES = (torch.float32, torch.float64)


def exact_norms(v: torch.Tensor) -> np.ndarray:
    """Row norms in exact rational arithmetic's stand-in: each row scaled by its largest magnitude in float64,
    then the norm in Python's math.hypot (correctly handles every finite magnitude)."""
    return np.array([math.hypot(*row) for row in v.double().tolist()])


MAGNITUDES = {torch.float32: (1.0, 1e-3, 1e30, 1e-30), torch.float64: (1.0, 1e-3, 1e30, 1e-30, 1e200, 1e-170, 1e-310)}


@pytest.mark.parametrize("dtype, magnitude", [(dt, m) for dt, ms in MAGNITUDES.items() for m in ms])
def test_safe_norm_equals_the_exact_norm_at_every_magnitude(dtype, magnitude):
    """The plain norm where it is trusted, the scaled one elsewhere: every row within a few ulps of the exact
    norm, including magnitudes where squaring overflows (1e200 in float64, 1e30 in float32) or underflows
    (1e-170, subnormal 1e-310; 1e-30 in float32), where the plain norm alone returns inf or 0."""
    fi = torch.finfo(dtype)
    g = torch.Generator().manual_seed(0)
    base = torch.randn(5, 300, dtype=torch.float64, generator=g)
    v = (base * magnitude).to(dtype)
    assert bool(torch.isfinite(v).all()) and float(v.abs().min()) > 0
    want = exact_norms(v)
    got = safe_norm(v).double().numpy()
    assert np.all(np.abs(got - want) <= 8 * fi.eps * want + 4 * fi.smallest_normal * fi.eps), (got, want)
    assert np.all(got > 0) and np.all(np.isfinite(got))


def test_safe_norm_keeps_nan_inf_and_zero_rows():
    v = torch.tensor([[1.0, float("nan")], [float("inf"), 1.0], [0.0, 0.0], [3.0, 4.0]], dtype=torch.float64)
    got = safe_norm(v)
    assert math.isnan(got[0]) and math.isinf(got[1]) and got[2] == 0 and got[3] == 5
    assert torch.equal(safe_norm(v[3:]), torch.tensor([5.0], dtype=torch.float64))  # the plain path alone


def test_safe_norm_differentiates_like_the_norm():
    v = torch.randn(3, 7, dtype=torch.float64, requires_grad=True)
    safe_norm(v).sum().backward()
    assert torch.allclose(v.grad, (v / v.norm(dim=-1, keepdim=True)).detach(), rtol=1e-14, atol=0)


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16, *DTYPES))
def test_all_finite_matches_torch_on_every_dtype_and_layout(dtype):
    x = torch.randn(6, 9, dtype=torch.float64).to(dtype)
    assert all_finite(x) and all_finite(x.T) and all_finite(x[:, ::2]) and all_finite(x[:0])
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[4, 7] = bad
        assert not all_finite(y) and not all_finite(y.T) and not all_finite(y[:, 1::2])
        assert all_finite(y[:, ::2])  # the bad entry is not in this view
    assert all_finite(torch.arange(5)) and all_finite(torch.tensor([True]))
    assert not all_finite(torch.tensor([1 + 1j, complex("nan")]))


def test_all_finite_inside_torch_func_transforms():
    """Under torch.func.grad the input is a wrapper without storage: the test falls back to torch's."""
    def f(x):
        assert all_finite(x)
        return (x * x).sum()
    g = torch.func.grad(f)(torch.ones(3, dtype=torch.float64))
    assert torch.equal(g, 2 * torch.ones(3, dtype=torch.float64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_unit_start_normalizes_every_finite_nonzero_row(dtype):
    """Including rows whose norm is subnormal (left unnormalized by a clamp at tiny before); zero and non-finite
    rows become the constant unit vector."""
    fi = torch.finfo(dtype)
    N = 16
    x = torch.randn(6, N, dtype=torch.float64).to(dtype)
    x[1] = fi.smallest_normal * 1e-3 * torch.arange(1, N + 1, dtype=dtype) / N  # subnormal entries and norm
    x[2] = 0
    x[3, 5] = float("nan")
    x[4, 0] = float("inf")
    x[5] *= fi.max / 10  # squares overflow
    u = unit_start(x)
    const = torch.full((N,), 1 / math.sqrt(N), dtype=dtype)
    for i in (0, 1, 5):
        assert abs(float(u[i].double().norm()) - 1) <= 20 * fi.eps, i
        r = x[i].double() / x[i].double().abs().max()  # scaled by its largest entry (quotients correctly rounded)
        assert torch.allclose(u[i].double(), r / math.hypot(*r.tolist()), rtol=20 * fi.eps, atol=0), i
    for i in (2, 3, 4):
        assert torch.equal(u[i], const), i
    for i in (0, 1, 5):  # each row alone: a batch of finite rows takes the one-division path where it can
        ui = unit_start(x[i:i + 1])
        assert abs(float(ui.double().norm()) - 1) <= 20 * fi.eps, i


@pytest.mark.parametrize("residual", [True, False])
def test_zeta_operator_scale_bounds_the_operators_norm(residual):
    """The Lemma 1 operator's scale c = H + sum_l ||P_l||_F ||wv_l||_F ||wo_l||_F is >= its norm (the dense eq. 12
    matrix's), also where wv_l wo_l nearly cancels, so the scaled spectrum lies in [0, 1]."""
    g = torch.Generator().manual_seed(3)
    for trial in range(4):
        w = AttentionWeights.random(6, 2, scale=1.5, dtype=torch.float64, generator=g)
        if trial == 3:  # a nearly cancelling wv wo: ||wv wo||_F << ||wv||_F ||wo||_F
            wv, wo = w.wv.clone(), w.wo.clone()
            wv[..., 1] = wv[..., 0]
            wo[:, 1] = 1e-9 * torch.randn(wo[:, 1].shape, dtype=torch.float64, generator=g) - wo[:, 0]
            w = AttentionWeights(w.wq, w.wk, wv, wo)
        X = torch.randn(5, 6, dtype=torch.float64, generator=g) * 2
        op, _ = zeta_gram(X, prepare(X, w), residual)
        dense = torch.linalg.matrix_norm(zeta_dense_matrix(X, w, residual), ord=2)
        assert float(op.scale[0]) >= float(dense) * (1 - 1e-14)


def test_exact_norms_return_ordinary_tensors():
    """zeta and m_norms run under inference mode; what they return is usable in autograd and in place."""
    g = torch.Generator().manual_seed(5)
    w = AttentionWeights.random(8, 2, dtype=torch.float64, generator=g)
    X = torch.randn(2, 5, 8, dtype=torch.float64, generator=g)
    p = torch.ones((), dtype=torch.float64, requires_grad=True)
    for f in (lofast.zeta, lofast.m_norms):
        value, info = f(X, w, return_info=True)
        res = info.zeta if f is lofast.zeta else info.m
        for t in (value, info.converged, res.value, res.vector, res.upper, res.rel_change, res.steps):
            assert not t.is_inference()
        (value * p).sum().backward()  # saving an inference tensor for backward would raise
        value.mul_(2)
        res.vector[...] = 0
