"""Rows of the LoFAST studies: the bound-study layers (first layer of the certified LipViT, MiniLM layer 0),
bound vs PGD tables (single head and end to end), Prop. 1 certification tables.

Everything computes in the dtype and on the device of its inputs, except Prop. 1 certificates, which are
computed in float64 on a float64 copy of the model (soundness: a certified radius must not rest on float32
rounding); their rows say so (`certificate_dtype`). Clean margins and PGD attacks use the model as given.
"""
from __future__ import annotations

import copy
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from harness.bounds import lofast, registry
from harness.kernels.attention import AttentionWeights, attention
from harness.models.certify import (BOUNDS, BUILTIN, certify, layer_delta, layer_terms, margins,
                                    mnorm_ratio, pgd_attack)
from harness.models.lipvit import LipTransformer, block_inputs
from harness.models.lofast_train import recipe_from_cell, stem_inputs, test_batch, trained_model

Tensor = torch.Tensor

# The ViT whose first attention layer the bound studies use: one of lofast_certified's configurations.
STUDY_VIT = dict(layers=2, heads=8, vo_norm=0.5)
SOURCES = ("vit", "minilm")
BOUND_COLUMNS = tuple(f"bound_{b}" for b in BUILTIN)  # the registry's built-in certificates
CERTIFICATE_DTYPE = "float64"


def unit_rows(X: Tensor) -> Tensor:
    """Rows projected onto the unit sphere (LayerProject(1) for rows outside the ball, scaled up otherwise)."""
    return X / X.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(X.dtype).tiny)


def vit_layer(model: LipTransformer, u: Tensor, layer: int = 0) -> Tuple[AttentionWeights, Tensor]:
    """AttentionWeights of one layer of a LipTransformer and its attention inputs Z (B, n, d) at stem inputs u,
    detached, in the model's dtype."""
    with torch.no_grad():
        _, Zs = block_inputs(model, u)
        w = model.attention_weights()[layer]
    return AttentionWeights(*(t.detach() for t in (w.wq, w.wk, w.wv, w.wo))), Zs[layer].detach()


def minilm_layer(count: int, n: int, layer: int = 0, seed: int = 0, dtype=torch.float64, device="cpu"):
    """Bias-free AttentionWeights of a pretrained MiniLM layer and its inputs X (count, n, 384) (SST-2 token
    windows drawn with `seed`) with rows on the unit sphere, in (dtype, device)."""
    from harness.models import text

    L = text.layer_inputs("minilm", "sst2", [layer], n, count, chunk_seed=seed, dtype=dtype, device=device)[layer]
    w = AttentionWeights(*(t.detach() for t in (L.w.wq, L.w.wk, L.w.wv, L.w.wo)))
    return w, unit_rows(L.X), f"all-MiniLM-L6-v2 layer {layer} (biases dropped)"


def study_layer(source: str, count: int, *, cell: Dict, seed: int = 0, store=None, root=None, dtype=torch.float64,
                device="cpu", pbar=None) -> Tuple[AttentionWeights, Tensor, str]:
    """(w, X (count, n, d), label) for a bound study, in (dtype, device): 'vit' = the first layer of the trained
    STUDY_VIT (training budget from the cell's keys, see lofast_train.recipe_from_cell) at its real attention inputs
    (rows in the unit ball by LayerProject(1)) rescaled onto the unit sphere; 'minilm' = MiniLM layer 0 at 16
    SST-2 tokens, unit rows. store/root: where the trained ViT is cached (see lofast_train.trained_model)."""
    if source == "vit":
        recipe = recipe_from_cell("vit", cell, seed=seed, device=str(device), **STUDY_VIT)
        model, _ = trained_model(recipe, store=store, root=root, dtype=dtype, device=device, pbar=pbar)
        batch, _ = test_batch(recipe, count, device)
        w, Z = vit_layer(model, stem_inputs(model, batch))
        return w, unit_rows(Z), "LipViT L{layers}-h{heads}-c{vo_norm} layer 0".format(**STUDY_VIT)
    if source == "minilm":
        return minilm_layer(count, 16, 0, seed, dtype, device)
    raise ValueError(f"unknown source {source!r}; choose from {SOURCES}")


