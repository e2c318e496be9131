"""Shared helpers of the Castin et al. experiments (MATH.md §3): the Jacobian of one multi-head attention layer
as a batched matrix-free operator, its norm (correct estimator) and the paper code's estimator, warm starts
across sequence lengths, log-log slope fits with confidence intervals, and real layer inputs of text models.

The measured map is the self-attention layer itself, F(X) = sum_l P_l(X) (X wv_l + bv_l) wo_l + bo (biases as
the model has them, no residual, no LayerNorm), causally masked when `causal`. Its differential (Lemma C.2 with
biases, Castin App. E.3) at X (..., n, d), with q = X wq + bq, k = X wk + bk, v = X wv + bv per head:
    dS = (dX wq k^T + q (dX wk)^T) / sqrt(dh),   dP = P * (dS - rowsum(P * dS)),
    dF = sum_l (dP_l v_l + P_l dX wv_l) wo_l.
`layer_operator` applies it and its adjoint with the forward quantities computed once, about half the cost of
torch.func.jvp/vjp (which recompute the forward pass); tests check it against kernels.power.dense_jacobian.
"""
from __future__ import annotations

import functools
import math
from typing import Dict, Optional, Sequence

import numpy as np
import torch

from harness.kernels.attention import AttentionWeights, attention_unchecked, causal_mask, check_input
from harness.kernels.power import PowerResult, top_singular_value

Tensor = torch.Tensor

TOL = 1e-6  # relative Ritz residual on sigma^2: sigma to ~5e-7 relative, far below the spread across sequences


# ---- the operator -------------------------------------------------------------------------------------------

def _heads(t: Tensor, h: int) -> Tensor:
    """(..., n, h*dh) -> (..., h, n, dh)."""
    return t.unflatten(-1, (h, -1)).transpose(-2, -3)


def _merge(t: Tensor) -> Tensor:
    """(..., h, n, dh) -> (..., n, h*dh)."""
    return t.transpose(-2, -3).flatten(-2)


def layer_operator(X: Tensor, w: AttentionWeights, causal: bool = False):
    """(matvec, rmatvec) of the Jacobian J_F(X) of F(X) = sum_l P_l (X wv_l + bv_l) wo_l + bo: (..., n, d) both ways.

    Weights may carry leading batch dims broadcasting against X's (e.g. one head per batch element). The three
    input projections are one (d, 3 h dh) GEMM and the output projection one (h dh, d) GEMM.
    """
    check_input(X, w.d)
    X = X.detach()
    h, dh = w.wq.shape[-3], w.dh
    sc = 1.0 / math.sqrt(dh)
    # (..., d, 3*h*dh): [wq | wk | wv], heads contiguous inside each block
    Wqkv = torch.cat([t.transpose(-2, -3).flatten(-2) for t in (w.wq, w.wk, w.wv)], dim=-1)
    Wo = w.wo.flatten(-3, -2)  # (..., h*dh, d)
    WqkvT, WoT = Wqkv.transpose(-1, -2), Wo.transpose(-1, -2)
    qkv = X @ Wqkv  # (..., n, 3*h*dh)
    q, k, v = (_heads(t, h) for t in qkv.chunk(3, dim=-1))  # (..., h, n, dh)
    if w.bq is not None:
        q = q + w.bq.unsqueeze(-2)
    if w.bk is not None:
        k = k + w.bk.unsqueeze(-2)
    if w.bv is not None:
        v = v + w.bv.unsqueeze(-2)
    S = q @ k.transpose(-1, -2) * sc  # (..., h, n, n)
    if causal:
        S = S.masked_fill(causal_mask(X.shape[-2], X.device), float("-inf"))
    P = torch.softmax(S, dim=-1)  # (..., h, n, n)
    PT, kT, vT = P.transpose(-1, -2), k.transpose(-1, -2), v.transpose(-1, -2)

    def softmax_diff(dS):  # dP = P * (dS - rowsum(P * dS)); self-adjoint in dS
        return P * (dS - (P * dS).sum(-1, keepdim=True))

    def matvec(U: Tensor) -> Tensor:
        dq, dk, dv = (_heads(t, h) for t in (U @ Wqkv).chunk(3, dim=-1))  # (..., h, n, dh)
        dS = (dq @ kT + q @ dk.transpose(-1, -2)) * sc  # (..., h, n, n)
        dP = softmax_diff(dS)  # masked entries have P = 0, so dP = 0 there
        return _merge(dP @ v + P @ dv) @ Wo  # (..., n, d)

    def rmatvec(G: Tensor) -> Tensor:
        Gh = _heads(G @ WoT, h)  # (..., h, n, dh)
        dS = softmax_diff(Gh @ vT) * sc  # (..., h, n, n)
        dq, dk, dv = dS @ k, dS.transpose(-1, -2) @ q, PT @ Gh  # (..., h, n, dh)
        return torch.cat([_merge(dq), _merge(dk), _merge(dv)], dim=-1) @ WqkvT  # (..., n, d)

    return matvec, rmatvec


