"""harness.models.vit_import: our ViT from a Hugging Face ViT checkpoint. Tiny random HF ViTs are saved with
save_pretrained (safetensors) in tmp. Same patch and size: hidden states, attention inputs and probabilities equal
HF's in float64. Resampled patches (FlexiViT's pinv resize): what the resize guarantees, per kernel and end to end;
interpolated positions equal HF's interpolate_pos_encoding. Hostile folders: clear errors, nothing unpickled."""
from __future__ import annotations

import hashlib
import json
import pickle

import pytest
import torch
import torch.nn.functional as F

transformers = pytest.importorskip("transformers")
from harness.errors import DataNotFound  # noqa: E402
from harness.models import vit_import as VI  # noqa: E402
from harness.models.vit import ViT  # noqa: E402

D64 = torch.float64


def save_hf(folder, classify=False, seed=0, **over):
    """A tiny HF ViT (d 32, 2 layers, 4 heads) with every parameter perturbed, saved as safetensors; the model."""
    from transformers import ViTConfig, ViTForImageClassification, ViTModel

    kw = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, image_size=16,
              patch_size=4, num_channels=3)
    torch.manual_seed(seed)
    m = (ViTForImageClassification if classify else ViTModel)(ViTConfig(**{**kw, **over}))
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    m.save_pretrained(folder, safe_serialization=True)
    return m.double().eval()


def base(m):
    return getattr(m, "vit", m)


def patchify(x, p):  # (B, C, H, W) -> (B, G, G, C, p, p)
    B, C, H, W = x.shape
    return x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)


def unpatchify(t):  # inverse of patchify
    B, G, _, C, p, _ = t.shape
    return t.permute(0, 3, 1, 4, 2, 5).reshape(B, C, G * p, G * p)


@pytest.mark.parametrize("classify,qkv_bias", [(False, True), (True, True), (False, False)])
def test_same_patch_equals_hf_in_float64(tmp_path, classify, qkv_bias):
    hf = save_hf(tmp_path, classify, qkv_bias=qkv_bias)
    ours = VI.vit_from_hf(str(tmp_path), image_size=16, patch=4, n_classes=5)
    assert not ours.training and ours.config["ln_eps"] == 1e-12 and ours.blocks[0].ln1.eps == 1e-12
    assert (ours.blocks[0].attn.bq is not None) == qkv_bias and ours.head.out_features == 5
    ours = ours.double()
    x = torch.rand(2, 3, 16, 16, dtype=D64, generator=torch.Generator().manual_seed(1))
    captured = {}
    hooks = [layer.layernorm_before.register_forward_hook(lambda mod, i, o, l=l: captured.__setitem__(l, o))
             for l, layer in enumerate(base(hf).layers)]
    with torch.no_grad():
        out = base(hf)(pixel_values=x, output_hidden_states=True)  # sdpa: float64 throughout
        _, Ps, Xs = ours(x, return_attn=True)
        z = ours.tokens(x)
        assert (z - out.hidden_states[0]).abs().max() < 1e-12
        for l, blk in enumerate(ours.blocks):
            z = blk(z)[0]
            assert (z - out.hidden_states[l + 1]).abs().max() < 1e-12, l
            assert (Xs[l] - captured[l]).abs().max() < 1e-12, l  # the attention input is HF's layernorm_before
        assert (ours.norm(z) - out.last_hidden_state).abs().max() < 1e-12
        for l, layer in enumerate(base(hf).layers):  # probabilities from HF's own q and k, softmax in float64
            at = layer.attention
            q, k = (proj(captured[l]).reshape(2, 17, 4, 8).transpose(1, 2) for proj in (at.q_proj, at.k_proj))
            assert (Ps[l] - torch.softmax(q @ k.transpose(-1, -2) / 8 ** 0.5, -1)).abs().max() < 1e-12
        base(hf).set_attn_implementation("eager")  # output_attentions: HF's softmax runs in float32
        att = base(hf)(pixel_values=x, output_attentions=True).attentions
    for h in hooks:
        h.remove()
    assert len(att) == 2 and all((Ps[l] - att[l]).abs().max() < 1e-6 for l in range(2))