# ---- bound vs PGD tables ----------------------------------------------------------------------------------------
def _lemma1_direction(X: Tensor, w: AttentionWeights, residual: bool) -> Tensor:
    """Lemma 1's maximizer (top singular vector of the zeta operator): (S, n, d), unit Frobenius norm."""
    return lofast.zeta(X, w, residual=residual, return_info=True)[1].zeta.vector


def multihead_rows(w: AttentionWeights, X: Tensor, eps_list: Sequence[float], residual: bool, pgd_steps: int,
                   pgd_restarts: int, seed: int = 0) -> List[dict]:
    """End-to-end ||F(X') - F(X)||_F per sample and eps, X (S, n, d): one row with eq. 23 under each bound
    (bound_naive = eq. 9, bound_coarse = zeta + xi, bound_fine = exact ||M||, bound_sharp = softmax 1/2,
    bound_refined = the per-ball softmax constant, bound_second_order = the exact ||J|| plus the curvature term,
    bound_best = the minimum of them; Lanczos values, as the paper's Fig. 1 compares them), and
    lower bounds pgd_plain = lofast.pgd_sensitivity (random restarts) and pgd = the best of that and of
    X +- eps v with v Lemma 1's maximizer (feasible points, so valid lower bounds)."""
    with torch.no_grad():
        t = layer_terms(X, w, fine=True, residual=residual)
        v = _lemma1_direction(X, w, residual)
        F0 = attention(X, w, residual=residual)
    X_spec = torch.linalg.matrix_norm(X, ord=2)  # (S,)
    rows = []
    for e in map(float, eps_list):
        et = torch.full((X.shape[0],), e, dtype=X.dtype, device=X.device)
        vals = {f"bound_{b}": layer_delta(t, et, b) for b in BUILTIN}
        if e > 0:
            plain = lofast.pgd_sensitivity(X, w, e, residual=residual, seed=seed, steps=pgd_steps,
                                           restarts=pgd_restarts)
            with torch.no_grad():
                warm = torch.stack([(attention(X + sg * e * v, w, residual=residual) - F0).flatten(-2).norm(dim=-1)
                                    for sg in (1.0, -1.0)]).amax(0)
            vals["pgd_plain"], vals["pgd"] = plain, torch.maximum(plain, warm)
        else:
            vals["pgd_plain"], vals["pgd"] = 0 * et, 0 * et
        for s in range(X.shape[0]):
            rows.append(dict(quantity="delta", eps=e, sample=s, **{k: float(val[s]) for k, val in vals.items()},
                             zeta=float(t.zeta[s]), X_fro=float(X[s].norm()), X_spec=float(X_spec[s]),
                             converged=bool(t.converged[s])))
    return rows


def single_head_rows(w: AttentionWeights, X: Tensor, eps_list: Sequence[float], pgd_steps: int, pgd_restarts: int,
                     head: int = 0, seed: int = 0) -> List[dict]:
    """Single-head Delta_21 (bound_fine = exact ||M||, bound_coarse = xi, bound_sharp = softmax 1/2, pgd) and
    Delta_22 (bound_fine = ours eq. 15, bound_naive = eq. 22, pgd) per sample and eps; X (S, n, d).
    Columns a quantity has no value for are NaN."""
    wh = w.head(head)
    pgd = dict(seed=seed, steps=pgd_steps, restarts=pgd_restarts)
    zero = torch.zeros(X.shape[0], 1, dtype=X.dtype, device=X.device)
    rows = []
    for e in map(float, eps_list):
        vals = {"delta21": {"bound_fine": lofast.delta21(X, wh, e, fine=True),
                            "bound_coarse": lofast.delta21(X, wh, e, fine=False),
                            "bound_sharp": lofast.delta21(X, wh, e, fine=True, softmax_lip=0.5),
                            "pgd": lofast.pgd_delta21(X, wh, e, **pgd) if e > 0 else zero},
                "delta22": {"bound_fine": lofast.delta22(X, wh, e), "bound_naive": lofast.naive_delta22(X, wh, e),
                            "pgd": lofast.pgd_delta22(X, wh, e, **pgd) if e > 0 else lofast.delta22(X, wh, 0.0)}}
        for q, cols in vals.items():
            for s in range(X.shape[0]):
                row = dict(quantity=q, eps=e, sample=s, **{c: float("nan") for c in BOUND_COLUMNS},
                           pgd=float("nan"), pgd_plain=float("nan"))
                row.update({c: float(v[s].reshape(-1)[0]) for c, v in cols.items()})
                rows.append(row)
    return rows


