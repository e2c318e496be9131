"""The bound registry (harness.bounds.registry): complete and unique declarations, every upper bound above the
dense-Jacobian truth (with and without a causal mask, biases), shared computation, user plug-in bounds."""
import sys
import types

import pytest
import torch

from harness.bounds import castin, lofast
from harness.bounds import registry as R
from harness.bounds.input_state import InputState
from harness.kernels.attention import AttentionWeights, attention_unchecked
from harness.kernels.power import dense_jacobian

DT = torch.float64
BUILTIN = {"truth", "kim", "castin", "jasmin", "jasmin_g1", "lofast_fine", "lofast_coarse", "lofast_sharp",
           "lofast_naive", "lofast_refined"}


def _case(seed=0, B=2, n=5, d=8, h=2, bias=True, radius=3.0, scale=1.5):
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, scale=scale, generator=g, bias=bias)
    X = torch.randn(B, n, d, generator=g, dtype=DT) + 0.5 * torch.randn(d, generator=g, dtype=DT)
    return radius * X / X.norm(dim=-1, keepdim=True).mean(), w


def _dense_layer(X, w, causal):
    return torch.stack([torch.linalg.matrix_norm(
        dense_jacobian(lambda Z: attention_unchecked(Z, w, False, causal), x), ord=2) for x in X])


def test_names_and_scopes_unique_and_complete():
    bs = R.bounds()
    keys = [b.key for b in bs]
    assert len(keys) == len(set(keys))
    assert set(R.bound_names()) >= BUILTIN
    for b in bs:
        assert b.scope in R.SCOPES and b.kind in R.KINDS and b.paper and b.label and b.map
        if b.scope == "head" and b.kind in ("upper", "exact"):
            assert (b.name, "layer") in {k for k in keys}, b.name  # every per-head bound has a layer value
    assert {b.name for b in R.bounds(kind="exact")} == {"truth"}
    assert R.get("kim", "head").guaranteed is not None
    assert R.get("jasmin", "layer").from_heads and not R.get("lofast_fine", "layer").from_heads
    assert set(R.labels()) == set(R.bound_names())
    with pytest.raises(ValueError, match="unknown bound"):
        R.bounds(names=["nope"])
    with pytest.raises(ValueError, match="already registered"):
        R.declare("jasmin", "p", "l", head=lambda s: s.P_norm)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("seed,radius,bias", [(0, 3.0, True), (1, 10.0, True), (2, 1.0, False), (3, 0.3, False)])
def test_every_upper_bound_above_the_dense_truth(seed, radius, bias, causal):
    X, w = _case(seed, radius=radius, bias=bias)
    ev = R.evaluate(X, w, causal=causal, tol=1e-12)
    truth_h = castin.head_lipschitz_dense(X, w, causal)  # (B, h)
    truth_l = _dense_layer(X, w, causal)  # (B,)
    assert torch.allclose(ev.values[("truth", "head")], truth_h, rtol=1e-8)
    assert torch.allclose(ev.values[("truth", "layer")], truth_l, rtol=1e-8)
    seen = set()
    for (name, scope), v in ev.values.items():
        b = R.get(name, scope)
        if b.kind != "upper":
            continue
        seen.add(name)
        truth = truth_h if scope == "head" else truth_l
        ok = ev.guaranteed[(name, scope)]
        if scope == "head":
            ok = ok.unsqueeze(-1).expand_as(v)
        assert torch.isfinite(v).all(), name
        assert bool((v[ok] >= truth[ok] * (1 - 1e-9)).all()), (name, scope)
    user = {b.name for b in R.bounds() if R.get_any(b.name).user}  # plug-ins other tests registered
    assert seen - user == BUILTIN - {"truth"}
    assert all(r["sound"] for r in ev.rows())


