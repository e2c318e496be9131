"""Shared helpers of the Castin et al. experiments (MATH.md §3): log-log slope fits with confidence intervals,
real layer inputs of text models, grid parsing. The layer Jacobian operator and its norm live in
harness.kernels.layer.
"""
from __future__ import annotations

import functools
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from harness.kernels.attention import AttentionWeights

Tensor = torch.Tensor


# ---- fits ------------------------------------------------------------------------------------------------

def loglog_fit(n, y, level: float = 0.95) -> Dict[str, float]:
    """OLS of log y on log n: slope with a t-based `level` CI, constant C of y ~ C n^slope, and the constant of
    y ~ C05 sqrt(n) (fixed slope 1/2, geometric mean of y / sqrt(n)). Non-positive / non-finite points dropped."""
    from scipy import stats

    n, y = np.asarray(n, float), np.asarray(y, float)
    ok = (n > 0) & (y > 0) & np.isfinite(n) & np.isfinite(y)
    x, ly = np.log(n[ok]), np.log(y[ok])
    out = dict(slope=np.nan, slope_lo=np.nan, slope_hi=np.nan, const=np.nan, const_sqrt=np.nan,
               r2=np.nan, points=int(ok.sum()))
    if ok.sum() >= 1:
        out["const_sqrt"] = float(np.exp(np.mean(ly - 0.5 * x)))
    if ok.sum() < 3 or np.ptp(x) == 0:
        return out
    res = stats.linregress(x, ly)
    t = stats.t.ppf(0.5 + level / 2, ok.sum() - 2)
    out.update(slope=float(res.slope), slope_lo=float(res.slope - t * res.stderr),
               slope_hi=float(res.slope + t * res.stderr), const=float(np.exp(res.intercept)),
               r2=float(res.rvalue ** 2))
    return out


def fmt_fit(f: Dict[str, float]) -> str:
    """'0.48 [0.45, 0.51]' (slope and CI) for summaries."""
    if not np.isfinite(f.get("slope", np.nan)):
        return "n/a"
    return f"{f['slope']:.2f} [{f['slope_lo']:.2f}, {f['slope_hi']:.2f}]"


# ---- models and real layer inputs -----------------------------------------------------------------------

TINY = {"tiny-bert": ("bert-base-uncased", (("num_hidden_layers", 2), ("hidden_size", 32),
                                            ("num_attention_heads", 4), ("intermediate_size", 64))),
        "tiny-gpt2": ("gpt2", (("n_layer", 2), ("n_embd", 32), ("n_head", 4)))}


@functools.lru_cache(maxsize=4)
def text_model(name: str, pretrained: Optional[bool] = None, seed: int = 0):
    """(model, tokenizer, info) from harness.models.hf, cached per process. 'tiny-bert' / 'tiny-gpt2': 2-layer,
    d = 32, 4-head random models with the real tokenizers (tests; tiny-bert needs no shared data)."""
    from harness.models.hf import load_text_model

    if name in TINY:
        base, ov = TINY[name]
        return load_text_model(base, pretrained=False, seed=seed, overrides=dict(ov))
    return load_text_model(name, pretrained=pretrained, seed=seed)


def weights(name: str, layer: int, pretrained: Optional[bool] = None, seed: int = 0,
            dtype=torch.float64) -> AttentionWeights:
    """AttentionWeights (with biases) of `layer` of the model `name`."""
    from harness.models.hf import attention_weights

    return attention_weights(text_model(name, pretrained, seed)[0], layer, dtype=dtype)


@functools.lru_cache(maxsize=8)
def _corpus(name: str):
    from harness.data.text import load_corpus

    return tuple(load_corpus(name))


def chunk_ids(name: str, corpus: str, n: int, count: int, seed: int = 0, pretrained: Optional[bool] = None,
              model_seed: int = 0) -> Tensor:
    """`count` non-overlapping length-n token windows of `corpus` for model `name`'s tokenizer: (count, n).

    Seeded per n so that sequences of different lengths are drawn independently (as in the paper)."""
    from harness.data.text import token_chunks

    tok = text_model(name, pretrained, model_seed)[1]
    return token_chunks(tok, list(_corpus(corpus)), n, count, seed=seed * 100003 + n)


def real_inputs(name: str, corpus: str, layers: Sequence[int], n: int, count: int, seed: int = 0,
                pretrained: Optional[bool] = None, model_seed: int = 0, dtype=torch.float64,
                causal_forward: bool = False) -> Dict[int, Tensor]:
    """{layer: X (count, n, d)}: the exact self-attention inputs (forward hooks) on `count` corpus chunks.

    causal_forward: run a BERT-family model as a decoder (causal mask in every layer) to get the inputs."""
    from harness.models.hf import attention_inputs

    ids = chunk_ids(name, corpus, n, count, seed, pretrained, model_seed)
    model = text_model(name, pretrained, model_seed)[0]
    with decoder_forward(model, causal_forward):
        return attention_inputs(model, ids, list(layers), dtype=dtype)


def no_bias(w: AttentionWeights) -> AttentionWeights:
    """The same weights without biases (Castin's propositions are stated bias-free)."""
    return AttentionWeights(w.wq, w.wk, w.wv, w.wo)



# ---- grids and forward passes ----------------------------------------------------------------------------

def parse_ns(spec) -> list:
    """Sequence lengths from a JSON-friendly spec: '2:100:2' (inclusive range), '2,4,8', or both comma-joined."""
    if isinstance(spec, int):
        return [spec]
    out = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            a, b, *s = (int(t) for t in part.split(":"))
            out.extend(range(a, b + 1, s[0] if s else 1))
        else:
            out.append(int(part))
    if not out or min(out) < 1:
        raise ValueError(f"bad sequence-length spec {spec!r}: need positive integers like '2:100:2' or '2,4,8'")
    return sorted(set(out))


class decoder_forward:
    """Context manager: run a BERT-family model as a decoder (config.is_decoder=True, causal mask in every
    layer, as the paper's 'BERT decoder'); GPT-2 is causal already. Restores the flag on exit."""

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


def pretrained_arg(value):
    """Grid value 'auto' | True | False -> load_text_model's pretrained (None | True | False)."""
    if value in (None, "auto"):
        return None
    if isinstance(value, bool):
        return value
    raise ValueError(f"pretrained must be 'auto', true or false, got {value!r}")
