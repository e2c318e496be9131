"""JaSMin Proposition 1 and eq. 10 (experiments/jasmin/proposition1.py) against the exact softmax-Jacobian norm of
explicit matrices, on random rows from uniform to near-one-hot."""
import math

import torch

from experiments.jasmin import proposition1
from harness.kernels.softmax import g_k

D64 = torch.float64


def _rows(N=20_000, n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    scale = 10 ** (torch.rand(N, 1, generator=g, dtype=D64) * 3 - 1.5)
    return torch.softmax(torch.randn(N, n, generator=g, dtype=D64) * scale, -1)


def _exact(P):  # ||diag(p) - p p^T|| by a dense eigensolver
    return torch.linalg.eigvalsh(torch.diag_embed(P) - P.unsqueeze(-1) * P.unsqueeze(-2))[..., -1]


def test_proposition1_holds_where_it_applies_and_applies_somewhere():
    P = _rows()
    ex = _exact(P)
    for k in proposition1.KS:
        applies, ratio = proposition1.prop1(P, ex, k)
        assert applies.any(), k  # not vacuous on this sample
        assert (ratio[applies] <= 1 + 1e-12).all(), (k, float(ratio[applies].max()))
        assert torch.isnan(ratio[~applies]).all()
        gamma = g_k(P, 1) / g_k(P, k)
        assert ((gamma[applies] >= 1) & (gamma[applies] <= k / 4)).all()
    assert not proposition1.prop1(P[:, :4], ex, 5)[0].any()  # fewer entries than k: never applies


def test_bound_formula_and_its_domain():
    g = torch.tensor([0.5, 1.0, 2.5, 3.0], dtype=D64)
    b = proposition1.bound(g, 10)
    assert math.isnan(float(b[0])) and math.isnan(float(b[3]))  # gamma < 1 or > k / 4
    assert float(b[1]) == (1 - math.sqrt(1 - 0.4)) / 2 and float(b[2]) == 0.5


def test_eq10_holds_and_finds_a_violation_when_one_is_planted():
    P = _rows(seed=1)
    g1 = g_k(P, 1)
    applies, holds = proposition1.eq10(P, g1)
    assert applies.any() and (~applies).any() and holds.all()
    bad_applies, bad_holds = proposition1.eq10(P, g1 * 0.5)  # a g_1 too small for the row's top probability
    assert not bad_holds[bad_applies].all()
