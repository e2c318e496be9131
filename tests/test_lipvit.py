"""harness.models.lipvit: LayerProject, exact spectral normalization, SLL and the blocks are what they claim (float64)."""
import math

import pytest
import torch

from harness.kernels.attention import AttentionWeights, attention
from harness.kernels.power import dense_jacobian
from harness.models.lipvit import SLL, LayerProject, LipText, LipViT, SpectralLinear, block_inputs, layer_project

DT = torch.float64


def _pairs_ratio(f, x, trials=20, scale=1.0, seed=0):
    """max ||f(x') - f(x)|| / ||x' - x|| over random pairs near x (a sampled Lipschitz lower bound)."""
    g = torch.Generator().manual_seed(seed)
    best = 0.0
    for _ in range(trials):
        a = x + scale * torch.randn(x.shape, generator=g, dtype=DT)
        b = a + 0.3 * scale * torch.randn(x.shape, generator=g, dtype=DT)
        best = max(best, float(((f(a) - f(b)).norm() / (a - b).norm()).detach()))
    return best


def test_layer_project_definition_and_lipschitz():
    x = torch.tensor([[3.0, 4.0], [0.3, 0.4]], dtype=DT)
    y = layer_project(x, 1.0)
    assert torch.allclose(y[0], torch.tensor([0.6, 0.8], dtype=DT))  # ||x|| = 5 > 1: projected onto the sphere
    assert torch.equal(y[1], x[1])  # inside the ball: unchanged
    X = torch.randn(6, 5, dtype=DT)
    assert (layer_project(X, 2.0).norm(dim=-1) <= 2.0 + 1e-12).all()
    assert _pairs_ratio(lambda z: layer_project(z, 1.0), X) <= 1.0 + 1e-12
    with pytest.raises(ValueError, match="radius"):
        LayerProject(0.0)


@pytest.mark.parametrize("c", [0.25, 1.0])
def test_spectral_linear_exact_norm(c):
    lin = SpectralLinear(7, 5, c).double()
    W = lin.weight().detach()
    assert abs(torch.linalg.svdvals(W)[0].item() - c) <= 1e-12
    with pytest.raises(ValueError):
        SpectralLinear(3, 3, -1.0)


def test_sll_is_one_lipschitz_dense_jacobian():
    torch.manual_seed(0)
    sll = SLL(6, 12).double()
    with torch.no_grad():
        sll.W.mul_(3.0)
        sll.b.normal_()
        sll.log_q.normal_()
    for _ in range(5):
        x = torch.randn(6, dtype=DT)
        J = torch.autograd.functional.jacobian(sll, x)  # (6, 6)
        assert torch.linalg.matrix_norm(J, ord=2) <= 1.0 + 1e-10
    assert _pairs_ratio(sll, torch.randn(4, 6, dtype=DT)) <= 1.0 + 1e-10


def _tiny_vit(**kw):
    torch.manual_seed(1)
    recipe = dict(image_size=28, patch=14, channels=1, d=16, depth=2, heads=2, vo_norm=0.5)
    recipe.update(kw)
    return LipViT(**recipe).double().eval()


def test_vit_shapes_patches_and_stem_lipschitz():
    m = _tiny_vit()
    x = torch.rand(3, 1, 28, 28, dtype=DT)
    assert m(x).shape == (3, 10)
    P = m.patches(x)  # (3, 4, 196), a permutation of the pixels
    assert P.shape == (3, 4, 196) and torch.allclose(P.norm(dim=(1, 2)), x.flatten(1).norm(dim=1))
    L = m.stem_lipschitz()
    assert abs(L - 1.0) < 1e-10
    assert _pairs_ratio(lambda z: m.stem(z.reshape(-1, 1, 28, 28)), x[:1].flatten()) <= L + 1e-10
    with pytest.raises(ValueError, match="expected images"):
        m(torch.rand(2, 3, 28, 28, dtype=DT))
    with pytest.raises(ValueError, match="divisible"):
        LipViT(image_size=28, patch=5)


def test_block_inputs_and_attention_weights_match_forward():
    m = _tiny_vit()
    x = torch.rand(2, 1, 28, 28, dtype=DT)
    logits, Zs = block_inputs(m, x)
    assert len(Zs) == 2 and torch.allclose(logits, m(x))
    for Z, blk, w in zip(Zs, m.blocks, m.attention_weights()):
        assert (Z.norm(dim=-1) <= 1 + 1e-12).all()  # LayerProject(1)
        assert torch.allclose(blk.attn(Z), attention(Z, w, residual=True))
        VO = torch.linalg.matrix_norm(w.VO(), ord=2)
        assert (VO <= 0.25 + 1e-12).all()  # ||VO_l|| <= ||W^V|| ||W^O|| = 0.5^2


