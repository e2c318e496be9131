"""Softmax Jacobian norm (secular-equation bisection) vs dense eigendecomposition; g_k."""
import pytest
import torch

from harness.kernels.softmax import g_k, jsm_norm, jsm_norm_dense, softmax_jacobian


def random_probs(shape, temp, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(*shape, dtype=torch.float64, generator=g) * temp, -1)


@pytest.mark.parametrize("n", [1, 2, 3, 7, 64])
@pytest.mark.parametrize("temp", [0.1, 1.0, 5.0, 40.0])
def test_jsm_norm_exact(n, temp):
    p = random_probs((50, n), temp, seed=n)
    torch.testing.assert_close(jsm_norm(p), jsm_norm_dense(p), rtol=1e-9, atol=1e-14)


def test_jsm_norm_ties_and_zeros():
    p = torch.tensor([[0.5, 0.5, 0.0], [1 / 3, 1 / 3, 1 / 3], [1.0, 0.0, 0.0], [0.4, 0.4, 0.2],
                      [0.25, 0.25, 0.5]], dtype=torch.float64)
    torch.testing.assert_close(jsm_norm(p), jsm_norm_dense(p), rtol=1e-9, atol=1e-14)
    assert abs(jsm_norm(p)[0].item() - 0.5) < 1e-12  # Cor. 1 equality case


def test_softmax_jacobian_is_derivative():
    z = torch.randn(6, dtype=torch.float64)
    J = torch.func.jacrev(lambda z: torch.softmax(z, -1))(z)
    torch.testing.assert_close(softmax_jacobian(torch.softmax(z, -1)), J)


def test_g_k_definition_and_order():
    p = torch.tensor([0.1, 0.5, 0.15, 0.25], dtype=torch.float64)
    assert g_k(p, 1).item() == pytest.approx(0.5 * (1 - 0.5 + 0.25))
    assert g_k(p, 4).item() == pytest.approx(0.1 * (1 - 0.1 + 0.0))
    with pytest.raises(ValueError):
        g_k(p, 5)
    P = random_probs((200, 9), 3.0, 0)
    assert torch.all(g_k(P, 1) >= jsm_norm(P) - 1e-12) and torch.all(g_k(P, 1) <= 0.5 + 1e-12)


def test_g_k_differentiable():
    z = torch.randn(3, 5, dtype=torch.float64, requires_grad=True)
    g_k(torch.softmax(z, -1), 2).log().sum().backward()
    assert torch.isfinite(z.grad).all()


def _bisection_all_steps(p, iters=100):
    """jsm_norm's bisection written out with every one of its `iters` steps (no stop at the fixed point)."""
    top2 = torch.topk(p, min(2, p.shape[-1]), dim=-1).values
    p1 = top2[..., 0]
    p2 = top2[..., 1] if p.shape[-1] > 1 else torch.zeros_like(p1)
    lo, hi = p2.clone(), p1.clone()
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        diff = p - mid.unsqueeze(-1)
        f = 1 - (p * p / torch.where(diff == 0, torch.full_like(diff, float("inf")), diff)).sum(-1)
        lo, hi = torch.where(f > 0, mid, lo), torch.where(f > 0, hi, mid)
    return torch.where(p1 - p2 <= 0, p1, 0.5 * (lo + hi))


def _steps_taken(monkeypatch, p, iters):
    """jsm_norm(p, iters) and how many bisection steps it ran (each step makes one torch.full_like, for the
    entries where p equals the midpoint)."""
    calls = []
    real = torch.full_like
    monkeypatch.setattr(torch, "full_like", lambda *a, **k: calls.append(1) or real(*a, **k))
    v = jsm_norm(p, iters)
    monkeypatch.undo()
    return v, len(calls)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_jsm_norm_stopping_at_the_fixed_point_gives_the_full_bisection_bitwise(monkeypatch, dtype):
    flat = torch.cat([random_probs((40, 9), temp, seed=3) for temp in (0.1, 1.0)]).to(dtype)
    # the flat rows reach their fixed point (adjacent floats) well before 100 steps: the loop stops there
    v, steps = _steps_taken(monkeypatch, flat, 100)
    assert steps < 70 and torch.equal(v, _bisection_all_steps(flat, 100))
    # a peaked row (second-largest entry 1e-26 or below) or a one-hot one keeps the whole batch going to iters
    peaked = torch.cat([random_probs((40, 9), 400.0, seed=3).to(dtype), flat,
                        torch.tensor([[1.0] + [0.0] * 8, [0.5, 0.5] + [0.0] * 7], dtype=dtype)])
    v, steps = _steps_taken(monkeypatch, peaked, 100)
    assert steps == 100 and torch.equal(v, _bisection_all_steps(peaked, 100))
    # stopped by the count, before any fixed point; one-token rows
    v, steps = _steps_taken(monkeypatch, flat, 12)
    assert steps == 12 and torch.equal(v, _bisection_all_steps(flat, 12))
    assert torch.equal(jsm_norm(flat[:, :1]), _bisection_all_steps(flat[:, :1]))
