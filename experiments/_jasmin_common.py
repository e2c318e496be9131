"""Shared pieces of the JaSMin experiments: real inputs of MiniLM / GPT-2 / the trained ViT, the per-head and
per-layer true local Lipschitz constants, all bounds side by side, and the ViT recipe shared by the three
experiments (so the baseline ViT is trained once and reused as a cached artifact).
"""
from __future__ import annotations

import functools
import os
from typing import Dict, List, Optional

for _k, _v in (("HF_HUB_OFFLINE", "1"), ("HF_DATASETS_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"),
               ("MPLBACKEND", "Agg")):
    os.environ.setdefault(_k, _v)

TEXT_MODELS = ("minilm", "gpt2")
# l_inf budgets of the paper (2/255, 4/255) and larger ones that matter for Fashion-MNIST (pixels near 0 or 1)
LINF_BUDGETS = (2 / 255, 4 / 255, 8 / 255, 16 / 255)


def missing_data(e: Exception):
    """Turn an absent optional input into the registry's MissingData (the smoke test skips such cells)."""
    from harness.registry import MissingData

    return MissingData(str(e))


# ---- text models -------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=4)
def text_model(name: str):
    """(model, tokenizer, info): MiniLM with its pretrained weights, GPT-2 random init (seed 0), eval mode."""
    from harness.models.hf import load_text_model

    if name not in TEXT_MODELS:
        raise ValueError(f"text model must be one of {TEXT_MODELS}, got {name!r}")
    try:
        return load_text_model(name, pretrained=False if name == "gpt2" else True, seed=0)
    except FileNotFoundError as e:
        raise missing_data(e) from e


def text_ids(name: str, n: int, count: int, seed: int = 0):
    """`count` token windows of length n from Alice in Wonderland (MiniLM: [CLS] ... [SEP]): (count, n)."""
    from harness.data.text import load_corpus, token_chunks

    model, tok, info = text_model(name)
    try:
        texts = load_corpus("alice")
    except FileNotFoundError as e:
        raise missing_data(e) from e
    return token_chunks(tok, texts, n, count, seed, add_special_tokens=(name == "minilm"))


def text_layers(name: str, n: int, count: int, seed: int = 0, layers: Optional[List[int]] = None, dtype=None):
    """[(layer, X (count, n, d) float64, AttentionWeights, causal)] for the requested layers (default all)."""
    import torch

    from harness.models.hf import attention_inputs, attention_weights, is_causal, n_layers

    dtype = dtype or torch.float64
    model, _, _ = text_model(name)
    L = list(range(n_layers(model))) if layers is None else [l % n_layers(model) for l in layers]
    ids = text_ids(name, n, count, seed)
    Xs = attention_inputs(model, ids, L, dtype=dtype)
    return [(l, Xs[l], attention_weights(model, l, dtype=dtype), is_causal(model)) for l in L]


# ---- the ViT shared by the JaSMin experiments --------------------------------------------------------------
# Small pre-LN ViT on Fashion-MNIST with patch 4 (49 patches + cls = 50 tokens, so JaSMin's k = 10, 30 fit,
# as the paper uses patch 4 "to have a higher sequence length"), no q/k/v biases (as the paper, for Specformer).
VIT_MODEL = {"full": dict(d=64, depth=4, heads=4, mlp_ratio=2.0, patch=4, qkv_bias=False),
             "quick": dict(d=64, depth=4, heads=4, mlp_ratio=2.0, patch=7, qkv_bias=False),
             "test": dict(d=16, depth=1, heads=2, mlp_ratio=2.0, patch=7, qkv_bias=False)}
VIT_STEPS = {"full": 150, "quick": 80, "test": 2}  # Adam steps of batch 128 (budget: see docs/notes/jasmin-exp.md)
# quick uses patch 7 (16 patches + cls = 17 tokens, 3x cheaper steps): k = 30 does not fit there


def vit_dataset(scale: str) -> str:
    """Fashion-MNIST, except the seconds-long test scale, which uses the loader's synthetic images."""
    return "synthetic" if scale == "test" else "fashion_mnist"


def vit_cfg(scale: str, train_seed: int = 0) -> dict:
    """harness.models.train cfg of the JaSMin ViT at a scale (the regularizer's cfg joins the cache key)."""
    if scale not in VIT_STEPS:
        raise ValueError(f"unknown scale {scale!r}")
    return {"dataset": vit_dataset(scale), "train_limit": None, "test_limit": 1000, "model": dict(VIT_MODEL[scale]),
            "epochs": 1, "batch_size": 128, "lr": 2e-3, "weight_decay": 0.0, "seed": int(train_seed),
            "max_steps": VIT_STEPS[scale]}


def make_regularizer(cell: dict):
    """None (baseline), Specformer (variant joint/q/k/v, lambda) or JaSMin (k, lambda, agg) from a sweep cell."""
    from harness.models.regularizers import JaSMin, Specformer

    m = cell.get("method", "baseline")
    if m == "baseline":
        return None
    if m == "specformer":
        return Specformer.variant(cell["variant"], float(cell["lam"]))
    if m == "jasmin":
        return JaSMin(int(cell["k"]), float(cell["lam"]), cell["agg"])
    raise ValueError(f"unknown method {m!r}: baseline | specformer | jasmin")


def method_label(cell: dict) -> str:
    """Human label: Baseline, Specformer(joint, 1e-2), JaSMin k=10 lam=1e-2 mean."""
    m = cell.get("method", "baseline")
    if m == "baseline":
        return "Baseline"
    lam = f"{float(cell['lam']):.0e}".replace("e-0", "e-")
    if m == "specformer":
        return f"Specformer({cell['variant']}, {lam})"
    return f"JaSMin k={int(cell['k'])} lam={lam} {cell['agg']}"


