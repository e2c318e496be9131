"""Checks of a saved Hugging Face model folder (config.json + safetensors weights) before any library reads it, so
a folder with absurd sizes or damaged weights is refused in one line naming the file, never loaded into a crash,
a terabyte allocation or a silently wrong model.

    check_folder(folder, classifier=False)
        config.json: every size a positive integer, hidden size divisible by the heads, normalization eps a positive
        finite number, and about as many parameters as the weights hold when the config asks for more than
        MAX_PARAMS; each safetensors file's header read by us (check_safetensors); then the model the config
        describes, built on the meta device (no memory), against the weights: same shapes, float dtypes.
        classifier: the model is loaded with its head (classifier_class), else as AutoModel.
    load(folder, classifier=False, **from_pretrained_kwargs) -> model
        from_pretrained with transformers' loading report: weights the files lack (they would be random) refused.
    classifier_class(config) -> AutoModelForImageClassification for a ViT, else AutoModelForSequenceClassification
    check_safetensors(path) -> {name: (dtype, shape)}
        The 8-byte little-endian header length within the file and at most MAX_HEADER, a JSON object, and every
        tensor's byte range inside the file, of its shape's size, the ranges tiling the data exactly.

Errors are BadCheckpoint (a ValueError): "FILE: what is wrong".
"""
from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Dict, List, Tuple

from harness.errors import AttnLipError

MAX_HEADER = 100 * 2 ** 20  # bytes; real headers are a few hundred KB even for the largest models
MAX_PARAMS = 10 ** 9  # above this, the config's size must be backed by the weights (4 GB in float32)
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4, "I16": 2,
               "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
FLOATS = ("F64", "F32", "F16", "BF16")
SIZES = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "vocab_size",
         "max_position_embeddings", "type_vocab_size", "embedding_size", "num_hidden_groups", "inner_group_num",
         "n_embd", "n_head", "n_layer", "n_positions", "n_ctx", "dim", "n_heads", "n_layers", "hidden_dim",
         "num_key_value_heads", "head_dim", "n_inner", "image_size", "patch_size", "num_channels")
OPTIONAL = ("n_inner", "head_dim", "num_key_value_heads")  # null means "derived from the other sizes"
MAY_BE_ZERO = ("type_vocab_size",)  # DeBERTa-v2 and others: no token-type embedding
EPS = ("layer_norm_eps", "layer_norm_epsilon", "rms_norm_eps", "norm_eps")
HEADS = (("hidden_size", "num_attention_heads"), ("n_embd", "n_head"), ("dim", "n_heads"))
HEADED = ("ForSequenceClassification", "ForImageClassification")  # classifiers with their trained head
SAVE = "save the model again with model.save_pretrained(DIR)"
EDIT = "correct config.json, or " + SAVE


class BadCheckpoint(AttnLipError, ValueError):
    """A model folder whose config or weights cannot be what a saved model holds."""


def classifier_class(config):
    """The transformers Auto class of a classifier with its trained head (config: a transformers config)."""
    from transformers import AutoModelForImageClassification, AutoModelForSequenceClassification

    return AutoModelForImageClassification if config.model_type == "vit" else AutoModelForSequenceClassification


def check_folder(folder, classifier: bool = False) -> None:
    """Refuse a save_pretrained folder whose config.json or safetensors weights are damaged or absurd."""
    folder = Path(folder)
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        return  # the loaders say a config is missing
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BadCheckpoint(f"{cfg_file}: not readable JSON ({e.__class__.__name__}). Fix: {SAVE}") from None
    if not isinstance(cfg, dict):
        raise BadCheckpoint(f"{cfg_file}: holds no JSON object. Fix: {SAVE}")
    check_config(cfg, cfg_file)
    tensors: Dict[str, Tuple[str, List[int], Path]] = {}
    for f in weight_files(folder):
        tensors.update({k: (*v, f) for k, v in check_safetensors(f).items()})
    # pickled weights only (transformers reads them with torch's restricted unpickler): at most one parameter per
    # two bytes of the files
    pickled = sum(f.stat().st_size for f in folder.glob("pytorch_model*.bin")) // 2
    est = param_estimate(cfg)
    stored = sum(math.prod(t[1]) for t in tensors.values()) if tensors else pickled
    if est > MAX_PARAMS and stored < est / 2:
        held = f"{'' if tensors else 'at most '}{stored:.3g}"
        raise BadCheckpoint(f"{cfg_file}: its sizes describe about {est:.3g} parameters ({4 * est / 2 ** 30:,.0f} "
                            f"GiB in float32), but the weights hold {held}: the config does not match them. "
                            f"Fix: {EDIT}")
    if tensors:
        check_shapes(folder, tensors, classifier)


