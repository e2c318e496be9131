"""Our ViT (harness.models.vit) from a Hugging Face ViT checkpoint, at another image and patch size.

Why: JaSMin (Yudin et al.) fine-tunes an ImageNet ViT-B (e.g. google/vit-base-patch16-224-in21k) on 32x32
CIFAR with patch 4 (64 patches + cls, "to have a higher sequence length"); our training and every bound run on
our own ViT class, so the checkpoint is mapped onto it once, here.

    vit_from_hf(source, image_size=32, patch=4, n_classes=100, seed=0) -> ViT
        `source`: a local folder (config.json + model.safetensors, or a sharded model.safetensors.index.json), or
        a hub id (the local hub cache first, else downloaded unless HF_HUB_OFFLINE is set; harness.models.hub).
    hf_vit_config(source) -> dict
        The checkpoint's own architecture as ViT keyword arguments (its image_size and patch), checked.
    resample_patch_embed(weight (d, C, P, P), patch) -> (d, C, p, p); interpolate_pos(pos, grid) -> pos

Mapping (HF keys with prefix "vit." of ViTForImageClassification, or none of ViTModel): the patch projection
Conv2d (d, C, P, P) is our `embed` Linear on (C, p, p)-flattened patches (the same flatten order), resampled when
p != P; cls_token -> cls; position_embeddings (1, 1 + G*G, d) -> pos, the G x G grid part resized bicubically
(align_corners=False, as HF's interpolate_pos_encoding) to (image_size/patch)^2, the cls position kept;
per layer query/key/value/attention.output.dense -> Wq, Wk, Wv, Wo (= weight.T, x -> x W) with biases,
layernorm_before/after -> ln1/ln2, intermediate.dense / output.dense -> mlp[0] / mlp[2]; layernorm -> norm; LN eps
from layer_norm_eps. The head is a new Linear(d, n_classes) seeded by `seed` (the checkpoint's classifier is for
ImageNet's classes and is ignored, as is the pooler). Inputs are [0, 1] pixels: the image processor's
normalisation (x - mean) / std (preprocessor_config.json; 0.5 and 0.5 for google/vit-base-patch16-224) is folded
into the (resampled) patch projection, so the imported model computes on x what the checkpoint, with its kernels
resampled, computes on its normalised x. The fold comes after the resampling: the folded bias depends on the
kernel's sum, which the pseudo-inverse keeps when growing a kernel but not when shrinking it.

Patch resampling (FlexiViT, Beyer et al. 2023; timm's resample_patch_embed): a P x P patch x seen as p x p is
resize(x) = B x, B the (p^2, P^2) matrix of bilinear resizing (antialiased when shrinking, as FlexiViT's
jax.image.resize). The new kernel w' should give the same token: <x, w> = <B x, w'> for all x, i.e. B^T w' = w;
the least-squares answer is w' = pinv(B^T) w. Growing (p > P) B^T w' = w is solvable and the equality holds for
every patch. Shrinking (p < P, the JaSMin case) it holds exactly for patches x in the range of B^T (smooth ones)
and in general <B x, w'> = <Pi x, w>, Pi the orthogonal projection onto that range: the detail a p x p patch
cannot hold is dropped.

Weights are read with safetensors only, never torch.load / pickle (a folder with only pytorch_model.bin is
refused); config.json with json. Every tensor's shape is checked against the config before use. A bad config or
tensor raises BadCheckpoint (a ValueError) naming the file and key; an absent folder or model DataNotFound.
"""
from __future__ import annotations

import functools
import hashlib
import json
import math
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from harness.errors import AttnLipError, DataNotFound
from harness.kernels.linalg import all_finite
from harness.models import hub
from harness.models.vit import ViT

Tensor = torch.Tensor
SAFE_FILES = ("model.safetensors", "model.safetensors.index.json")
PATTERNS = ("config.json", "preprocessor_config.json", "model.safetensors", "model-*.safetensors",
            "model.safetensors.index.json")
IGNORED = ("pooler.", "embeddings.mask_token")  # under the prefix, not part of our ViT


class BadCheckpoint(AttnLipError, ValueError):
    """A checkpoint whose config or weights are not a plain Hugging Face ViT that maps onto ours."""