def test_head_is_seeded_and_the_callers_rng_untouched(tmp_path):
    save_hf(tmp_path, classify=True)
    state = torch.random.get_rng_state()
    a, b = (VI.vit_from_hf(str(tmp_path), 16, 4, n_classes=7, seed=s) for s in (1, 1))
    c = VI.vit_from_hf(str(tmp_path), 16, 4, n_classes=7, seed=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a.head.weight, b.head.weight) and not torch.equal(a.head.weight, c.head.weight)
    assert torch.equal(a.blocks[1].attn.Wq, c.blocks[1].attn.Wq) and a.head.weight.abs().max() <= 32 ** -0.5
    again = ViT.from_config(a.config)  # the imported model's config rebuilds it
    again.load_state_dict(a.state_dict())
    x = torch.rand(2, 3, 16, 16)
    assert again.blocks[0].ln2.eps == 1e-12 and torch.equal(again.eval()(x), a(x))
    assert VI.hf_vit_config(str(tmp_path)) == dict(image_size=16, patch=4, in_chans=3, d=32, depth=2, heads=4,
                                                   mlp_ratio=2.0, qkv_bias=True, ln_eps=1e-12)


def test_pinv_resize_guarantees():
    g = torch.Generator().manual_seed(0)
    B = VI.resize_matrix(4, 8)  # growing: <x, w> = <B x, w'> for every x
    x = torch.randn(5, 1, 4, 4, dtype=D64, generator=g)
    assert torch.allclose(F.interpolate(x, size=(8, 8), mode="bilinear", align_corners=False).reshape(5, 64),
                          x.reshape(5, 16) @ B.T, atol=1e-14)
    w = torch.randn(6, 3, 4, 4, dtype=D64, generator=g)
    w8 = VI.resample_patch_embed(w, 8)
    assert w8.shape == (6, 3, 8, 8) and w8.dtype == D64 and torch.equal(VI.resample_patch_embed(w, 4), w)
    xs = torch.randn(10, 3, 16, dtype=D64, generator=g)
    assert torch.allclose(torch.einsum("nci,dci->nd", xs, w.reshape(6, 3, 16)),
                          torch.einsum("nci,dci->nd", xs @ B.T, w8.reshape(6, 3, 64)), atol=1e-12)
    B = VI.resize_matrix(8, 4)  # shrinking: exact for x = B^T y (the smooth patches), a projection otherwise
    w = torch.randn(6, 3, 8, 8, dtype=D64, generator=g).reshape(6, 3, 64)
    w4 = VI.resample_patch_embed(w.reshape(6, 3, 8, 8), 4).reshape(6, 3, 16)
    smooth = torch.randn(10, 3, 16, dtype=D64, generator=g) @ B
    ip = lambda a, b: torch.einsum("nci,dci->nd", a, b)  # noqa: E731
    assert torch.allclose(ip(smooth, w), ip(smooth @ B.T, w4), atol=1e-12)
    rough = torch.randn(10, 3, 64, dtype=D64, generator=g)
    proj = torch.linalg.lstsq(B.T, rough.reshape(-1, 64).T).solution.T @ B  # nearest patches in range(B^T)
    assert torch.allclose(ip(proj.reshape(10, 3, 64), w), ip(rough @ B.T, w4), atol=1e-12)
    assert (ip(rough, w) - ip(rough @ B.T, w4)).abs().max() > 1e-2  # the detail 4 x 4 patches cannot hold
    x = torch.rand(1, 1, 8, 8, dtype=D64)
    ref = F.interpolate(x, size=(4, 4), mode="bilinear", align_corners=False, antialias=True)
    assert torch.allclose(x.reshape(1, 64) @ B.T, ref.reshape(1, 16), atol=1e-14)


def final_hidden(ours, x):
    """Our final-LN hidden states (B, n, d): what HF's last_hidden_state is."""
    z = ours.tokens(x)
    for blk in ours.blocks:
        z = blk(z)[0]
    return ours.norm(z)


