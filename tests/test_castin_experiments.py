"""Castin experiments: Prop. 3.4 via the dh x dh route vs the dense eigenproblem, soundness (bounds >= exact
constants), mass splitting (two routes agree, worked example), slope fits, and the experiments at test scale
(tiny random model, synthetic text) in float64 and float32. The layer operator is tested in test_kernels_layer."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from harness.kernels import layer as L
from harness.kernels.attention import AttentionWeights

DT = torch.float64


def _w(d=8, h=2, seed=0, scale=2.0, bias=True):
    return AttentionWeights.random(d, h, scale=scale, dtype=DT, generator=torch.Generator().manual_seed(seed), bias=bias)


def _X(B, n, d, seed=1, scale=1.0):
    return scale * torch.randn(B, n, d, dtype=DT, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("d,h,seed", [(8, 2, 0), (12, 3, 1), (6, 1, 2), (16, 4, 3)])
def test_prop34_factored_route_matches_dense_eigenproblem(d, h, seed):
    """prop34_choice's default dh x dh route equals the explicit d x d eigenproblem of A_c (float64)."""
    from harness.bounds.castin import adversarial_input, lower_bound, prop34_choice

    w = _w(d, h, seed=seed, bias=False)
    ref, ours = prop34_choice(w, method="dense"), prop34_choice(w)
    for l in range(h):
        assert (ref[l] is None) == (ours[l] is None)
        if ref[l] is None:
            continue
        assert ref[l]["case"] == ours[l]["case"]
        assert abs(float(ref[l]["gamma"] - ours[l]["gamma"])) <= 1e-9 * max(1.0, abs(float(ref[l]["gamma"])))
        Ac = w.A()[l].T
        u = ours[l]["u"]
        assert float((Ac @ u - ours[l]["lam"] * u).norm()) <= 1e-9 * max(1.0, float(torch.linalg.matrix_norm(Ac, 2)))
        if abs(float(ours[l]["lam"])) < 1e-12:  # eigenvalue 0: a (d - dh)-dim eigenspace, u not unique
            continue
        X1, X2 = adversarial_input(w, l, 5, 2.0, choices=ref), adversarial_input(w, l, 5, 2.0)
        assert min(float((X1 - X2).abs().max()), float((X1 + X2).abs().max())) <= 1e-9  # u up to sign
        lb = float(lower_bound(w, 5, 2.0, choices=ref)[l])
        assert abs(lb - float(lower_bound(w, 5, 2.0)[l])) <= 1e-9 * lb


def test_prop34_choice_rejects_unknown_method():
    from harness.bounds.castin import prop34_choice

    with pytest.raises(ValueError, match="unknown method"):
        prop34_choice(_w(8, 2, seed=0, bias=False), method="svd")


def test_prop34_lower_bound_below_true_constant_and_bound_above():
    """Soundness: Prop. 3.4 LB <= ||Df_l(X_adv)|| <= Thm 3.3 bound, per head, several n and R."""
    w = _w(8, 2, seed=12, bias=False)
    from harness.bounds.castin import adversarial_input, lower_bound, prop34_choice

    ch = prop34_choice(w)
    for n in (2, 5, 9):
        for R in (0.5, 2.0, 4.0):
            lbs = lower_bound(w, n, R, choices=ch)  # (h,)
            for l, c in enumerate(ch):
                if c is None:
                    continue
                X = adversarial_input(w, l, n, R, choices=ch)[None]
                lip = float(L.lipschitz(X, L.stack_heads(w, [l]), tol=1e-12).value[0])
                lb = float(lbs[l])
                from harness.bounds.castin import bound

                ub = float(bound(X[0], w)[l])
                assert lb <= lip * (1 + 1e-6), (n, R, l, lb, lip)
                assert lip <= ub * (1 + 1e-9)


def test_castin_bound_total_above_layer_constant():
    from harness.bounds.castin import layer_bound

    w = _w(8, 2, seed=13)
    for causal in (False, True):
        X = _X(3, 6, 8, seed=14, scale=2.0)
        assert (layer_bound(X, w, causal) >= L.lipschitz(X, w, causal).value).all()


def test_loglog_fit_recovers_power_law_and_ci():
    from experiments.figures.fits import fmt_fit, loglog_fit

    n = np.repeat(np.arange(2, 101, 2), 3).astype(float)
    rng = np.random.default_rng(0)
    y = 3.0 * n ** 0.5 * np.exp(0.05 * rng.standard_normal(n.size))
    f = loglog_fit(n, y)
    assert f["slope_lo"] < 0.5 < f["slope_hi"] and abs(f["slope"] - 0.5) < 0.02
    assert abs(f["const_sqrt"] - 3.0) < 0.1
    assert math.isnan(loglog_fit([1, 2], [1, 2])["slope"])
    assert fmt_fit({"slope": float("nan")}) == "n/a"