def test_non_attention_parts_are_one_lipschitz():
    """Everything around the attention layers is 1-Lipschitz: LayerProject(sqrt d) + SLL, and the head (1/sqrt n)."""
    m = _tiny_vit()
    blk = m.blocks[0]
    f = lambda X: blk.ffn(blk.mid(X))
    X = torch.randn(4, 16, dtype=DT) * 3
    J = dense_jacobian(f, X)
    assert torch.linalg.matrix_norm(J.reshape(64, 64), ord=2) <= 1.0 + 1e-10
    head = lambda X: m.head(m.final(X).mean(dim=-2))
    Jh = dense_jacobian(head, X).reshape(10, 64)
    assert torch.linalg.matrix_norm(Jh, ord=2) <= m.head_lipschitz() + 1e-10


def test_text_model():
    torch.manual_seed(0)
    m = LipText(vocab=50, n=8, d=16, depth=1, heads=2, vo_norm=0.5, embed_scale=0.25).double().eval()
    ids = torch.randint(0, 50, (3, 8))
    E = m.embed_ids(ids)
    assert E.shape == (3, 8, 16) and m(E).shape == (3, 2) and m.stem_lipschitz() == 0.25
    assert torch.allclose(E.norm(dim=-1), torch.ones(3, 8, dtype=DT))
    E2 = E + 0.1 * torch.randn(E.shape, dtype=DT)
    assert torch.allclose((m.stem(E2) - m.stem(E)).norm(), 0.25 * (E2 - E).norm())
    with pytest.raises(ValueError, match="token ids"):
        m.embed_ids(ids[:, :5])
    assert abs(m.head_lipschitz() - 1 / math.sqrt(8)) < 1e-10


# ---- harness.models.lofast_train / lofast_eval ----------------------------------------------------------------
from harness.models import lofast_eval, lofast_train  # noqa: E402

TEST_CELL = {"layers": 1, "heads": 2, "vo_norm": 0.5, "dataset": "synthetic", "train_size": 64, "test_size": 16,
             "epochs": 1, "lr": 3e-3, "patch": 14}


class DictStore:
    """A cached_artifact-like store in memory that also checks that the object is plain data."""

    def __init__(self):
        self.blobs, self.built = {}, 0

    def __call__(self, kind, recipe, build, root=None, code=()):
        import json

        assert [m.__name__ for m in code] == ["harness.models.lofast_train"]
        key = (kind, json.dumps(recipe, sort_keys=True))
        if key not in self.blobs:
            self.built += 1
            blob = build()
            assert set(blob) == {"state_dict", "info"}
            assert all(isinstance(v, torch.Tensor) for v in blob["state_dict"].values())
            assert all(isinstance(v, (int, float, bool)) for v in blob["info"].values())
            self.blobs[key] = blob
        return self.blobs[key]


def test_lofast_cfg_from_cell_and_errors():
    recipe = lofast_train.recipe_from_cell("vit", TEST_CELL, seed=3, device="cuda:1")
    assert recipe["depth"] == 1 and recipe["heads"] == 2 and recipe["patch"] == 14 and recipe["device"] == "cuda"
    assert recipe["train_dtype"] == "float32" and recipe["seed"] == 3
    assert lofast_train.recipe_from_cell("vit", TEST_CELL, seed=0, layers=2, heads=8)["heads"] == 8
    text = lofast_train.recipe_from_cell("text", TEST_CELL, seed=0)
    assert "patch" not in text and text["n"] == 32
    with pytest.raises(ValueError, match="lacks training keys"):
        lofast_train.recipe_from_cell("vit", {"layers": 1}, seed=0)
    with pytest.raises(ValueError, match="unknown model kind"):
        lofast_train.model_recipe("rnn", layers=1, heads=1, vo_norm=0.5, seed=0, dataset="x", train_size=1,
                               test_size=1, epochs=1, lr=1.0)


