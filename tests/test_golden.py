"""Golden values of representative bound quantities from every family (pytest-regressions, float64).

Values are stored in tests/test_golden/*.csv. A missing golden file FAILS the test (we never let
pytest-regressions silently create it in CI). To regenerate deliberately, after checking the change is
intended:  `.venv/bin/python -m pytest tests/test_golden.py --force-regen`  then review `git diff tests/test_golden`.
Each test also keeps one-sided soundness asserts (upper bound >= true local Lipschitz constant).
"""
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.bounds import castin, jasmin, kim, lofast
from harness.bounds.mass_splitting import split_terms
from harness.kernels.attention import AttentionWeights, attention
from harness.kernels.power import jacobian_norm
from harness.kernels.softmax import g_k, jsm_norm

GOLDEN_DIR = Path(__file__).parent / "test_golden"
TOL = dict(default_tolerance=dict(atol=1e-12, rtol=1e-7))


@pytest.fixture
def num_regression_strict(num_regression, request):
    """num_regression that fails (instead of creating the file) when the golden file is missing."""
    name = re.sub(r"\W", "_", request.node.name)  # pytest-regressions' file naming
    path = GOLDEN_DIR / f"{name}.csv"
    if not path.exists() and not request.config.getoption("force_regen"):
        pytest.fail(f"golden file {path} is missing: regenerate deliberately with --force-regen and commit it")
    return num_regression


@pytest.fixture
def original_datadir():
    return GOLDEN_DIR


def setup(seed, n=6, d=8, h=2, scale=1.5, B=2):
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, scale=scale, generator=g)
    X = torch.randn(B, n, d, dtype=torch.float64, generator=g)
    X = X / X.norm(dim=-1, keepdim=True)  # unit tokens, as LoFAST normalizes
    return w, X


def flat(d):
    return {k: np.asarray(v.detach().double().reshape(-1).numpy()) for k, v in d.items()}


@pytest.mark.parametrize("seed", [0, 1])
def test_golden_lofast(seed, num_regression_strict):
    w, X = setup(seed)
    true = jacobian_norm(lambda X: attention(X, w, residual=True), X)
    vals = dict(true_lip=true, zeta=lofast.zeta(X, w), m=lofast.m_norms(X, w), xi=lofast.xi(X, w),
                delta_fine=lofast.delta(X, w, 0.05), delta_coarse=lofast.delta(X, w, 0.05, fine=False),
                delta_sharp=lofast.delta(X, w, 0.05, softmax_lip=0.5),
                naive_delta1=lofast.naive_delta1(X, w, 0.05), lip_upper=lofast.lipschitz_upper(X, w))
    assert torch.all(vals["lip_upper"] >= true * (1 - 1e-9))
    assert torch.all(vals["xi"] >= vals["m"] * (1 - 1e-9))
    num_regression_strict.check(flat(vals), **TOL)


@pytest.mark.parametrize("seed", [0, 1])
def test_golden_jasmin_castin_kim(seed, num_regression_strict):
    w, X = setup(seed, scale=3.0)
    X = X * 2.0
    per_head_true = torch.stack([jacobian_norm(lambda X, l=l: attention(X, w.head(l)), X) for l in range(w.h)], -1)
    vals = dict(true_head=per_head_true, jasmin=jasmin.bound(X, w), jasmin_g1=jasmin.bound(X, w, use_g1=True),
                castin=castin.bound(X, w), castin_causal=castin.bound(X, w, causal=True),
                kim=kim.bound(X, w, r=0.0), gamma=castin.gamma(w), lower_n16=castin.lower_bound(w, 16, 2.0),
                meanfield=castin.meanfield_bound(w, 2.0))
    for b in ("jasmin", "jasmin_g1", "castin"):
        assert torch.all(vals[b] >= per_head_true * (1 - 1e-9)), b
    assert torch.all(vals["jasmin_g1"] >= vals["jasmin"] * (1 - 1e-12))
    num_regression_strict.check(flat(vals), **TOL)


def test_golden_softmax_and_mass_splitting(num_regression_strict):
    g = torch.Generator().manual_seed(3)
    p = torch.softmax(torch.randn(5, 7, dtype=torch.float64, generator=g) * 3, -1)
    X = torch.tensor([[-3.0], [-0.3]], dtype=torch.float64)
    A = torch.tensor([[-2.0]], dtype=torch.float64)
    V = torch.tensor([[1.0]], dtype=torch.float64)
    ms = split_terms(X, None, A, V)
    vals = dict(jsm=jsm_norm(p), g1=g_k(p, 1), g2=g_k(p, 2),
                ms_unsplit=ms["unsplit"].reshape(1), ms_split=ms["split"].reshape(1))
    assert torch.all(vals["g1"] >= vals["jsm"] - 1e-14)
    assert abs(ms["unsplit"].item() - 1.382) < 5e-4 and abs(ms["split"].item() - 2.011) < 5e-4  # docs/math.md example
    num_regression_strict.check(flat(vals), **TOL)