# ---- Prop. 1 certification --------------------------------------------------------------------------------------
def certificate(model: LipTransformer, batch: Tensor, y: Tensor):
    """Prop. 1 ingredients in float64: a float64 copy of the model (on its device) at the stem inputs it computes
    from the data batch itself (so a text certificate does not inherit float32-rounded embeddings). Sound."""
    m64 = copy.deepcopy(model).to(dtype=torch.float64).eval()
    return certify(m64, stem_inputs(m64, batch), y)


def certify_rows(model: LipTransformer, batch: Tensor, y: Tensor, eps_list: Sequence[float], pgd_steps: int,
                 pgd_restarts: int, seed: int = 0, common: Optional[Dict] = None) -> List[dict]:
    """Prop. 1 certified accuracy per bound and eps, PGD robust accuracy at the same eps, per-point radii, for a
    data batch (images or token ids, lofast_train.test_batch) with labels y.

    Certificates (certified_acc, clean_acc, radius, zeta_mean, L_in, L_head, ||M||/xi) are float64
    (certificate_dtype); margin, pgd_acc and violations come from `model` in its own dtype. Rows of kind "curve"
    (per bound and eps) and "radius" (per bound and point) share one set of columns: NaN (point and
    violations -1) where a kind has no value; `won` (radius rows of "best") names the certificate that gave the
    last layer's change at the point's radius. `guarantee`: the bound's certificates hold for an input with
    probability >= 1 - guarantee over the seeded Lanczos starts (Certificate.guarantee_of; 0 for naive).
    Bounds: registry.ball_change_names(), the paper's and ours, then any plug-in registered with bounds="ball_change"
    (trusted as deterministic: guarantee 0); `violations` > 0 means a certificate is unsound."""
    cert = certificate(model, batch, y)
    u = stem_inputs(model, batch)
    with torch.no_grad():
        margin = margins(model.eval()(u), y)  # (B,) in the model's dtype
    base = dict(common or {}, n_points=len(y), L_in=cert.L_in, L_head=cert.L_head,
                zeta_mean=float(torch.stack([t.zeta for t in cert.layers]).mean()),
                converged=bool(all(bool(t.converged.all()) for t in cert.layers)),
                certificate_dtype=CERTIFICATE_DTYPE, **mnorm_ratio(cert))
    nan = float("nan")
    rows = []
    names = registry.ball_change_names()
    for e in map(float, eps_list):
        attack = pgd_attack(model, u, y, e, seed=seed, steps=pgd_steps, restarts=pgd_restarts) if e > 0 else -margin
        robust = (margin > 0) & (attack < 0)
        for b in names:
            ok = cert.certified(e, b)
            rows.append(dict(base, kind="curve", bound=b, eps=e, guarantee=cert.guarantee_of(b),
                             clean_acc=float(cert.correct.double().mean()),
                             certified_acc=float(ok.double().mean()), pgd_acc=float(robust.double().mean()),
                             violations=int((ok & ~robust).sum()), point=-1, radius=nan, margin=nan, won=""))
    for b in names:  # the same columns on every row (a radius row has no eps: NaN, not the cell's eps list)
        radius = cert.radius(b)
        won = [""] * len(y)  # "best": the certificate the last layer's change rests on at the radius
        if b == "best":
            won = [n if r > 0 else "" for n, r in zip(cert.best_choice(radius), radius.tolist())]
        for i, r in enumerate(radius.tolist()):
            rows.append(dict(base, kind="radius", bound=b, eps=nan, guarantee=cert.guarantee_of(b), clean_acc=nan,
                             certified_acc=nan, pgd_acc=nan,
                             violations=-1, point=i, radius=r, margin=float(margin[i]), won=won[i]))
    return rows