def trained_vit(ctx, cell: Optional[dict] = None, train_seed: int = 0):
    """The ViT of a sweep cell (default: the baseline), trained once and cached as an artifact."""
    from harness.models.train import train_classifier

    cell = cell or {"method": "baseline"}
    try:
        return train_classifier(vit_cfg(ctx.scale, train_seed), ctx, regularizer=make_regularizer(cell))
    except FileNotFoundError as e:
        raise missing_data(e) from e


def vit_eval_images(scale: str, count: int, offset: int = 0):
    """(x (count, 1, 28, 28) in [0, 1], y) from the test split (not used in training)."""
    from harness.data.images import load_images

    try:
        X, y, _ = load_images(vit_dataset(scale), split="test", limit=offset + count)
    except FileNotFoundError as e:
        raise missing_data(e) from e
    return X[offset:offset + count], y[offset:offset + count]


def vit_layers(model, images, dtype=None):
    """[(layer, X (B, n, d), AttentionWeights, causal=False)] of the trained ViT on images, in float64."""
    import torch

    dtype = dtype or torch.float64
    Xs = model.attention_inputs(images)
    out = []
    with torch.no_grad():
        for l in sorted(Xs):
            w = model.attention_weights(l, with_bo=False)
            w = type(w)(*[None if t is None else t.detach().to(dtype).clone() for t in
                          (w.wq, w.wk, w.wv, w.wo, w.bq, w.bk, w.bv, w.bo)])
            out.append((l, Xs[l].to(dtype), w, False))
    return out


# ---- true local Lipschitz constants ------------------------------------------------------------------------
def layer_lipschitz(X, w, causal: bool = False, tol: float = 1e-9, iters: int = 1000):
    """||J_F(X)|| of the whole multi-head layer F(X) = sum_l P_l X VO_l (+ biases, no residual): (B,)."""
    from harness.kernels.attention import attention_unchecked
    from harness.kernels.power import jacobian_norm

    return jacobian_norm(lambda Z: attention_unchecked(Z, w, False, causal), X, tol=tol, iters=iters,
                         on_nonconvergence="ignore")


def head_lipschitz(X, w, causal: bool = False, tol: float = 1e-9, iters: int = 1000):
    """||J_{f_l}(X)|| of every head, power iteration on all heads at once: (B, h)."""
    from harness.bounds.castin import head_lipschitz as hl

    return hl(X, w, causal, tol=tol, iters=iters, on_nonconvergence="ignore")


BOUND_COLUMNS = ("bound_kim", "bound_castin", "bound_jasmin", "bound_jasmin_g1", "bound_lofast_fine",
                 "bound_lofast_coarse", "bound_lofast_sharp")


def all_bounds(X, w, causal: bool = False, tol: float = 1e-9, iters: int = 1000) -> Dict[str, object]:
    """Every upper bound on the local Lipschitz constant, per head (B, h) and for the layer (B,).

    Kim/Specformer (JaSMin Thm 1, r = 0), Castin Thm 3.3, JaSMin Thm 3 (exact ||J_sm||, g_1), LoFAST's eps -> 0
    limit (fine m_l, coarse xi_l, sharpened softmax constant 1/2). Layer values of the per-head bounds are the
    sum over heads (triangle inequality); LoFAST's layer value is its own multi-head bound (zeta couples heads).
    Causal models use LoFAST's causal option (masked P in zeta; Delta_2 terms unchanged, still valid).
    """
    import math

    import torch

    from harness.bounds import castin, jasmin, kim, lofast
    from harness.kernels.attention import probs

    out: Dict[str, object] = {}
    out["bound_kim"] = kim.bound(X, w, 0.0)
    out["bound_castin"] = castin.bound(X, w, causal=causal)
    t = jasmin.bound_terms(X, w, causal)  # Thm 3's factors, shared by both variants (= jasmin.bound)
    out["bound_jasmin"] = t["vo"] * (t["p"] + 2 * t["x2"] * t["a"] * t["jsm"])
    out["bound_jasmin_g1"] = t["vo"] * (t["p"] + 2 * t["x2"] * t["a"] * t["g1"])
    per_head = {k: v for k, v in out.items()}
    layer = {k: v.sum(-1) for k, v in per_head.items()}
    # LoFAST eps -> 0 limit, zeta + c/sqrt(dh) sum_l m_l ||X VO_l|| (= lofast.lipschitz_upper, residual=False),
    # from one zeta and one m_norms power iteration per layer. For a single head zeta_l = ||P_l|| ||VO_l||
    # exactly (norm of a Kronecker product).
    pw = dict(tol=tol, iters=iters, on_nonconvergence="ignore")
    zeta = lofast.zeta(X, w, residual=False, causal=causal, **pw)  # (B,)
    m_fine = lofast.m_norms(X, w, **pw)  # (B, h)
    m_coarse = lofast.xi(X, w)  # (B, h)
    v = lofast.delta22(X, w, 0.0)  # (B, h) ||X VO_l|| (with value bias)
    P = probs(X, w, causal)  # (B, h, n, n)
    zeta_l = torch.linalg.matrix_norm(P, ord=2) * torch.linalg.matrix_norm(w.VO(), ord=2)  # (B, h)
    c = 1.0 / math.sqrt(w.dh)
    for key, m, s in (("bound_lofast_fine", m_fine, 1.0), ("bound_lofast_coarse", m_coarse, 1.0),
                      ("bound_lofast_sharp", m_fine, 0.5)):
        per_head[key] = zeta_l + s * c * m * v
        layer[key] = zeta + s * c * (m * v).sum(-1)
    return {"head": per_head, "layer": layer}
