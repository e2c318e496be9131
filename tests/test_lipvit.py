"""harness.models.lipvit: LayerProject, exact spectral normalization, SLL and the blocks are what they claim (float64)."""
import math

import pytest
import torch

from harness.kernels.attention import attention
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
    cfg = dict(image_size=28, patch=14, channels=1, d=16, depth=2, heads=2, vo_norm=0.5)
    cfg.update(kw)
    return LipViT(**cfg).double().eval()


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