def certified_cell(arch: str, cell: Dict, ctx, store=None) -> List[dict]:
    """One grid cell of lofast_certified ("vit") / lofast_text ("text"): train or load the model the cell names
    (through `store`, e.g. harness.store.artifacts.cached_artifact, under ctx.artifacts), then `certify_rows` on the
    first `points` test points with the cell's eps list and PGD budget."""
    recipe = recipe_from_cell(arch, cell, seed=ctx.seed, device=ctx.device)
    model, info = trained_model(recipe, store=store, root=ctx.artifacts, dtype=ctx.torch_dtype,
                                device=ctx.torch_device, pbar=ctx.pbar)
    batch, y = test_batch(recipe, int(cell["points"]), ctx.torch_device)
    common = dict(test_acc_full=info["test_acc"], train_seconds=info["train_seconds"])
    return certify_rows(model, batch, y, cell["eps"], int(cell["pgd_steps"]), int(cell["pgd_restarts"]), ctx.seed,
                        common)


# ---- App. C.1 ablation ------------------------------------------------------------------------------------------
ABLATION_PARAMS = ("wq", "wk", "wv", "wo", "X")


def _fixed_constant(name: str) -> bool:
    """A Theorem 1 certificate with Lemma 1's zeta and one fixed softmax constant (coarse, fine, sharp)."""
    v = registry.get(name, "layer").theorem1
    return v is not None and v.delta1 == "zeta" and not isinstance(v.c, str)


ABLATION_BOUNDS = tuple(filter(_fixed_constant, BOUNDS))


def perturb(t: Tensor, r: float, g: torch.Generator) -> Tensor:
    """t + r ||t||_F G / ||G||_F with G standard Gaussian (drawn in float64 on the CPU from g, then cast to t's
    dtype and device, so every dtype sees the same draw)."""
    G = torch.randn(t.shape, dtype=torch.float64, generator=g).to(device=t.device, dtype=t.dtype)
    return t + r * t.norm() * G / G.norm()


def ablation_rows(w: AttentionWeights, X: Tensor, param: str, eps: float, rel_sizes: Sequence[float], samples: int,
                  seed: int = 0) -> List[dict]:
    """Theorem 1 (residual) at eps when `param` (one of ABLATION_PARAMS) is perturbed with relative size r, X (n, d):
    `samples` draws per r > 0 (one at r = 0); bound per variant coarse / fine / sharp and zeta."""
    if param not in ABLATION_PARAMS:
        raise ValueError(f"unknown parameter {param!r}; choose from {ABLATION_PARAMS}")
    g = torch.Generator().manual_seed(seed)
    e = torch.full((1,), float(eps), dtype=X.dtype, device=X.device)
    rows = []
    for r in map(float, rel_sizes):
        for s in range(int(samples) if r > 0 else 1):
            ws = {k: getattr(w, k) for k in ("wq", "wk", "wv", "wo")}
            Xs = perturb(X, r, g) if param == "X" else X
            if param != "X":
                ws[param] = perturb(ws[param], r, g)
            with torch.no_grad():
                t = layer_terms(Xs[None], AttentionWeights(**ws), residual=True)  # Theorem 1 terms once
            for b in ABLATION_BOUNDS:
                rows.append(dict(param=param, rel_size=r, sample=s, variant=b, eps=float(eps),
                                 bound=float(layer_delta(t, e, b)[0]), zeta=float(t.zeta[0]),
                                 converged=bool(t.converged[0])))
    return rows