def test_grown_patch_on_patchwise_resized_images_equals_hf(tmp_path):
    hf = save_hf(tmp_path)  # image 16, patch 4 -> ours image 32, patch 8: the same 4 x 4 grid
    ours = VI.vit_from_hf(str(tmp_path), image_size=32, patch=8, n_classes=3)
    assert ours.embed.weight.shape == (32, 3 * 64) and ours.pos.shape == (1, 17, 32)
    ours = ours.double()
    x = torch.rand(2, 3, 16, 16, dtype=D64)
    t = patchify(x, 4).reshape(-1, 1, 4, 4)  # each 4 x 4 patch resized to 8 x 8 on its own
    big = unpatchify(F.interpolate(t, size=(8, 8), mode="bilinear", align_corners=False).reshape(2, 4, 4, 3, 8, 8))
    with torch.no_grad():
        assert (ours.tokens(big) - base(hf).embeddings(x)).abs().max() < 1e-5  # float32 rounding of w' only
        assert (final_hidden(ours, big) - base(hf)(pixel_values=x).last_hidden_state).abs().max() < 1e-4
        assert ours(big).shape == (2, 3)


def test_shrunk_patch_on_smooth_patches_equals_hf(tmp_path):
    hf = save_hf(tmp_path, patch_size=8)  # image 16, patch 8 -> ours image 8, patch 4: the same 2 x 2 grid
    ours = VI.vit_from_hf(str(tmp_path), image_size=8, patch=4, n_classes=3).double()
    B = VI.resize_matrix(8, 4)
    y = torch.randn(2 * 4 * 3, 16, dtype=D64)
    x = unpatchify((y @ B).reshape(2, 2, 2, 3, 8, 8))  # every patch in range(B^T): smooth
    small = unpatchify((y @ B @ B.T).reshape(2, 2, 2, 3, 4, 4))  # each patch resized 8 -> 4
    with torch.no_grad():
        assert (ours.tokens(small) - base(hf).embeddings(x)).abs().max() < 1e-5
        assert (final_hidden(ours, small) - base(hf)(pixel_values=x).last_hidden_state).abs().max() < 1e-4


def test_positions_interpolated_as_hf_does(tmp_path):
    hf = save_hf(tmp_path)  # grid 4 -> grid 8 (image 32, patch 4)
    ours = VI.vit_from_hf(str(tmp_path), image_size=32, patch=4, n_classes=3)
    pos = base(hf).embeddings.position_embeddings.float()
    assert ours.pos.shape == (1, 65, 32) and torch.equal(ours.pos[:, 0], pos[:, 0])
    assert torch.equal(VI.interpolate_pos(pos, 4), pos)
    const = torch.ones(1, 17, 5, dtype=D64) * 3.0
    assert torch.allclose(VI.interpolate_pos(const, 8), torch.full((1, 65, 5), 3.0, dtype=D64), atol=1e-12)
    x = torch.rand(2, 3, 32, 32, dtype=D64)
    with torch.no_grad():
        ref = base(hf).embeddings(x, interpolate_pos_encoding=True)
        out = base(hf)(pixel_values=x, interpolate_pos_encoding=True).last_hidden_state
        assert (ours.double().tokens(x) - ref).abs().max() < 1e-6  # float32 rounding of the positions only
        assert (final_hidden(ours, x) - out).abs().max() < 1e-5
    jas = VI.vit_from_hf(str(tmp_path), image_size=16, patch=2, n_classes=10)  # JaSMin-like: more tokens
    logits, Ps, _ = jas(torch.rand(2, 3, 16, 16), return_attn=True)
    assert logits.shape == (2, 10) and Ps[0].shape == (2, 4, 65, 65) and torch.isfinite(logits).all()


def _edit_config(folder, **kv):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(kv)
    (folder / "config.json").write_text(json.dumps(cfg))


UNPICKLED = []


class Canary:
    def __reduce__(self):
        return (UNPICKLED.append, ("unpickled!",))


