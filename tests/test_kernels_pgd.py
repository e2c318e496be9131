"""PGD on an l2 ball: feasibility and near-optimality on problems with a known maximum."""
import pytest
import torch

from harness.kernels.pgd import pgd_maximize, project_ball, random_search_maximize


def test_linear_objective_reaches_known_max():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(3, 4, 5, dtype=torch.float64, generator=g)
    X0 = torch.randn(3, 4, 5, dtype=torch.float64, generator=g)
    eps = torch.tensor([0.1, 1.0, 3.0], dtype=torch.float64)
    obj = lambda X: (a * X).sum((-1, -2))
    res = pgd_maximize(obj, X0, eps, steps=30, restarts=2)
    best = obj(X0) + eps * a.flatten(1).norm(dim=-1)
    assert torch.all(res.value <= best + 1e-10)
    torch.testing.assert_close(res.value, best, rtol=1e-4, atol=0)
    assert torch.all(res.delta.flatten(1).norm(dim=-1) <= eps * (1 + 1e-12))
    assert torch.all(random_search_maximize(obj, X0, eps, samples=16) <= best + 1e-10)


def test_eps_zero_and_negative():
    X0 = torch.randn(4, 3, dtype=torch.float64)
    obj = lambda X: X.norm()
    assert pgd_maximize(obj, X0, 0.0, steps=5).value.item() == pytest.approx(X0.norm().item())
    with pytest.raises(ValueError, match="eps"):
        pgd_maximize(obj, X0, -0.1)


def test_project_ball():
    d = torch.randn(2, 3, 3, dtype=torch.float64) * 10
    p = project_ball(d, torch.tensor([1.0, 100.0], dtype=torch.float64), 2)
    assert p[0].norm().item() == pytest.approx(1.0)
    torch.testing.assert_close(p[1], d[1])