def checkpoint_folder(source: str) -> Path:
    """The folder of `source`: itself when it is a local folder, else the hub model's snapshot (cached or
    downloaded: safetensors weights only)."""
    src = str(source)
    p = Path(src).expanduser()
    if p.is_dir():
        return p
    if _is_path(src, p):
        raise DataNotFound(f"no ViT checkpoint folder {src} (a folder with config.json and model.safetensors, "
                           f"or a Hugging Face hub id)")
    snap = hub.cached_snapshot(src, SAFE_FILES)
    if snap:
        return Path(snap)
    rem = hub.remote(src)
    if rem.sha and hub.wanted(rem, ("*.safetensors",)):
        return Path(hub.download(rem, PATTERNS))
    if rem.sha or hub.cached_snapshot(src):
        raise DataNotFound(f"hub model {src!r} has no safetensors weights (AttnLip never unpickles "
                           f"pytorch_model.bin)")
    raise DataNotFound(hub.not_found("ViT checkpoint", src, rem), fix=f"{hub.CLI} {src}")


def _read_config(folder: Path) -> dict:
    f = folder / "config.json"
    if not f.is_file():
        raise DataNotFound(f"{folder} has no config.json: not a Hugging Face checkpoint folder")
    try:
        cfg = json.loads(f.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadCheckpoint(f"{f}: not a JSON config ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("model_type") != "vit":
        mt = cfg.get("model_type") if isinstance(cfg, dict) else None
        raise BadCheckpoint(f"{f}: model_type is {mt!r}, not 'vit' (only plain ViT checkpoints map onto our ViT)")
    return cfg


def _config_kwargs(cfg: dict, f: Path) -> dict:
    """ViT keyword arguments of a checked HF ViT config (the checkpoint's own image size and patch)."""
    def pos_int(key, default=None):
        v = cfg.get(key, default)
        if isinstance(v, (list, tuple)) and len(v) == 2 and v[0] == v[1]:
            v = v[0]  # a square (size, size)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise BadCheckpoint(f"{f}: {key} must be a positive integer (square images), got {v!r}")
        return v

    d, depth, heads = pos_int("hidden_size"), pos_int("num_hidden_layers"), pos_int("num_attention_heads")
    inner, size, P = pos_int("intermediate_size"), pos_int("image_size", 224), pos_int("patch_size", 16)
    C = pos_int("num_channels", 3)
    act, eps, qkv_bias = cfg.get("hidden_act", "gelu"), cfg.get("layer_norm_eps", 1e-12), cfg.get("qkv_bias", True)
    if act != "gelu":
        raise BadCheckpoint(f"{f}: hidden_act {act!r} is not 'gelu' (exact GELU, the only one our ViT has)")
    if d % heads or cfg.get("head_dim", d // heads) != d // heads:
        raise BadCheckpoint(f"{f}: hidden_size {d} is not num_attention_heads {heads} x head_dim")
    if size % P:
        raise BadCheckpoint(f"{f}: image_size {size} is not a multiple of patch_size {P}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < 1:
        raise BadCheckpoint(f"{f}: layer_norm_eps must be a number in (0, 1), got {eps!r}")
    if not isinstance(qkv_bias, bool):
        raise BadCheckpoint(f"{f}: qkv_bias must be true or false, got {qkv_bias!r}")
    return dict(image_size=size, patch=P, in_chans=C, d=d, depth=depth, heads=heads, mlp_ratio=inner / d,
                qkv_bias=qkv_bias, ln_eps=float(eps), intermediate_size=inner)


def hf_vit_config(source: str) -> dict:
    """The checkpoint's architecture as ViT keyword arguments (its own image_size and patch), checked."""
    folder = checkpoint_folder(source)
    kw = _config_kwargs(_read_config(folder), folder / "config.json")
    kw.pop("intermediate_size")
    return kw


def _load_tensors(folder: Path) -> Tuple[Dict[str, Tensor], Dict[str, Path]]:
    """All tensors of the folder's safetensors weights and the file each came from."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    elif index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise BadCheckpoint(f"{index}: not a safetensors index ({e.__class__.__name__}: {e})") from None
        bad = [s for s in shards if not isinstance(s, str) or Path(s).name != s or s in (".", "..")
               or not s.endswith(".safetensors")]
        if bad:
            raise BadCheckpoint(f"{index}: shard names must be .safetensors files in the folder, got {bad[:3]}")
        files = [folder / s for s in shards]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise DataNotFound(f"{index} names shards absent from {folder}: {missing[:3]}")
    elif (folder / "pytorch_model.bin").is_file():
        raise DataNotFound(f"{folder} holds only pytorch_model.bin, a pickle, which AttnLip never loads (unpickling "
                           f"runs code); convert it to model.safetensors with a tool you trust")
    else:
        raise DataNotFound(f"{folder} has no model.safetensors (or model.safetensors.index.json)")
    tensors, where = {}, {}
    for f in files:
        try:
            part = load_file(str(f))
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise BadCheckpoint(f"{f}: not a readable safetensors file ({e.__class__.__name__}: {e})") from None
        tensors.update(part)
        where.update(dict.fromkeys(part, f))
    return tensors, where


def resize_matrix(old: int, new: int) -> Tensor:
    """B (new^2, old^2), float64: B x = bilinear resize (antialiased when shrinking) of an old x old image x."""
    eye = torch.eye(old * old, dtype=torch.float64).reshape(old * old, 1, old, old)
    out = F.interpolate(eye, size=(new, new), mode="bilinear", align_corners=False, antialias=new < old)
    return out.reshape(old * old, new * new).T.contiguous()


def resample_patch_embed(weight: Tensor, patch: int) -> Tensor:
    """FlexiViT's pseudo-inverse resize of patch kernels (d, C, P, P) -> (d, C, patch, patch): w' = pinv(B^T) w,
    computed in float64 and returned in weight's dtype (the module docstring says what it guarantees)."""
    d, C, P, _ = weight.shape
    if patch == P:
        return weight.clone()
    pinv_bt = torch.linalg.pinv(resize_matrix(P, patch).T)  # (patch^2, P^2)
    w = weight.detach().to(torch.float64).reshape(d, C, P * P) @ pinv_bt.T
    return w.reshape(d, C, patch, patch).to(weight.dtype)


def interpolate_pos(pos: Tensor, grid: int) -> Tensor:
    """Position embeddings (1, 1 + G*G, d) -> (1, 1 + grid*grid, d): the G x G part resized bicubically
    (align_corners=False, in float64), the cls position kept."""
    G = math.isqrt(pos.shape[1] - 1)
    if pos.dim() != 3 or pos.shape[0] != 1 or G * G != pos.shape[1] - 1:
        raise ValueError(f"position embeddings must be (1, 1 + G*G, d), got {tuple(pos.shape)}")
    if grid == G:
        return pos.clone()
    d = pos.shape[-1]
    g = pos[:, 1:].detach().to(torch.float64).reshape(1, G, G, d).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=(grid, grid), mode="bicubic", align_corners=False)
    return torch.cat([pos[:, :1], g.permute(0, 2, 3, 1).reshape(1, grid * grid, d).to(pos.dtype)], dim=1)


def _take(tensors: dict, where: dict, prefix: str, key: str, shape: tuple, used: set, folder: Path) -> Tensor:
    k = prefix + key
    if k not in tensors:
        raise BadCheckpoint(f"{folder}: the weights have no tensor {k!r} (not a ViT of this config.json?)")
    t = tensors[k]
    if tuple(t.shape) != tuple(shape):
        raise BadCheckpoint(f"{where[k]}: tensor {k!r} has shape {tuple(t.shape)}, config.json implies "
                            f"{tuple(shape)}")
    if not t.is_floating_point() or not all_finite(t):
        raise BadCheckpoint(f"{where[k]}: tensor {k!r} is not finite floating point ({t.dtype})")
    used.add(k)
    return t.to(torch.float32)


def _is_path(src: str, p: Path) -> bool:
    """Whether `src` names a local folder rather than a hub id (a hub id is 'owner/name' or 'name')."""
    return p.exists() or p.is_absolute() or src.startswith((".", "~")) or src.count("/") > 1


@functools.lru_cache(maxsize=64)
def _content_digest(folder: str, stamp: tuple) -> str:
    """sha256 (12 hex) over the checkpoint files' names and bytes; `stamp` (names, sizes, mtimes) keys the cache."""
    h = hashlib.sha256()
    for name, _, _ in stamp:
        h.update(name.encode())
        with open(Path(folder) / name, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 24), b""):
                h.update(block)
    return h.hexdigest()[:12]


def weights_source(source: str) -> str:
    """The weights `vit_from_hf(source)` would read, named without loading them (an experiment's model_source and
    the fine-tuned model's artifact key): "local:<folder>@<content digest>", "hub:<id>@<revision>" (cached or
    downloadable), "unavailable:hub:<id>" (the planner then skips the cell with `hf download <id>`,
    harness.run.preflight) or "unavailable:local:<path>" (no such folder)."""
    src = str(source)
    p = Path(src).expanduser()
    if p.is_dir():
        files = sorted(f for f in p.iterdir() if f.is_file() and (f.suffix == ".safetensors" or f.name in (
            "config.json", "preprocessor_config.json", "model.safetensors.index.json")))
        stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files)
        return f"local:{p.resolve()}@{_content_digest(str(p.resolve()), stamp)}"
    if _is_path(src, p):
        return f"unavailable:local:{src}"
    snap = hub.cached_snapshot(src, SAFE_FILES)
    if snap:
        return f"hub:{src}@{snap.rsplit('/', 1)[-1][:12]}"
    rem = hub.remote(src)
    if rem.sha and hub.wanted(rem, ("*.safetensors",)):
        return f"hub:{src}@{rem.sha[:12]}"
    return f"unavailable:hub:{src}"


def input_normalisation(folder: Path, channels: int) -> Optional[Tuple[list, list]]:
    """(mean, std) per channel that the checkpoint's image processor applies to [0, 1] pixels
    (preprocessor_config.json: do_normalize, image_mean, image_std; google/vit-base-patch16-224: 0.5 and 0.5), or
    None when the folder has no processor config or it does not normalise. Every value is checked."""
    f = folder / "preprocessor_config.json"
    if not f.is_file():
        return None
    try:
        cfg = json.loads(f.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadCheckpoint(f"{f}: not a JSON config ({e})") from None
    if not isinstance(cfg, dict) or not cfg.get("do_normalize", True):
        return None
    out = []
    for key in ("image_mean", "image_std"):
        v = cfg.get(key)
        v = [v] * channels if isinstance(v, (int, float)) and not isinstance(v, bool) else v
        if not (isinstance(v, list) and len(v) == channels and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in v)):
            raise BadCheckpoint(f"{f}: {key} must be {channels} finite numbers, got {v!r}")
        out.append([float(x) for x in v])
    if min(out[1]) <= 0:
        raise BadCheckpoint(f"{f}: image_std must be positive, got {out[1]}")
    return out[0], out[1]


def fold_normalisation(weight: Tensor, bias: Tensor, norm: Optional[Tuple[list, list]]) -> Tuple[Tensor, Tensor]:
    """The patch projection (weight (d, C, p, p), bias (d,)) that maps [0, 1] pixels x to what the checkpoint maps
    (x - mean) / std to: weight / std per channel, bias - sum(weight * mean / std). Unchanged when norm is None.
    `weight` is the kernel as the model will use it (after any resampling), since the bias depends on its sum."""
    if norm is None:
        return weight, bias
    C = weight.shape[1]
    m, s = (torch.tensor(v, dtype=torch.float64).reshape(1, C, 1, 1) for v in norm)
    w = weight.to(torch.float64) / s  # float64; load_state_dict rounds once
    return w, bias.to(torch.float64) - (w * m).sum(dim=(1, 2, 3))


def vit_from_hf(source: str, image_size: int = 32, patch: int = 4, n_classes: int = 100, seed: int = 0,
                qkv_bias: Optional[bool] = None) -> ViT:
    """Our ViT (float32, eval mode) from a Hugging Face ViT checkpoint (folder or hub id), for image_size x
    image_size inputs with `patch` x `patch` patches and a new `n_classes` head seeded by `seed`. qkv_bias: None
    keeps the checkpoint's q/k/v biases, False removes them (JaSMin's fine-tuning removes them, for a fair
    comparison with Specformer), True requires them."""
    for name, v in (("image_size", image_size), ("patch", patch), ("n_classes", n_classes)):
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if image_size % patch:
        raise ValueError(f"image_size = {image_size} is not divisible by patch = {patch}")
    folder = checkpoint_folder(source)
    kw = _config_kwargs(_read_config(folder), folder / "config.json")
    tensors, where = _load_tensors(folder)
    prefix = next((p for p in ("vit.", "") if p + "embeddings.cls_token" in tensors), None)
    if prefix is None:
        raise BadCheckpoint(f"{folder}: the weights have neither 'vit.embeddings.cls_token' nor "
                            f"'embeddings.cls_token' (not a ViTModel / ViTForImageClassification checkpoint)")
    d, C, P, G, inner = kw["d"], kw["in_chans"], kw["patch"], kw["image_size"] // kw["patch"], kw["intermediate_size"]
    if qkv_bias and not kw["qkv_bias"]:
        raise BadCheckpoint(f"{folder / 'config.json'}: qkv_bias is false, but q/k/v biases were asked for")
    keep_bias = kw["qkv_bias"] if qkv_bias is None else bool(qkv_bias)
    used: set = set()

    def take(key, *shape):
        return _take(tensors, where, prefix, key, shape, used, folder)

    # Resample first, then fold: the folded bias uses the kernel's sum, which the pseudo-inverse does not keep
    # when it shrinks a kernel; folding the P x P kernel would give a bias that is wrong for the p x p one.
    W = resample_patch_embed(take("embeddings.patch_embeddings.projection.weight", d, C, P, P).to(torch.float64), patch)
    W, b = fold_normalisation(W, take("embeddings.patch_embeddings.projection.bias", d), input_normalisation(folder, C))
    sd = {"embed.weight": W.reshape(d, C * patch * patch), "embed.bias": b,
          "cls": take("embeddings.cls_token", 1, 1, d),
          "pos": interpolate_pos(take("embeddings.position_embeddings", 1, 1 + G * G, d), image_size // patch),
          "norm.weight": take("layernorm.weight", d), "norm.bias": take("layernorm.bias", d)}
    for i in range(kw["depth"]):
        L, B = f"encoder.layer.{i}.", f"blocks.{i}."
        for ours, theirs in (("q", "query"), ("k", "key"), ("v", "value")):
            sd[f"{B}attn.W{ours}"] = take(f"{L}attention.attention.{theirs}.weight", d, d).T.contiguous()
            if kw["qkv_bias"]:  # taken (shape-checked) even when removed
                bias = take(f"{L}attention.attention.{theirs}.bias", d)
                if keep_bias:
                    sd[f"{B}attn.b{ours}"] = bias
        sd[f"{B}attn.Wo"] = take(f"{L}attention.output.dense.weight", d, d).T.contiguous()
        sd[f"{B}attn.bo"] = take(f"{L}attention.output.dense.bias", d)
        for ours, theirs in (("ln1", "layernorm_before"), ("ln2", "layernorm_after")):
            sd[f"{B}{ours}.weight"] = take(f"{L}{theirs}.weight", d)
            sd[f"{B}{ours}.bias"] = take(f"{L}{theirs}.bias", d)
        sd[f"{B}mlp.0.weight"] = take(f"{L}intermediate.dense.weight", inner, d)
        sd[f"{B}mlp.0.bias"] = take(f"{L}intermediate.dense.bias", inner)
        sd[f"{B}mlp.2.weight"] = take(f"{L}output.dense.weight", d, inner)
        sd[f"{B}mlp.2.bias"] = take(f"{L}output.dense.bias", d)
    extra = sorted(k for k in tensors if k.startswith(prefix) and k not in used
                   and not k[len(prefix):].startswith(IGNORED))
    if extra:
        raise BadCheckpoint(f"{where[extra[0]]}: tensors config.json does not account for: {extra[:4]}"
                            f"{' ...' if len(extra) > 4 else ''} (num_hidden_layers or the layout differ)")
    with torch.random.fork_rng(devices=[]):  # the construction's random init leaves the caller's RNG alone
        torch.manual_seed(seed)
        model = ViT(image_size=image_size, patch=patch, in_chans=C, n_classes=n_classes, d=d, depth=kw["depth"],
                    heads=kw["heads"], mlp_ratio=kw["mlp_ratio"], qkv_bias=keep_bias, ln_eps=kw["ln_eps"])
    if model.blocks[0].mlp[0].out_features != inner:
        raise BadCheckpoint(f"{folder / 'config.json'}: intermediate_size {inner} is not a width our ViT builds")
    g = torch.Generator().manual_seed(seed)  # nn.Linear's default init, from `seed` alone
    bound = 1 / math.sqrt(d)
    sd["head.weight"] = (torch.rand(n_classes, d, generator=g, dtype=torch.float64) * 2 - 1).mul(bound).float()
    sd["head.bias"] = (torch.rand(n_classes, generator=g, dtype=torch.float64) * 2 - 1).mul(bound).float()
    model.load_state_dict(sd, strict=True)
    return model.eval()