def check_config(cfg: dict, f: Path) -> None:
    """Sizes positive integers, hidden size a multiple of the heads, eps positive and finite."""
    for key in SIZES:
        if key not in cfg or (cfg[key] is None and key in OPTIONAL):
            continue
        v = cfg[key]
        for x in (v if isinstance(v, list) and key in ("image_size", "patch_size") else [v]):
            if not isinstance(x, int) or isinstance(x, bool) or x < (0 if key in MAY_BE_ZERO else 1):
                kind = "a whole number >= 0" if key in MAY_BE_ZERO else "a positive integer"
                raise BadCheckpoint(f"{f}: {key} must be {kind}, got {v!r}. Fix: {EDIT}")
    for d_key, h_key in HEADS:
        d, h = cfg.get(d_key), cfg.get(h_key)
        if isinstance(d, int) and isinstance(h, int) and cfg.get("head_dim") is None and d % h:
            raise BadCheckpoint(f"{f}: {d_key} {d} is not a multiple of {h_key} {h} (each head gets "
                                f"{d_key} / {h_key} dimensions). Fix: {EDIT}")
    for key in EPS:
        if key in cfg:
            v = cfg[key]
            if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
                raise BadCheckpoint(f"{f}: {key} must be a positive finite number (it keeps the normalization's "
                                    f"division away from 0), got {v!r}. Fix: {EDIT}")


def param_estimate(cfg: dict) -> int:
    """About how many parameters the config's sizes make (embeddings and layers; MLP taken as two matrices)."""
    def first(*keys, default=0):
        for k in keys:
            if isinstance(cfg.get(k), int):
                return cfg[k]
        return default

    d = first("hidden_size", "n_embd", "dim")
    layers = first("num_hidden_groups", default=1) if cfg.get("model_type") == "albert" else \
        first("num_hidden_layers", "n_layer", "n_layers")
    inner = first("intermediate_size", "n_inner", "hidden_dim", default=4 * d)
    emb = first("embedding_size", default=d)
    rows = first("vocab_size") + first("max_position_embeddings", "n_positions")
    return layers * (4 * d * d + 2 * d * inner) + rows * emb + (emb * d if emb != d else 0)


def weight_files(folder: Path) -> List[Path]:
    """The folder's safetensors files: model.safetensors, else the shards its index names."""
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return []
    try:
        shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise BadCheckpoint(f"{index}: not a safetensors index ({e.__class__.__name__}). Fix: {SAVE}") from None
    bad = [s for s in shards if not isinstance(s, str) or Path(s).name != s or not s.endswith(".safetensors")]
    if bad:
        raise BadCheckpoint(f"{index}: shard names must be .safetensors files in the folder, got {bad[:3]}")
    missing = [s for s in shards if not (folder / s).is_file()]
    if missing:
        raise BadCheckpoint(f"{index}: names shards absent from the folder: {missing[:3]}. Fix: {SAVE}")
    return [folder / s for s in shards]


def check_safetensors(path) -> Dict[str, Tuple[str, List[int]]]:
    """{tensor name: (dtype, shape)} of a safetensors file whose header and byte ranges are sound."""
    path = Path(path)
    fix = f"Fix: {SAVE} (safetensors)"
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise BadCheckpoint(f"{path}: {size} bytes, too short for a safetensors file (truncated?). {fix}")
        n = struct.unpack("<Q", head)[0]
        if n > MAX_HEADER:
            raise BadCheckpoint(f"{path}: its header claims {n:,} bytes, beyond the {MAX_HEADER // 2 ** 20} MiB "
                                f"a safetensors header can have: not a safetensors file, or damaged. {fix}")
        if n < 2 or n > size - 8:
            raise BadCheckpoint(f"{path}: its header claims {n:,} bytes, but the file has {size - 8:,} after the "
                                f"header length: truncated or not a safetensors file. {fix}")
        raw = fh.read(n)
    try:
        header = json.loads(raw.decode("utf-8"))
    except ValueError as e:
        raise BadCheckpoint(f"{path}: its header is not JSON ({e.__class__.__name__}): not a safetensors file, "
                            f"or damaged. {fix}") from None
    if not isinstance(header, dict):
        raise BadCheckpoint(f"{path}: its header is not a JSON object. {fix}")
    data = size - 8 - n
    out, spans = {}, []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, offs = (t.get(k) for k in ("dtype", "shape", "data_offsets")) if isinstance(t, dict) else \
            (None,) * 3
        if dtype not in DTYPE_BYTES or not _ints(shape) or not _ints(offs) or len(offs) != 2 \
                or not 0 <= offs[0] <= offs[1]:
            raise BadCheckpoint(f"{path}: tensor {name!r} has no valid dtype, shape and data_offsets ({t!r:.120}). "
                                f"{fix}")
        if offs[1] > data:
            raise BadCheckpoint(f"{path}: tensor {name!r} ends at byte {offs[1]:,} of the data, but the file "
                                f"holds {data:,}: truncated. {fix}")
        if offs[1] - offs[0] != math.prod(shape) * DTYPE_BYTES[dtype]:
            raise BadCheckpoint(f"{path}: tensor {name!r} spans {offs[1] - offs[0]:,} bytes, but shape {shape} of "
                                f"{dtype} needs {math.prod(shape) * DTYPE_BYTES[dtype]:,}. {fix}")
        out[name] = (dtype, list(shape))
        spans.append((offs[0], offs[1]))
    end = 0
    for a, b in sorted(spans):
        if a != end:
            raise BadCheckpoint(f"{path}: its tensors overlap or leave a gap at data byte {min(a, end):,}. {fix}")
        end = b
    if end != data:
        raise BadCheckpoint(f"{path}: {data - end:,} bytes after the last tensor: not a safetensors file as "
                            f"saved. {fix}")
    return out