def test_hostile_and_bad_folders(tmp_path, monkeypatch):
    def never(*a, **k):
        raise AssertionError("unpickling attempted")

    for mod, name in ((torch, "load"), (pickle, "load"), (pickle, "loads")):
        monkeypatch.setattr(mod, name, never)
    with pytest.raises(DataNotFound, match="no ViT checkpoint folder"):
        VI.vit_from_hf(str(tmp_path / "absent"))
    bin_only = tmp_path / "bin"
    bin_only.mkdir()
    (bin_only / "pytorch_model.bin").write_bytes(pickle.dumps({"w": Canary()}))
    (bin_only / "config.json").write_text(json.dumps({"model_type": "vit", "hidden_size": 32, "num_hidden_layers": 2,
                                                      "num_attention_heads": 4, "intermediate_size": 64}))
    with pytest.raises(DataNotFound, match="only pytorch_model.bin.*never loads"):
        VI.vit_from_hf(str(bin_only))
    assert not UNPICKLED
    good = tmp_path / "good"
    save_hf(good)
    VI.vit_from_hf(str(good), 16, 4)  # loads with every unpickler disabled
    for edit, match in (({"model_type": "bert"}, "model_type is 'bert'"), ({"hidden_act": "gelu_new"}, "hidden_act"),
                        ({"num_attention_heads": 5}, "hidden_size 32"), ({"qkv_bias": "yes"}, "qkv_bias"),
                        ({"num_hidden_layers": 1}, "does not account for.*encoder.layer.1"),
                        ({"num_hidden_layers": 3}, "no tensor 'encoder.layer.2")):
        bad = tmp_path / f"bad{hashlib.md5(repr(edit).encode()).hexdigest()[:6]}"
        save_hf(bad)
        _edit_config(bad, **edit)
        with pytest.raises(VI.BadCheckpoint, match=match) as e:  # a ValueError naming the file
            VI.vit_from_hf(str(bad), 16, 4)
        assert isinstance(e.value, ValueError) and str(bad) in str(e.value)
    from safetensors.torch import load_file, save_file

    sd = load_file(str(good / "model.safetensors"))
    sd["encoder.layer.1.attention.attention.key.weight"] = torch.zeros(32, 16)
    save_file(sd, str(good / "model.safetensors"))
    with pytest.raises(VI.BadCheckpoint, match=r"model\.safetensors: tensor 'encoder\.layer\.1\.attention\.attention"
                                               r"\.key\.weight' has shape \(32, 16\), config\.json implies \(32, 32\)"):
        VI.vit_from_hf(str(good), 16, 4)
    (good / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json header}")
    with pytest.raises(VI.BadCheckpoint, match="not a readable safetensors file"):
        VI.vit_from_hf(str(good), 16, 4)
    with pytest.raises(ValueError, match="not divisible"):
        VI.vit_from_hf(str(good), image_size=30, patch=4)
    assert not UNPICKLED