def test_kim_outside_its_regime_is_not_guaranteed_nor_unsound():
    X, w = _case(4, n=2, d=4, h=1, bias=False, radius=0.05, scale=3.0)
    ev = R.evaluate(X, w, names=["kim"])
    assert not bool(ev.guaranteed[("kim", "head")].any())
    rows = [r for r in ev.rows() if r["method"] == "kim"]
    assert rows and all(r["sound"] and not r["guaranteed"] for r in rows)
    assert any(r["ratio"] < 1 for r in rows)  # below the truth there: why `guaranteed` exists


def test_lofast_entries_equal_the_paper_functions():
    X, w = _case(5)
    ev = R.evaluate(X, w, tol=1e-12, names=["lofast_fine", "lofast_coarse", "lofast_sharp"])
    for key, kw in (("lofast_fine", dict(fine=True)), ("lofast_coarse", dict(fine=False)),
                    ("lofast_sharp", dict(fine=True, softmax_lip=0.5))):
        ref = lofast.lipschitz_upper(X, w, residual=False, tol=1e-12, **kw)
        assert torch.allclose(ev.values[(key, "layer")], ref, rtol=1e-8), key
        ref_h = torch.stack([lofast.lipschitz_upper(X, w.head(l), residual=False, tol=1e-12, **kw)
                             for l in range(w.h)], -1)
        assert torch.allclose(ev.values[(key, "head")], ref_h, rtol=1e-8), key
        assert bool(ev.converged[(key, "layer")].all())


def test_lofast_limits_are_theorem1s_limit():
    """The eps -> 0 entries are lofast.theorem1_limit at the state: equal to the written-out limit
    zeta + sum_l c_l/sqrt(dh) m_l ||X V'_l|| (per head ||P_l|| ||VO_l|| + ...) and to the matching Theorem 1
    certificate's delta(X, eps)/eps as eps -> 0."""
    import math

    from harness.bounds import lofast_refined
    from harness.bounds.input_state import InputState

    X, w = _case(9)
    s = InputState(X, w, tol=1e-12)
    sq = math.sqrt(s.w.dh)
    # the refined (ours) limit reads the values about their mean token: the paper's keep ||X V'_l||
    for name, m, c, cert, v in (("lofast_fine", s.m_fine, 1.0, "fine", s.value_norm),
                                ("lofast_coarse", s.m_coarse, 1.0, "coarse", s.value_norm),
                                ("lofast_sharp", s.m_fine, 0.5, "sharp", s.value_norm),
                                ("lofast_refined", s.m_fine, lofast_refined.constant_at_zero(s.P), "refined",
                                 s.value_norm_centered)):
        layer = R.get(name, "layer").fn(s)
        assert torch.equal(layer, s.zeta + (c / sq * m * v).sum(-1)), name
        assert torch.equal(R.get(name, "head").fn(s), s.P_norm * s.VO_norm + c / sq * m * v), name
        assert torch.allclose(R.get(cert, "layer").fn(s, 1e-9) / 1e-9, layer, rtol=1e-6), name
    naive = R.get("lofast_naive", "layer").fn(s)
    assert torch.allclose(naive, (s.VO_norm * s.P_norm).sum(-1) + (s.m_coarse * s.value_norm).sum(-1) / sq,
                          rtol=1e-14)
    assert torch.allclose(R.get("naive", "layer").fn(s, 1e-9) / 1e-9, naive, rtol=1e-6)


def test_attention_maps_computed_once(monkeypatch):
    from harness.bounds import input_state

    calls = []
    real = input_state.probs
    monkeypatch.setattr(input_state, "probs", lambda *a, **k: calls.append(1) or real(*a, **k))
    X, w = _case(6)
    R.evaluate(X, w, names=["jasmin", "jasmin_g1", "lofast_fine", "lofast_naive"])
    assert len(calls) == 1


