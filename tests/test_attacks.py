"""Attacks vs the exact robust accuracy of a 2-class linear classifier (FGSM/PGD are optimal there)."""
import pytest
import torch

from harness.models import attacks


def _linear_problem(seed=0, B=100):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(16, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(2, 16, generator=g))
        lin.bias.zero_()
    model = torch.nn.Sequential(torch.nn.Flatten(), lin)
    x = 0.3 + 0.4 * torch.rand(B, 1, 4, 4, generator=g)  # box [0, 1] never binds for eps <= 0.1
    y = model(x).argmax(-1).detach()  # clean accuracy 100%
    return model, x, y


def _exact_robust_acc(model, x, y, eps, norm):
    """Linear 2-class: correct at radius eps iff margin > eps * ||w_y - w_other||_{dual norm}."""
    W = model[1].weight.detach()  # (2, D)
    z = model(x).detach()  # (B, 2)
    margin = z.gather(1, y[:, None])[:, 0] - z.gather(1, (1 - y)[:, None])[:, 0]
    dw = W[y] - W[1 - y]  # (B, D)
    dual = dw.abs().sum(1) if norm == "linf" else dw.norm(dim=1)
    return float((margin > eps * dual).double().mean())


BACKENDS = ["builtin"] + (["torchattacks"] if attacks.torchattacks_available() else [])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("norm,eps", [("linf", 0.05), ("linf", 0.1), ("l2", 0.3)])
@pytest.mark.parametrize("kind", ["fgsm", "pgd"])
def test_attack_matches_exact_linear(backend, norm, eps, kind):
    model, x, y = _linear_problem()
    exact = _exact_robust_acc(model, x, y, eps, norm)
    acc = attacks.robust_accuracy(model, x, y, kind, eps, norm, steps=10, backend=backend)
    clean = attacks.clean_accuracy(model, x, y)
    assert exact < clean  # the budget matters
    assert acc == pytest.approx(exact, abs=1.0 / x.shape[0] + 1e-9)


def test_pgd_stays_in_ball_and_box():
    model, x, y = _linear_problem(B=32)
    for norm, eps in [("linf", 0.1), ("l2", 0.5)]:
        xa = attacks.pgd_builtin(model, x, y, eps, steps=5, norm=norm)
        d = (xa - x).flatten(1)
        size = d.abs().max(1).values if norm == "linf" else d.norm(dim=1)
        assert float(size.max()) <= eps + 1e-6
        assert float(xa.min()) >= 0 and float(xa.max()) <= 1


def test_eps_zero_is_clean_and_mode_restored():
    model, x, y = _linear_problem(B=20)
    model.train()
    assert attacks.robust_accuracy(model, x, y, "pgd", 0.0) == attacks.clean_accuracy(model, x, y)
    assert model.training


@pytest.mark.skipif(not attacks.torchattacks_available(), reason="torchattacks not installed")
def test_autoattack_runs_and_is_no_weaker_than_clean():
    g = torch.Generator().manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 10))
    x = torch.rand(16, 1, 4, 4, generator=g)
    y = model(x).argmax(-1).detach()
    acc = attacks.robust_accuracy(model, x, y, "autoattack", 0.05, steps=5)
    assert 0.0 <= acc <= 1.0


def test_bad_inputs():
    model, x, y = _linear_problem(B=4)
    with pytest.raises(ValueError, match="norm"):
        attacks.robust_accuracy(model, x, y, "pgd", 0.1, norm="l1")
    with pytest.raises(ValueError, match="attack kind"):
        attacks.robust_accuracy(model, x, y, "cw", 0.1)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        attacks.robust_accuracy(model, x * 3, y, "pgd", 0.1)
    with pytest.raises(ValueError, match="eps"):
        attacks.robust_accuracy(model, x, y, "pgd", -1.0)
    with pytest.raises(ValueError, match="backend"):
        attacks.backend_name("foolbox")