def test_hub_ids_through_the_cache(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(DataNotFound, match="not in the Hugging Face cache"):
        VI.vit_from_hf("acme/tiny-vit", 16, 4)
    sha = hashlib.sha1(b"acme/tiny-vit").hexdigest()
    snap = tmp_path / "hub" / "models--acme--tiny-vit" / "snapshots" / sha
    save_hf(snap, classify=True)
    (snap.parent.parent / "refs").mkdir()
    (snap.parent.parent / "refs" / "main").write_text(sha)
    a, b = VI.vit_from_hf("acme/tiny-vit", 16, 4), VI.vit_from_hf(str(snap), 16, 4)
    assert all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_old_vit_configs_still_build():
    old = dict(image_size=8, patch=2, in_chans=1, n_classes=3, d=16, depth=2, heads=4, mlp_ratio=2.0, qkv_bias=False)
    torch.manual_seed(0)
    m = ViT.from_config(old)
    assert m.config == {**old, "ln_eps": 1e-5} and all(ln.eps == 1e-5 for ln in (m.norm, m.blocks[1].ln1))
    keys = {"embed.weight", "embed.bias", "cls", "pos", "norm.weight", "norm.bias", "head.weight", "head.bias"}
    assert keys <= set(m.state_dict()) and not any("eps" in k for k in m.state_dict())
    again = ViT.from_config(m.config)
    again.load_state_dict(m.state_dict())
    x = torch.rand(2, 1, 8, 8)
    assert torch.equal(again(x), m(x))
    assert ViT(**old, ln_eps=1e-6).blocks[0].ln2.eps == 1e-6


def test_the_processors_normalisation_is_folded_into_the_patch_embedding(tmp_path):
    """With preprocessor_config.json normalising (x - mean) / std, our model on [0, 1] pixels x computes what the
    checkpoint computes on the normalised pixels; a bad processor config is refused."""
    hf = save_hf(tmp_path)
    mean, std = [0.5, 0.4, 0.3], [0.5, 0.25, 0.2]
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(
        {"do_normalize": True, "image_mean": mean, "image_std": std, "do_rescale": True}))
    ours = VI.vit_from_hf(str(tmp_path), image_size=16, patch=4, n_classes=3).double()
    x = torch.rand(2, 3, 16, 16, dtype=D64, generator=torch.Generator().manual_seed(3))
    normed = (x - torch.tensor(mean, dtype=D64).view(1, 3, 1, 1)) / torch.tensor(std, dtype=D64).view(1, 3, 1, 1)
    with torch.no_grad():
        assert (ours.tokens(x) - base(hf).embeddings(normed)).abs().max() < 1e-5  # float32 weights
        assert (final_hidden(ours, x) - base(hf)(pixel_values=normed).last_hidden_state).abs().max() < 1e-4
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"do_normalize": False}))
    plain = VI.vit_from_hf(str(tmp_path), image_size=16, patch=4, n_classes=3).double()
    with torch.no_grad():  # not normalising: the weights as they are
        assert (plain.tokens(x) - base(hf).embeddings(x)).abs().max() < 1e-5
    for bad in ({"image_mean": [0.5, 0.5], "image_std": std}, {"image_mean": mean, "image_std": [0.5, 0.0, 0.5]},
                {"image_mean": "0.5", "image_std": std}):
        (tmp_path / "preprocessor_config.json").write_text(json.dumps(bad))
        with pytest.raises(VI.BadCheckpoint, match="preprocessor_config.json"):
            VI.vit_from_hf(str(tmp_path), image_size=16, patch=4, n_classes=3)


@pytest.mark.parametrize("ckpt_patch,patch", [(8, 4), (4, 8), (4, 4)])
def test_folding_follows_the_resampled_kernel(tmp_path, ckpt_patch, patch):
    """Folded at any resampling, our model on [0, 1] pixels equals the same checkpoint imported without
    normalisation on the normalised pixels. Shrinking (8 -> 4) fails when the P x P kernel is folded before the
    resampling: the pseudo-inverse does not keep the kernel's sum, on which the folded bias depends."""
    mean, std = [0.5, 0.4, 0.3], [0.5, 0.25, 0.2]
    for name in ("norm", "plain"):
        save_hf(tmp_path / name, patch_size=ckpt_patch)
    (tmp_path / "norm" / "preprocessor_config.json").write_text(json.dumps(
        {"do_normalize": True, "image_mean": mean, "image_std": std}))
    folded = VI.vit_from_hf(str(tmp_path / "norm"), image_size=16, patch=patch, n_classes=3).double()
    plain = VI.vit_from_hf(str(tmp_path / "plain"), image_size=16, patch=patch, n_classes=3).double()
    x = torch.rand(2, 3, 16, 16, dtype=D64, generator=torch.Generator().manual_seed(5))
    normed = (x - torch.tensor(mean, dtype=D64).view(1, 3, 1, 1)) / torch.tensor(std, dtype=D64).view(1, 3, 1, 1)
    with torch.no_grad():
        assert (folded.tokens(x) - plain.tokens(normed)).abs().max() < 1e-5  # float32 weights
        assert (final_hidden(folded, x) - final_hidden(plain, normed)).abs().max() < 1e-4