def test_evaluate_follows_the_input_dtype():
    X, w = _case(7)
    with pytest.raises(ValueError, match="the weights are float64 and X is float32"):  # never a silent rounding
        R.evaluate(X.float(), w, names=["jasmin", "castin"])
    with pytest.raises(ValueError, match="not a ball-change certificate: 'bets'"):
        R.ball_changes(InputState(X, w), 0.1, ["best", "bets"])
    ev = R.evaluate(X.float(), w, names=["jasmin", "castin"], cast=True)  # w rounded to X's dtype once, recorded
    assert ev.state.cast == "float64 -> float32"
    assert all(v.dtype == torch.float32 for v in ev.values.values())
    assert R.evaluate(X, w.to(dtype=torch.float32), names=["castin"]).state.cast is None  # widening: lossless
    ref = R.evaluate(X, w, names=["jasmin", "castin"])
    for k, v in ev.values.items():
        assert torch.allclose(v.double(), ref.values[k], rtol=1e-3), k


def test_user_bound_plugin_sound_and_unsound():
    X, w = _case(8)
    mod = types.ModuleType("_user_bounds_mod")

    def twice_castin(X, w, causal=False):
        """castin doubled (sound)"""
        return 2 * castin.bound(X, w, causal)

    def too_small(X, w):
        return torch.zeros(X.shape[:-2], dtype=X.dtype)

    mod.twice_castin, mod.too_small = twice_castin, too_small
    sys.modules[mod.__name__] = mod
    try:
        new = R.register_bound("_user_bounds_mod:twice_castin")
        assert {b.scope for b in new} == {"head", "layer"} and all(b.user for b in new)
        R.register_bound(too_small, scope="layer", name="too_small")
        assert not R.get("too_small", "layer").causal  # cannot see the mask
        ev = R.evaluate(X, w, names=["twice_castin", "too_small"])
        assert torch.allclose(ev.values[("twice_castin", "layer")], 2 * castin.bound(X, w).sum(-1))
        rows = ev.rows(model="m")
        assert all(r["sound"] for r in rows if r["method"] == "twice_castin")
        assert not any(r["sound"] for r in rows if r["method"] == "too_small")
        assert ("too_small", "layer") not in R.evaluate(X, w, causal=True, names=["too_small"]).values
        R.register_bound(lambda X, w: torch.zeros(3), name="bad_shape", scope="head")
        with pytest.raises(ValueError, match="shape"):
            R.evaluate(X, w, names=["bad_shape"])
        with pytest.raises(ValueError, match="module:function"):
            R.register_bound("no_colon")
        with pytest.raises(ValueError, match="built-in"):
            R.register_bound(twice_castin, name="castin")
    finally:
        for n in ("twice_castin", "too_small", "bad_shape"):
            R.unregister_bound(n)
        sys.modules.pop(mod.__name__, None)
    assert "twice_castin" not in R.bound_names()
    with pytest.raises(ValueError, match="built in"):
        R.unregister_bound("jasmin")


def test_a_non_finite_guaranteed_bound_is_unsound():
    assert not R.is_sound("upper", float("nan"), 1.0) and not R.is_sound("upper", float("inf"), 1.0)
    assert not R.is_sound("lower", float("nan"), 1.0)
    assert R.is_sound("upper", float("nan"), 1.0, guaranteed=False)  # not proven here: claims nothing
    X, w = _case(3)
    R.register_bound(lambda X, w: torch.full((*X.shape[:-2], w.h), float("nan"), dtype=X.dtype), name="nan_b")
    try:
        rows = R.evaluate(X, w, names=["nan_b"]).rows()
        assert rows and not any(r["sound"] for r in rows if r["method"] == "nan_b")
    finally:
        R.unregister_bound("nan_b")


def test_a_per_head_plugin_may_drop_the_batch_axis_for_one_input():
    X, w = _case(4, B=1)
    R.register_bound(lambda X, w: 2 * castin.bound(X, w)[0], name="one_input")  # (h,) for X of shape (1, n, d)
    try:
        ev = R.evaluate(X, w, names=["one_input"])
        assert torch.allclose(ev.values[("one_input", "head")], 2 * castin.bound(X, w))
        with pytest.raises(ValueError, match=r"expected \(2, 2\)"):  # two inputs: (h,) would be ambiguous
            R.evaluate(*_case(4, B=2), names=["one_input"])
    finally:
        R.unregister_bound("one_input")