def layer_map(w: AttentionWeights, causal: bool = False):
    """F as a function of X only (for torch.func-based estimators)."""
    return lambda Z: attention_unchecked(Z, w, residual=False, causal=causal)


# ---- norms ------------------------------------------------------------------------------------------------

def lipschitz(X: Tensor, w: AttentionWeights, causal: bool = False, tol: float = TOL, iters: int = 2000,
              v0: Optional[Tensor] = None, seed: int = 0, method: str = "lanczos", krylov: int = 30) -> PowerResult:
    """||J_F(X)|| per sequence (correct estimator, MATH.md §3) for X (..., n, d): PowerResult with (...,) values.

    Batched: one operator per leading index, all iterated together. v0: warm start (..., n, d).
    """
    matvec, rmatvec = layer_operator(X, w, causal)
    if v0 is None:
        g = torch.Generator(device=X.device).manual_seed(seed)
        v0 = torch.randn(X.shape, dtype=X.dtype, device=X.device, generator=g)
    return top_singular_value(matvec, rmatvec, v0, event_dims=2, iters=iters, tol=tol,
                              on_nonconvergence="ignore", method=method, krylov=krylov)


def paper_value(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """The paper code's estimator, sqrt(||J_F(X)^T F(X)||_F) (jvp[0] = F(X) defect), in closed form: (...,).

    Equal to kernels.power.paper_estimator(F, X) after its first step (every step computes J^T F(X)); tested.
    """
    _, rmatvec = layer_operator(X, w, causal)
    FX = attention_unchecked(X, w, residual=False, causal=causal)  # (..., n, d)
    return rmatvec(FX).flatten(-2).norm(dim=-1).sqrt()


def warm_start(prev: Optional[Tensor], shape: Sequence[int], seed: int = 0, dtype=torch.float64,
               device=None) -> Tensor:
    """Start vector for length-n sequences from the top vectors of shorter ones: prev (B', m, d) -> (*shape).

    Rows beyond m are filled with a fresh Gaussian at the rms row scale of prev; a 10 % Gaussian is mixed
    in everywhere so no component of the new top vector is exactly missing. None -> plain Gaussian.
    """
    g = torch.Generator(device=device).manual_seed(seed)
    noise = torch.randn(tuple(shape), dtype=dtype, device=device, generator=g)
    if prev is None:
        return noise
    B, n, d = shape[-3], shape[-2], shape[-1]
    if prev.shape[-1] != d:
        raise ValueError(f"warm start has feature dimension {prev.shape[-1]}, expected {d}")
    p = prev.reshape(-1, prev.shape[-2], d)
    p = p[torch.arange(B) % p.shape[0]]  # (B, m, d)
    p = p / p.flatten(1).norm(dim=-1).clamp_min(1e-300)[:, None, None]
    m = min(n, p.shape[1])
    rms = 1.0 / math.sqrt(p.shape[1])
    v = noise * rms / math.sqrt(d)
    v[:, :m] = p[:, :m]
    return v + 0.1 * noise * rms / math.sqrt(d)


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


def castin_bound_total(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """Thm 3.3 / 4.3 for the multi-head layer: sum over heads (MATH.md §0), biases via JaSMin Remark 2: (...,)."""
    from harness.bounds.castin import bound

    return bound(X, w, causal=causal).sum(-1)


def no_bias(w: AttentionWeights) -> AttentionWeights:
    """The same weights without biases (Castin's propositions are stated bias-free)."""
    return AttentionWeights(w.wq, w.wk, w.wv, w.wo)


def stack_heads(w: AttentionWeights, heads: Sequence[int], bias: bool = False) -> AttentionWeights:
    """Single-head weights of several heads stacked on a leading batch axis: wq (H, 1, d, dh), ..., for
    layer_operator on X (H, n, d) whose element b is measured under head heads[b] alone."""
    idx = torch.as_tensor(list(heads), dtype=torch.long)
    pick = lambda t: t[idx].unsqueeze(1)  # (H, 1, ., .)
    pb = (lambda t: None if (t is None or not bias) else t[idx].unsqueeze(1))  # (H, 1, dh)
    return _BatchedWeights(pick(w.wq), pick(w.wk), pick(w.wv), pick(w.wo), pb(w.bq), pb(w.bk), pb(w.bv))


class _BatchedWeights:
    """Duck-typed AttentionWeights with leading batch dims (layer_operator only reads wq..bv, d, dh)."""

    def __init__(self, wq, wk, wv, wo, bq=None, bk=None, bv=None, bo=None):
        self.wq, self.wk, self.wv, self.wo, self.bq, self.bk, self.bv, self.bo = wq, wk, wv, wo, bq, bk, bv, bo
        self.d, self.dh = wq.shape[-2], wq.shape[-1]


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