def test_mass_splitting_two_routes_agree_and_worked_example():
    from harness.bounds.mass_splitting import explicit_duplication, mass_splitting_map

    xs = torch.linspace(-4, 4, 13, dtype=DT)
    x1, x2 = (t.reshape(-1) for t in torch.meshgrid(xs, xs, indexing="ij"))
    for a, b in ((1, 1), (1, 2), (3, 1)):
        wm = mass_splitting_map(x1, x2, a / (a + b))
        ex = explicit_duplication(x1, x2, a, b)
        assert torch.allclose(wm["unsplit"], ex["unsplit"], rtol=1e-10)
        assert torch.allclose(wm["split"], ex["split"], rtol=1e-10)
    ex = explicit_duplication(torch.tensor([-3.0], dtype=DT), torch.tensor([-0.3], dtype=DT), 1, 1)
    assert abs(float(ex["unsplit"][0]) - 1.382) < 5e-4 and abs(float(ex["split"][0]) - 2.011) < 5e-4


def test_decoder_forward_restores_flag():
    from harness.models.text import decoder_forward

    class Cfg:
        model_type, is_decoder = "bert", False

    class M:
        config = Cfg()

    m = M()
    with decoder_forward(m, True):
        assert m.config.is_decoder
    assert not m.config.is_decoder


def _family(name: str) -> list:
    """The registered experiments of one family package (experiments/<name>/), read from the catalog."""
    from harness import catalog

    return [n for n in catalog.list_experiments()
            if type(catalog.get_experiment(n)).__module__.startswith(f"experiments.{name}.")]


CASTIN = _family("castin")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", CASTIN)
def test_experiment_runs_at_test_scale(name, dtype, tmp_path):
    """Every Castin experiment at test scale (tiny random BERT, synthetic text: no shared data needed), in
    float64 and float32 (or it declares that it refuses float32, with a reason)."""
    from harness.catalog import Context, get_experiment

    exp = get_experiment(name)
    if dtype not in exp.dtypes:
        assert exp.dtype_note
        return
    ctx = Context(scale="test", dtype=dtype, cache_dir=tmp_path, progress=False)
    cells = exp.cells("test")
    rows = exp.run(cells[0], ctx)
    assert rows and all(isinstance(r, dict) for r in rows)
    import pandas as pd

    table = pd.DataFrame([dict(cells[0], **r) for r in rows])
    assert isinstance(exp.summary(table), str)
    if name == "castin_sqrt_n":
        real = table
        assert (real["bound_castin"] >= real["lipschitz"]).all() and real["converged"].all()


@pytest.mark.parametrize("masked", [False, True])
def test_adversarial_cells_are_sound(masked, tmp_path):
    """castin_sqrt_n adversarial cells (tiny random BERT): Thm 3.3/4.3 bound >= layer constant, Prop. 3.4's LB <=
    the head-alone constant unmasked, and NaN (not a number that looks like a bound) under a causal mask."""
    from harness.catalog import Context, get_experiment

    exp = get_experiment("castin_sqrt_n_adversarial")
    cell = next(c for c in exp.cells("test") if c["masked"] == masked)
    rows = exp.run(cell, Context(scale="test", cache_dir=tmp_path, progress=False))
    assert rows and all(r["converged"] for r in rows)
    assert all(r["bound_castin"] >= r["lipschitz"] for r in rows)
    if masked:
        assert all(math.isnan(r["lower_bound"]) for r in rows)
    else:
        assert all(r["lower_bound"] <= r["lipschitz_head"] * (1 + 1e-6) for r in rows)


@pytest.mark.parametrize("masked", [False, True])
def test_large_radius_reaches_the_exact_limit(masked, tmp_path):
    """Thm 3.7 / Thm 4.5 (masked): at the last radius (R^2 x score gap = settle) the head's constant equals the
    exact limit ||VO|| sqrt(max_j #{i: j*(i) = j}) with the (masked) argmax, to 1e-6."""
    from harness.catalog import Context, get_experiment

    exp = get_experiment("castin_radius_large")
    cell = next(c for c in exp.cells("test") if c["masked"] == masked)
    rows = exp.run(cell, Context(scale="test", cache_dir=tmp_path, progress=False))
    last = max(r["R"] for r in rows)
    top = [r for r in rows if r["R"] == last]
    assert top and all(r["masked"] == masked and r["R2_gap"] >= 39.9 for r in top)
    assert all(abs(r["ratio"] - r["limit_ratio"]) <= 1e-6 for r in top)
