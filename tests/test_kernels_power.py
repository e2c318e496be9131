"""Power iteration and Jacobian norms against dense SVDs (float64, small sizes)."""
import warnings

import pytest
import torch

from harness.kernels.attention import AttentionWeights, attention
from harness.kernels.power import (NonConvergenceWarning, dense_jacobian, jacobian_norm, operator_norm,
                                   paper_estimator, top_singular_value)


def test_batched_matrix_operator_matches_svd():
    g = torch.Generator().manual_seed(0)
    M = torch.randn(5, 7, 4, dtype=torch.float64, generator=g)  # 5 operators R^4 -> R^7
    res = operator_norm(lambda v: (M @ v[..., None])[..., 0], lambda u: (M.transpose(-1, -2) @ u[..., None])[..., 0],
                        (5, 4), event_dims=1)
    ref = torch.linalg.matrix_norm(M, 2)
    assert bool(res.converged.all())
    torch.testing.assert_close(res.value, ref, rtol=1e-7, atol=0)
    # the vector is a top right singular vector
    torch.testing.assert_close((M @ res.vector[..., None])[..., 0].norm(dim=-1), ref, rtol=1e-7, atol=0)


@pytest.mark.parametrize("method", ["power", "lanczos"])
def test_nonconvergence_is_reported(method):
    # clustered top singular values: 3 operator applications cannot reach tol
    M = torch.diag(torch.linspace(1.0, 0.9, 50, dtype=torch.float64))
    mv = lambda v: v @ M.T
    v0 = torch.ones(50, dtype=torch.float64)
    with pytest.warns(NonConvergenceWarning):
        res = top_singular_value(mv, mv, v0, event_dims=1, iters=3, method=method)
    assert not bool(res.converged)
    with pytest.raises(RuntimeError, match="did not converge"):
        top_singular_value(mv, mv, v0, event_dims=1, iters=3, on_nonconvergence="raise", method=method)


@pytest.mark.parametrize("method", ["power", "lanczos"])
def test_methods_agree_on_clustered_spectrum(method):
    g = torch.Generator().manual_seed(3)
    Q, _ = torch.linalg.qr(torch.randn(4, 60, 60, dtype=torch.float64, generator=g))
    s = torch.linspace(1.0, 0.5, 60, dtype=torch.float64)
    s[1] = 0.95  # gap ratio (0.95)^2: power iteration needs hundreds of steps
    M = Q * s  # (4, 60, 60), singular values s
    res = operator_norm(lambda v: (M @ v[..., None])[..., 0], lambda u: (M.transpose(-1, -2) @ u[..., None])[..., 0],
                        (4, 60), event_dims=1, method=method, iters=5000)
    assert bool(res.converged.all())
    torch.testing.assert_close(res.value, torch.ones(4, dtype=torch.float64), rtol=1e-6, atol=0)


def test_lanczos_needs_fewer_applications_than_power():
    g = torch.Generator().manual_seed(4)
    M = torch.randn(3, 80, 80, dtype=torch.float64, generator=g)
    mv = lambda v: (M @ v[..., None])[..., 0]
    rmv = lambda u: (M.transpose(-1, -2) @ u[..., None])[..., 0]
    lz = operator_norm(mv, rmv, (3, 80), 1, method="lanczos")
    pw = operator_norm(mv, rmv, (3, 80), 1, method="power", iters=20000)
    torch.testing.assert_close(lz.value, torch.linalg.matrix_norm(M, 2), rtol=1e-8, atol=0)
    assert lz.iters < pw.iters


def test_zero_operator():
    z = lambda v: torch.zeros_like(v)
    res = top_singular_value(z, z, torch.ones(2, 3, dtype=torch.float64), event_dims=1)
    assert torch.all(res.value == 0) and bool(res.converged.all())


@pytest.mark.parametrize("scale", [0.5, 2.0, 6.0])
@pytest.mark.parametrize("residual,causal", [(False, False), (True, False), (False, True)])
def test_jacobian_norm_equals_dense(scale, residual, causal):
    g = torch.Generator().manual_seed(int(scale * 10))
    w = AttentionWeights.random(8, 2, scale=scale, generator=g, bias=True)
    X = torch.randn(3, 5, 8, dtype=torch.float64, generator=g)
    f = lambda X: attention(X, w, residual=residual, causal=causal)
    with warnings.catch_warnings():
        warnings.simplefilter("error", NonConvergenceWarning)
        val = jacobian_norm(f, X)
    ref = torch.stack([torch.linalg.matrix_norm(dense_jacobian(f, X[b]), 2) for b in range(3)])
    torch.testing.assert_close(val, ref, rtol=1e-6, atol=0)
    # batched equals per-sample
    per = torch.stack([jacobian_norm(f, X[b]) for b in range(3)])
    torch.testing.assert_close(val, per, rtol=1e-8, atol=0)


def test_jacobian_norm_float32_agrees():
    g = torch.Generator().manual_seed(7)
    w = AttentionWeights.random(8, 2, scale=2.0, generator=g)
    X = torch.randn(2, 6, 8, dtype=torch.float64, generator=g)
    v64 = jacobian_norm(lambda X: attention(X, w), X)
    w32 = w.to(torch.float32)
    v32 = jacobian_norm(lambda X: attention(X, w32), X.float(), tol=1e-6)
    assert v32.dtype == torch.float32
    torch.testing.assert_close(v32.double(), v64, rtol=1e-4, atol=0)  # float32: 1e-4 relative


def test_paper_estimator_is_not_the_jacobian_norm():
    g = torch.Generator().manual_seed(5)
    w = AttentionWeights.random(8, 2, scale=3.0, generator=g)
    X = torch.randn(6, 8, dtype=torch.float64, generator=g)
    f = lambda X: attention(X, w)
    true = jacobian_norm(f, X)
    # the defective estimator returns sqrt(||J^T f(X)||) (docs/math.md §3)
    J = dense_jacobian(f, X)
    expected = (J.T @ f(X).reshape(-1)).norm().sqrt()
    torch.testing.assert_close(paper_estimator(f, X), expected, rtol=1e-10, atol=0)
    assert abs(expected.item() - true.item()) > 1e-3 * true.item()


def test_jacobian_norm_bad_input():
    with pytest.raises(ValueError, match="NaN"):
        jacobian_norm(lambda X: X, torch.tensor([[float("nan")]], dtype=torch.float64))
    with pytest.raises(ValueError):
        top_singular_value(lambda v: v, lambda v: v, torch.ones(2), 1, iters=0)