def _ints(v) -> bool:
    return isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)


def _saved_names(model) -> Dict[str, List[int]]:
    """{name in a saved file: shape} of the model's parameters: save_pretrained's own renaming when this
    transformers has one (it fuses, splits and renames some weights on load), else the parameter names."""
    params = dict(model.named_parameters())
    try:
        from transformers.core_model_loading import revert_weight_conversion

        params = revert_weight_conversion(model, params)
    except Exception:  # noqa: BLE001 - an older transformers, or no renaming for this architecture
        pass
    return {k: list(v.shape) for k, v in params.items()}


def check_shapes(folder: Path, tensors: Dict[str, Tuple[str, List[int], Path]], classifier: bool = False) -> None:
    """The model config.json describes, built on the meta device (no memory), against the weights: a weight with
    another shape than the config makes, or stored in a non-float dtype, is refused. (Weights absent from the
    files are found by `load`, with transformers' own key mapping.)"""
    import torch
    from transformers import AutoConfig, AutoModel

    cfg_file = folder / "config.json"
    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=False)
        # a folder without a classifier head is refused by its caller, in its own words
        classifier = classifier and any(a.endswith(HEADED) for a in config.architectures or ())
        with torch.device("meta"):
            model = (classifier_class(config) if classifier else AutoModel).from_config(config,
                                                                                         trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - the config is the user's file: whatever transformers makes of it
        first = (str(e).splitlines() or [""])[0][:200]
        raise BadCheckpoint(f"{cfg_file}: transformers cannot build the model it describes "
                            f"({e.__class__.__name__}: {first}). Fix: {EDIT}") from None
    prefix = getattr(model, "base_model_prefix", "")
    for name, (dtype, shape, f) in tensors.items():
        if dtype not in FLOATS and re.search(r"\.(weight|bias|gamma|beta)$", name):
            raise BadCheckpoint(f"{f}: weight {name!r} is stored as {dtype}, not a float dtype "
                                f"({', '.join(FLOATS)}). Fix: {SAVE}")
    saved = {}
    for name, t in tensors.items():
        key = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))
        saved[key] = t
        if prefix and key.startswith(prefix + "."):
            saved.setdefault(key[len(prefix) + 1:], t)
        elif prefix:
            saved.setdefault(f"{prefix}.{key}", t)
    for name, want in _saved_names(model).items():
        if name in saved and saved[name][1] != want:
            _, shape, f = saved[name]
            raise BadCheckpoint(f"{f}: weight {name!r} has shape {shape}, but config.json makes it {want}: the "
                                f"config and the weights disagree. Fix: {EDIT}")


def _from_pretrained(cls, folder: Path, **kwargs):
    """(model, loading info) of cls.from_pretrained, never the folder's code; shapes that disagree with the config
    are a BadCheckpoint."""
    try:
        return cls.from_pretrained(str(folder), output_loading_info=True, trust_remote_code=False, **kwargs)
    except RuntimeError as e:
        if "mismatched" not in str(e) and "size mismatch" not in str(e):
            raise
        raise BadCheckpoint(f"{folder}: the shapes of its weights disagree with config.json "
                            f"({str(e).splitlines()[0][:200]}). Fix: {EDIT}") from None


def load(folder, classifier: bool = False, **kwargs):
    """from_pretrained of a checked folder (AutoModel, or classifier_class with its head), never running the
    folder's code: a weight whose shape disagrees with the config, or one the files lack (transformers would
    leave it random), is a BadCheckpoint. A base model may lack the pooler (weights saved from a language-model
    head have none; the attention layers do not use it)."""
    import transformers
    from transformers import AutoConfig, AutoModel

    folder = Path(folder)
    auto = classifier_class(AutoConfig.from_pretrained(str(folder), trust_remote_code=False)) if classifier \
        else AutoModel
    def missing_of(info) -> list:
        return sorted(k for k in info.get("missing_keys", ()) if classifier or not k.startswith("pooler."))

    model, info = _from_pretrained(auto, folder, **kwargs)
    missing = missing_of(info)
    encoder_only = getattr(transformers, type(model).__name__.replace("Model", "EncoderModel"), None)
    if missing and not classifier and encoder_only is not None and all(k.startswith("decoder.") for k in missing):
        model, info = _from_pretrained(encoder_only, folder, **kwargs)  # saved from the encoder alone (T5EncoderModel)
        missing = missing_of(info)
    if missing:
        raise BadCheckpoint(f"{folder}: {len(missing)} weight(s) of the model config.json describes are not in "
                            f"its weights (e.g. {missing[0]!r}), so they would be random: the config and the "
                            f"weights disagree. Fix: {EDIT}")
    return model