@pytest.mark.parametrize("kind", ["vit", "text"])
def test_lofast_trained_model_cached_and_cast(kind):
    """One training through the store; a second call loads; dtype/device casts; deterministic from the seed."""
    recipe = lofast_train.recipe_from_cell(kind, TEST_CELL, seed=0)
    store = DictStore()
    m1, info1 = lofast_train.trained_model(recipe, store=store, dtype=torch.float64)
    m2, info2 = lofast_train.trained_model(recipe, store=store, dtype=torch.float32)
    assert store.built == 1 and not info1["cached"] and info2["cached"] and 0 <= info1["test_acc"] <= 1
    assert next(m1.parameters()).dtype == DT and next(m2.parameters()).dtype == torch.float32
    m3, _ = lofast_train.trained_model(recipe, store=None)  # no store: trains again, same weights
    for a, b in zip(m1.state_dict().values(), m3.state_dict().values()):
        assert torch.equal(a, b)
    batch, y = lofast_train.test_batch(recipe, 4)
    u = lofast_train.stem_inputs(m2, batch)
    assert u.dtype == torch.float32 and len(y) == 4
    if kind == "text":
        assert torch.allclose(u.norm(dim=-1), torch.ones(4, 32), atol=1e-5)


def test_lofast_certify_rows_float64_certificates():
    recipe = lofast_train.recipe_from_cell("vit", TEST_CELL, seed=0)
    store = DictStore()
    rows = {}
    for dt in (torch.float64, torch.float32):
        m, _ = lofast_train.trained_model(recipe, store=store, dtype=dt)
        batch, y = lofast_train.test_batch(recipe, 6)
        rows[dt] = lofast_eval.certify_rows(m, batch, y, [0.0, 0.1], pgd_steps=3, pgd_restarts=1)
    for r64, r32 in zip(rows[torch.float64], rows[torch.float32]):
        assert r64["certificate_dtype"] == "float64"
        assert set(r64) == set(r32)
        for k in ("certified_acc", "radius", "zeta_mean", "L_in", "clean_acc"):  # certificates: float64 in both
            assert r64[k] == r32[k] or (math.isnan(r64[k]) and math.isnan(r32[k]))
        if r64["kind"] == "radius":
            assert r64["margin"] == pytest.approx(r32["margin"], rel=1e-4, abs=1e-6)
        else:
            assert r64["violations"] == 0 and r64["certified_acc"] <= r64["clean_acc"]


def test_lofast_bound_rows_sound_and_shaped():
    """Every bound column >= the PGD lower bounds (eq. 23 with H = 0 and H = I; Delta_21, Delta_22)."""
    g = torch.Generator().manual_seed(0)
    w = AttentionWeights.random(8, 2, generator=g)
    X = lofast_eval.unit_rows(torch.randn(2, 5, 8, generator=g, dtype=DT))
    for residual in (False, True):
        for r in lofast_eval.multihead_rows(w, X, [0.0, 0.2], residual, pgd_steps=10, pgd_restarts=2):
            assert set(lofast_eval.BOUND_COLUMNS) <= set(r) and r["quantity"] == "delta"
            assert min(r[c] for c in lofast_eval.BOUND_COLUMNS) >= r["pgd"] - 1e-10 and r["pgd"] >= r["pgd_plain"]
    single = lofast_eval.single_head_rows(w, X, [0.2], pgd_steps=10, pgd_restarts=2)
    assert {r["quantity"] for r in single} == {"delta21", "delta22"}
    for r in single:
        bounds = [r[c] for c in lofast_eval.BOUND_COLUMNS if not math.isnan(r[c])]
        assert bounds and min(bounds) >= r["pgd"] - 1e-10


def test_lofast_ablation_rows():
    g = torch.Generator().manual_seed(1)
    w = AttentionWeights.random(8, 2, generator=g)
    X = lofast_eval.unit_rows(torch.randn(5, 8, generator=g, dtype=DT))
    rows = lofast_eval.ablation_rows(w, X, "wv", 0.1, [0.0, 1.0], samples=2)
    assert len(rows) == 3 * 3 and {r["variant"] for r in rows} == {"coarse", "fine", "sharp"}
    r32 = lofast_eval.ablation_rows(w.to(dtype=torch.float32), X.float(), "wv", 0.1, [0.0, 1.0], samples=2)
    for a, b in zip(rows, r32):  # the same Gaussian draw in both dtypes
        assert b["bound"] == pytest.approx(a["bound"], rel=1e-4)
    with pytest.raises(ValueError, match="unknown parameter"):
        lofast_eval.ablation_rows(w, X, "bq", 0.1, [1.0], 1)
