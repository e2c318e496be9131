"""Soundness of the whole-model block certificates (harness.certify): every block's certified change over a ball
is >= the largest change an attack finds (and >= the dense first-order change on small balls); every (L, K) of
the network route bounds the Jacobian norms found in the ball and the Taylor remainder."""
import math

import pytest
import torch

from harness.certify.attention import Attention
from harness.certify.block import Chain, Residual, SelectRow, margins_certified
from harness.certify.layernorm import LayerNorm
from harness.certify.mlp import ACTIVATIONS, MLP, Dense, max_abs_derivative
from harness.kernels.attention import AttentionWeights
from harness.kernels.pgd import pgd_maximize

D = torch.float64


def _g(*s, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*s, dtype=D, generator=g) * scale


def _blocks():
    d, f = 8, 16
    w = AttentionWeights.from_dense(_g(d, d, scale=0.6, seed=1), _g(d, d, scale=0.6, seed=2),
                                    _g(d, d, scale=0.4, seed=3), _g(d, d, scale=0.4, seed=4), heads=2,
                                    bq=_g(d, scale=0.1, seed=5), bk=_g(d, scale=0.1, seed=6),
                                    bv=_g(d, scale=0.1, seed=7), bo=_g(d, scale=0.1, seed=8))
    ln = LayerNorm(1 + _g(d, scale=0.3, seed=9), _g(d, scale=0.1, seed=10), 1e-5)
    return {
        "layernorm": ln,
        "layernorm_shift": LayerNorm(1 + _g(d, scale=0.3, seed=9), _g(d, seed=10), 1e-12, shift=_g(12, d, seed=11)),
        "mlp_gelu_residual": MLP(_g(d, f, scale=0.4, seed=12), _g(f, seed=13), _g(f, d, scale=0.3, seed=14),
                                 _g(d, seed=15), "gelu", residual=True),
        "mlp_relu": MLP(_g(d, f, scale=0.4, seed=12), _g(f, seed=13), _g(f, d, scale=0.3, seed=14), None, "relu"),
        "dense_tanh": Dense(_g(d, d, scale=0.5, seed=16), _g(d, seed=17), "tanh"),
        "dense_relu": Dense(_g(d, d, scale=0.5, seed=16), _g(d, seed=17), "relu"),
        "attention_residual": Attention(w, residual=True),
        "attention": Attention(w),
        "post_ln_layer": Chain([Attention(w, residual=True), ln, MLP(_g(d, f, scale=0.4, seed=12), _g(f, seed=13),
                                _g(f, d, scale=0.3, seed=14), None, "gelu", residual=True), ln]),
        "pre_ln_layer": Residual(Chain([ln, Attention(w)])),
        "pool": Chain([SelectRow(0), Dense(_g(d, d, scale=0.5, seed=16), None, "tanh")]),
    }


def _attack_change(block, X, r, rows=None):
    """The largest ||f(X') - f(X)||_F PGD finds over ||X' - X|| <= r (moving `rows` only)."""
    idx = list(range(X.shape[0])) if rows is None else list(rows)
    Y = block.forward(X)

    def obj(V):  # (k, rows, d) -> (k,)
        full = X.expand(V.shape[0], *X.shape).clone()
        full[:, idx] = V
        return torch.linalg.vector_norm((block.forward(full) - Y).flatten(1), dim=-1)

    return float(pgd_maximize(obj, X[idx][None], torch.tensor([r], dtype=D), steps=40, restarts=4,
                              batch_dims=1, seed=1).value[0])


def _jac(block, X):
    return torch.autograd.functional.jacobian(lambda V: block.forward(V), X).reshape(
        block.forward(X).numel(), X.numel())


@pytest.mark.parametrize("name", list(_blocks()))
@pytest.mark.parametrize("r", [1e-9, 1e-3, 0.3])
def test_block_change_is_above_the_attack_and_the_first_order_change(name, r):
    block = _blocks()[name]
    X = _g(6, 8, seed=20)
    prep = block.prepare(X)
    bound, _, how = block.change(prep, r, None)
    assert math.isfinite(bound) and how
    found = _attack_change(block, X, r)
    assert found <= bound * (1 + 1e-9), (name, r, found, bound, how)
    if r < 1e-2:  # the dense first-order change ||J(X)|| r, less its O(r^2) remainder, is reachable
        first = float(torch.linalg.matrix_norm(_jac(block, X), ord=2)) * r
        assert first * (1 - 50 * r) <= bound, (name, first, bound)


@pytest.mark.parametrize("name", list(_blocks()))
def test_jacobian_terms_bound_the_nominal_jacobian_and_its_variation_in_the_ball(name):
    block = _blocks()[name]
    X = _g(6, 8, seed=21)
    r = 0.2
    got = block.jacobian(block.prepare(X), r, None)
    assert got is not None
    J0, var = got
    J = _jac(block, X)
    assert float(torch.linalg.matrix_norm(J, ord=2)) <= J0 * (1 + 1e-9)
    g = torch.Generator().manual_seed(3)
    worst = 0.0
    for k in range(12):  # Jacobians at points of the ball, on its sphere and inside
        E = torch.randn(X.shape, dtype=D, generator=g)
        Z = X + E / E.norm() * r * (1.0 if k % 2 else float(torch.rand((), generator=g, dtype=D)))
        worst = max(worst, float(torch.linalg.matrix_norm(_jac(block, Z) - J, ord=2)))
    assert worst <= var * (1 + 1e-9), (name, worst, var)
    if name.startswith(("mlp", "attention", "post", "layernorm")):
        assert worst > 0  # the check compares something


def test_only_the_moving_rows_count_and_row_selection_sees_them():
    ln = _blocks()["layernorm"]
    X = _g(5, 8, seed=22)
    X[3] *= 1e-3  # a nearly constant row: its LayerNorm factor is huge
    prep = ln.prepare(X)
    assert ln.change(prep, 1e-3, (1,))[0] < ln.change(prep, 1e-3, None)[0] / 10
    found = _attack_change(ln, X, 1e-3, rows=(1,))
    assert found <= ln.change(prep, 1e-3, (1,))[0]
    assert SelectRow(0).change(X, 1.0, (2,))[0] == 0.0 and SelectRow(0).change(X, 1.0, (0,))[0] == 1.0


def test_activation_constants_are_the_functions_own():
    z = torch.linspace(-8, 8, 200001, dtype=D)
    for name, (fn, d, (lo, hi), A2) in ACTIVATIONS.items():
        num = torch.autograd.functional.jacobian(lambda t: fn(t).sum(), z)
        assert torch.allclose(num, d(z), atol=1e-12), name
        assert lo <= float(d(z).min()) + 1e-12 and float(d(z).max()) <= hi + 1e-12
        assert float(d(z).min()) < lo + 1e-6 and float(d(z).max()) > hi - 1e-6  # and they are attained
        if A2 is not None:
            second = (d(z[2:]) - d(z[:-2])) / (z[2] - z[0])
            assert float(second.abs().max()) <= A2 + 1e-6 and float(second.abs().max()) > A2 - 1e-4
        a, b = torch.tensor([-3.0, -0.5, 1.0], dtype=D), torch.tensor([-1.0, 2.0, 1.2], dtype=D)
        grid = torch.stack([torch.linspace(float(x), float(y), 20001, dtype=D) for x, y in zip(a, b)])
        assert torch.all(d(grid).abs().amax(-1) <= max_abs_derivative(name, a, b) + 1e-12)


def test_margin_test_is_cauchy_schwarz_on_the_head():
    W = torch.tensor([[1.0, -1.0], [0.0, 0.0]], dtype=D)  # logits z0 = p0, z1 = -p0
    z = torch.tensor([0.3, -0.3], dtype=D)
    assert margins_certified(z, 0, W, 0.29)  # z0 - z1 = 2 p0 moves by 2 r < 0.6
    assert not margins_certified(z, 0, W, 0.31)
    assert not margins_certified(z, 1, W, 0.0)


def test_unknown_attention_certificate_and_unsupported_activation_are_refused():
    w = AttentionWeights.from_dense(*(_g(4, 4, seed=i) for i in range(4)), heads=1)
    with pytest.raises(ValueError, match="not a ball-change certificate"):
        Attention(w, names=["secnd_order"])
    with pytest.raises(ValueError, match="no certified bound"):
        MLP(_g(4, 4), None, _g(4, 4), None, "gelu_new")


@pytest.mark.parametrize("r", [0.05, 0.5, 3.0, 30.0])
def test_layernorm_angle_bound_caps_the_change_at_any_radius_and_holds(r):
    ln = LayerNorm(1 + _g(8, scale=0.3, seed=9), _g(8, scale=0.1, seed=10), 1e-12)
    X = _g(4, 8, seed=23) * 0.1  # rows of norm ~0.3: radii beyond them are where 1/sigma_min blows up
    prep = ln.prepare(X)
    bound, _, how = ln.change(prep, r, (1,))
    assert bound <= 2 * ln.gmax * 8 ** 0.5 * (1 + 1e-12)  # never beyond LayerNorm's range
    assert _attack_change(ln, X, r, rows=(1,)) <= bound * (1 + 1e-9)
    if r >= 0.5:
        assert how == "layernorm angle"
    assert _attack_change(ln, X, r) <= ln.change(prep, r, None)[0] * (1 + 1e-9)


def test_registry_ball_changes_of_the_residual_layer_with_biases_and_a_causal_mask():
    from harness.bounds import registry
    from harness.bounds.input_state import InputState

    block = _blocks()["attention_residual"]
    w = block.w
    X = _g(6, 8, seed=24)
    causal = Attention(w, causal=True, residual=True)
    for r in (1e-3, 0.3):
        cert = registry.ball_changes(InputState(X, w, causal=True, certify={}), r, residual=True)
        plain = registry.ball_changes(InputState(X, w, causal=True), r, residual=True)
        assert set(cert) == set(plain) and "second_order" in cert and "best" in cert
        assert float(cert["best"]) == min(float(v) for k, v in cert.items() if k != "best")
        found = _attack_change(causal, X, r)
        assert found <= float(cert["best"]) * (1 + 1e-9)
        F = registry.ball_changes(InputState(X, w, causal=True), r)
        assert all(float(plain[k]) == pytest.approx(float(F[k]) + r, rel=1e-12) for k in F)  # the triangle
    # the residual map's own second-order certificate beats the triangle inequality on a small ball
    s = InputState(X, w, causal=True, certify={})
    tri = float(registry.ball_changes(s, 1e-4, ["second_order"])["second_order"]) + 1e-4
    assert float(registry.ball_changes(s, 1e-4, ["second_order"], residual=True)["second_order"]) < tri
