"""Shared helpers of the lofast_* experiments: data, cached training of the certifiable models, bound inputs.

A trained model is an artifact keyed by its config (sha256 of canonical JSON + MODEL_VERSION) under
ctx.artifacts, so lofast_tightness / lofast_input_norm / lofast_ablation reuse the ViT that lofast_certified
trained (same config -> same file).
"""
from __future__ import annotations

import functools
import gzip
import hashlib
import json
import math
import os
import time
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

import numpy as np
import torch
import torch.nn.functional as F

from harness.kernels.attention import AttentionWeights
from harness.models.lipvit import LipText, LipTransformer, LipViT, block_inputs

MODEL_VERSION = "lipvit-3"  # bump when lipvit.py or the training recipe changes what a config produces
BOUND_LABELS = {"naive": "eq. 9 naive (paper)", "coarse": "Thm 1, xi (paper)", "fine": "Thm 1, exact ||M|| (ours)",
                "sharp": "exact ||M||, softmax 1/2 (ours)"}
BOUND_STYLE = {"naive": dict(color="#999999", linestyle=":"), "coarse": dict(color="#0072B2", linestyle="--"),
               "fine": dict(color="#0072B2", linestyle="-"), "sharp": dict(color="#56B4E9", linestyle="-"),
               "pgd": dict(color="#555555", linestyle="-", marker="x"),
               "pgd_plain": dict(color="#AAAAAA", linestyle="-", marker=".")}


def threads() -> None:
    """One intra-op thread: the machine is shared (PLAN.md)."""
    torch.set_num_threads(1)


# ---- images -----------------------------------------------------------------------------------------------
def synthetic_images(N: int, seed: int = 0, size: int = 28) -> Tuple[torch.Tensor, torch.Tensor]:
    """Tiny separable stand-in for tests: class k = a bright bar at a class-specific place + noise: (N,1,s,s), (N,)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 10, (N,), generator=g)
    X = 0.1 * torch.rand(N, 1, size, size, generator=g)
    for k in range(10):
        r, c = (k // 5) * (size // 2), (k % 5) * (size // 5)
        X[y == k, :, r:r + size // 2, c:c + size // 5] += 0.8
    return X.clamp(0, 1), y


@functools.lru_cache(maxsize=8)
def _idx(path: Path) -> np.ndarray:
    with gzip.open(path, "rb") as f:
        data = f.read()
    ndim = data[3]
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_images(name: str, split: str, limit: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Images (N, C, H, W) in [0, 1] and labels: harness.data.images when present, else a local idx reader."""
    if name == "synthetic":
        N = limit or 512
        return synthetic_images(N, seed=0 if split == "train" else 1)
    try:
        from harness.data.images import load_images as _load
    except ImportError:
        _load = None
    if _load is not None:
        X, y, _ = _load(name, split=split, limit=limit)
        return X.float(), y.long()
    if name != "fashion_mnist":
        raise FileNotFoundError(f"image set {name!r} needs harness.data.images, which is not installed")
    root = Path(os.environ.get("ATTNLIP_FASHION_MNIST", "/usr/share/datasets/fashion-mnist"))
    pre = "train" if split == "train" else "t10k"
    ip, lp = root / f"{pre}-images-idx3-ubyte.gz", root / f"{pre}-labels-idx1-ubyte.gz"
    for p in (ip, lp):
        if not p.exists():
            raise FileNotFoundError(f"Fashion-MNIST file {p} is missing; set ATTNLIP_FASHION_MNIST")
    X = torch.from_numpy(_idx(ip)[:limit].copy()).float().div(255).unsqueeze(1)
    y = torch.from_numpy(_idx(lp)[:limit].copy()).long()
    return X, y


# ---- text -------------------------------------------------------------------------------------------------
def load_text(split: str, n: int, limit: Optional[int] = None, synthetic: bool = False):
    """SST-2 token ids (N, n), labels (N,), vocab size; a synthetic stand-in (label = a marker token) if asked."""
    if synthetic:
        g = torch.Generator().manual_seed(0 if split == "train" else 1)
        N = limit or 256
        ids = torch.randint(5, 200, (N, n), generator=g)
        y = torch.randint(0, 2, (N,), generator=g)
        ids[:, 1] = 1 + y  # the label token
        return ids, y, 200
    from harness.data.text import load_sst2
    from harness.models.hf import bert_tokenizer

    tok = bert_tokenizer()
    ids, y = load_sst2("train" if split == "train" else "dev", max_len=n, tokenizer=tok, limit=limit)
    return ids, y, int(tok.vocab_size)


# ---- training (cached artifact) ---------------------------------------------------------------------------
def cfg_key(cfg: Dict[str, Any]) -> str:
    blob = json.dumps({"cfg": cfg, "version": MODEL_VERSION}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@functools.lru_cache(maxsize=2)
def minilm_pca_embeddings(d: int) -> torch.Tensor:
    """MiniLM's (pretrained) word-embedding table projected onto its top-d principal directions: (vocab, d)."""
    from harness.models.hf import load_text_model

    model, _, _ = load_text_model("minilm")
    E = model.get_input_embeddings().weight.detach().float()  # (vocab, 384)
    E = E - E.mean(0)
    _, _, V = torch.pca_lowrank(E, q=d, center=False, niter=4)
    return E @ V[:, :d]  # (vocab, d)


def build(cfg: Dict[str, Any], vocab: Optional[int] = None) -> LipTransformer:
    """The model a config describes (untrained; a text model's embeddings start from MiniLM's, PCA'd to d)."""
    common = dict(d=cfg["d"], depth=cfg["depth"], heads=cfg["heads"], vo_norm=cfg["vo_norm"],
                  ffn_mult=cfg.get("ffn_mult", 2), qk_norm=cfg.get("qk_norm", 1.0))
    if cfg["kind"] == "vit":
        return LipViT(image_size=28, patch=cfg["patch"], channels=1, classes=10,
                      embed_norm=cfg.get("embed_norm", 1.0), **common)
    if cfg["kind"] == "text":
        m = LipText(vocab=vocab, n=cfg["n"], classes=2, embed_scale=cfg.get("embed_scale", 1.0), **common)
        if cfg.get("emb_init") == "minilm-pca" and cfg["dataset"] != "synthetic":
            with torch.no_grad():
                m.emb.weight.copy_(minilm_pca_embeddings(cfg["d"])[:vocab])
        return m
    raise ValueError(f"unknown model kind {cfg['kind']!r}")


def _data(cfg: Dict[str, Any]):
    if cfg["kind"] == "vit":
        Xtr, ytr = load_images(cfg["dataset"], "train", cfg["n_train"])
        Xte, yte = load_images(cfg["dataset"], "test", cfg["n_test"])
        return Xtr, ytr, Xte, yte, None
    syn = cfg["dataset"] == "synthetic"
    itr, ytr, vocab = load_text("train", cfg["n"], cfg["n_train"], syn)
    ite, yte, _ = load_text("test", cfg["n"], cfg["n_test"], syn)
    return itr, ytr, ite, yte, vocab


def _inputs(model: LipTransformer, batch: torch.Tensor) -> torch.Tensor:
    """Stem input u for a data batch: images as they are, token ids -> word embeddings."""
    return model.embed_ids(batch) if isinstance(model, LipText) else batch


def accuracy(model: LipTransformer, X: torch.Tensor, y: torch.Tensor, bs: int = 512) -> float:
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(_inputs(model, X[i:i + bs])).argmax(-1) for i in range(0, len(X), bs)])
    return float((pred == y).float().mean())


def train_model(cfg: Dict[str, Any], ctx) -> Tuple[LipTransformer, Dict[str, Any]]:
    """Train (or load from ctx.artifacts) the certifiable model of `cfg`; returns (model in float64 eval, info).

    Loss: cross-entropy of temperature-scaled logits (tau * F(u)), Adam, cosine learning-rate decay.
    """
    path = Path(ctx.artifacts) / f"lofast-{cfg['kind']}-{cfg_key(cfg)}.pt"
    Xtr, ytr, Xte, yte, vocab = _data(cfg)
    model = build(cfg, vocab)
    if path.exists():
        blob = torch.load(path, map_location="cpu", weights_only=False)
        model.load_state_dict(blob["state"])
        return model.double().eval(), dict(blob["info"], cached=True, artifact=path.name)
    threads()
    torch.manual_seed(cfg["seed"])
    opt = torch.optim.Adam(model.parameters(), lr=cfg["lr"])
    steps = cfg["epochs"] * math.ceil(len(Xtr) / cfg["batch"])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s / steps, 1.0))))
    t0 = time.time()
    g = torch.Generator().manual_seed(cfg["seed"])
    bar = ctx.pbar(total=steps, desc=f"train {cfg['kind']} L{cfg['depth']} h{cfg['heads']} c{cfg['vo_norm']}")
    for ep in range(cfg["epochs"]):
        model.train()
        perm = torch.randperm(len(Xtr), generator=g)
        for i in range(0, len(Xtr), cfg["batch"]):
            idx = perm[i:i + cfg["batch"]]
            logits = model(_inputs(model, Xtr[idx]))
            loss = F.cross_entropy(cfg["tau"] * logits, ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    info = {"train_seconds": time.time() - t0, "train_acc": accuracy(model, Xtr[:2000], ytr[:2000]),
            "test_acc_f32": accuracy(model, Xte, yte), "final_loss": float(loss.item()), "cached": False}
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    torch.save({"state": model.state_dict(), "cfg": cfg, "info": info}, tmp)
    os.replace(tmp, path)
    return model.double().eval(), dict(info, artifact=path.name)


def test_split(cfg: Dict[str, Any], model: LipTransformer, count: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The first `count` test points as float64 stem inputs u and labels."""
    _, _, Xte, yte, _ = _data(cfg)
    X, y = Xte[:count], yte[:count]
    with torch.no_grad():
        u = _inputs(model, X) if isinstance(model, LipText) else X
    return u.double().detach(), y


# ---- configs ------------------------------------------------------------------------------------------------
VIT_SCALE = {  # training budget per scale (full: ~1-2 min per config on one shared core)
    "full": dict(dataset="fashion_mnist", n_train=20000, n_test=10000, epochs=2, patch=7),
    "quick": dict(dataset="fashion_mnist", n_train=6000, n_test=2000, epochs=2, patch=7, lr=1e-2),
    "test": dict(dataset="synthetic", n_train=128, n_test=32, epochs=1, patch=14),
}
TEXT_SCALE = {
    "full": dict(dataset="sst2", n_train=8000, n_test=872, epochs=2),
    "quick": dict(dataset="sst2", n_train=4000, n_test=872, epochs=2),
    "test": dict(dataset="synthetic", n_train=128, n_test=32, epochs=1),
}


def vit_cfg(scale: str, depth: int, heads: int, vo_norm: float, seed: int = 0) -> Dict[str, Any]:
    """Training config of a LipViT. embed_norm = ||W_e|| = 0.25 (our choice, see docs/notes/lofast-exp.md): patch tokens
    then mostly lie inside LayerProject(1)'s ball, so the contraction the certificate cannot see becomes L_in = 0.25."""
    c = dict(kind="vit", d=64, depth=int(depth), heads=int(heads), vo_norm=float(vo_norm), ffn_mult=2,
             qk_norm=1.0, embed_norm=0.25, lr=3e-3, batch=128, tau=30.0, seed=int(seed))
    c.update(VIT_SCALE[scale])
    return c


def text_cfg(scale: str, depth: int, heads: int, vo_norm: float, seed: int = 0) -> Dict[str, Any]:
    c = dict(kind="text", n=32, d=64, depth=int(depth), heads=int(heads), vo_norm=float(vo_norm), ffn_mult=2,
             qk_norm=1.0, embed_scale=0.25, emb_init="minilm-pca", lr=1e-2, batch=128, tau=30.0, seed=int(seed))
    c.update(TEXT_SCALE[scale])
    return c


# The ViT whose first attention layer experiments 1-3 study: one of lofast_certified's grid cells.
BOUNDS_VIT = dict(depth=2, heads=8, vo_norm=0.5)


def vit_layer(ctx, scale: str, count: int, layer: int = 0):
    """AttentionWeights of one layer of the cached lofast_certified ViT and its attention inputs Z (count, n, d)."""
    cfg = vit_cfg(scale, **BOUNDS_VIT, seed=ctx.seed)
    model, info = train_model(cfg, ctx)
    u, _ = test_split(cfg, model, count)
    with torch.no_grad():
        _, Zs = block_inputs(model, u)
        w = model.attention_weights()[layer]
    return AttentionWeights(*(t.detach().double() for t in (w.wq, w.wk, w.wv, w.wo))), Zs[layer].detach(), info


def minilm_layer(count: int, n: int, layer: int = 0, seed: int = 0):
    """Bias-free AttentionWeights of a pretrained MiniLM layer and its inputs X (count, n, 384) with rows on the unit sphere."""
    from harness.data.text import load_corpus, token_chunks
    from harness.models.hf import attention_inputs, attention_weights, load_text_model

    model, tok, info = load_text_model("minilm")
    ids = token_chunks(tok, load_corpus("sst2"), n, count, seed)
    with torch.no_grad():
        X = attention_inputs(model, ids, [layer])[layer].double()
        w = attention_weights(model, layer)
    X = X / X.norm(dim=-1, keepdim=True)
    w = AttentionWeights(*(t.detach().double() for t in (w.wq, w.wk, w.wv, w.wo)))
    return w, X, dict(info)


def unit_rows(X: torch.Tensor) -> torch.Tensor:
    """Rows projected onto the unit sphere (LayerProject(1) for rows outside the ball, scaled up otherwise)."""
    return X / X.norm(dim=-1, keepdim=True).clamp_min(1e-30)


# ---- bound-vs-PGD rows shared by lofast_tightness and lofast_input_norm ------------------------------------
PGD_BOUNDS = {"full": dict(steps=50, restarts=4), "quick": dict(steps=15, restarts=2), "test": dict(steps=5, restarts=1)}


def multihead_rows(w: AttentionWeights, X: torch.Tensor, eps_list, residual: bool, pgd: Dict[str, int],
                   seed: int = 0):
    """End-to-end ||F(X') - F(X)||_F: eq. 23 with zeta (fine/coarse/sharp), with eq. 9 (naive), and lower bounds; X (S, n, d).

    Lower bounds: "pgd_plain" = lofast.pgd_sensitivity (random restarts); "pgd" = the best of that and of
    X +- eps v with v Lemma 1's maximizer (both feasible points, so both are valid lower bounds)."""
    from harness.bounds import lofast
    from harness.models.certify import BOUNDS, layer_delta, layer_terms

    from harness.kernels.attention import attention

    with torch.no_grad():
        t = layer_terms(X, w, fine=True, residual=residual)
        # Lemma 1's maximizer (top singular vector of the zeta operator) as an extra feasible point: PGD with the
        # kernel's Madry step rule converges like a heavily damped power iteration on the near-linear residual map
        v = lofast.zeta(X, w, residual=residual, return_info=True)[1].zeta.vector  # (S, n, d), unit Frobenius norm
        F0 = attention(X, w, residual=residual)
    rows = []
    for e in map(float, eps_list):
        et = torch.full((X.shape[0],), e, dtype=X.dtype)
        vals = {b: layer_delta(t, et, b) for b in BOUNDS}
        if e > 0:
            plain = lofast.pgd_sensitivity(X, w, float(e), residual=residual, seed=seed, **pgd)
            with torch.no_grad():
                warm = torch.stack([(attention(X + sg * e * v, w, residual=residual) - F0).flatten(-2).norm(dim=-1)
                                    for sg in (1.0, -1.0)]).amax(0)
            vals["pgd_plain"], vals["pgd"] = plain, torch.maximum(plain, warm)
        else:
            vals["pgd_plain"], vals["pgd"] = 0 * et, 0 * et
        for s in range(X.shape[0]):
            for b, val in vals.items():
                rows.append(dict(quantity="delta", variant=b, eps=float(e), sample=s, value=float(val[s]),
                                 zeta=float(t.zeta[s]), X_fro=float(X[s].norm()), X_spec=float(torch.linalg.matrix_norm(X[s], ord=2))))
    return rows


def single_head_rows(w: AttentionWeights, X: torch.Tensor, eps_list, pgd: Dict[str, int], head: int = 0,
                     seed: int = 0):
    """Single-head Delta_21 (fine/coarse/sharp + PGD) and Delta_22 (ours eq. 15 / naive eq. 22 + PGD); X (S, n, d)."""
    from harness.bounds import lofast

    wh = w.head(head)
    rows = []
    for e in eps_list:
        vals = {("delta21", "fine"): lofast.delta21(X, wh, float(e), fine=True),
                ("delta21", "coarse"): lofast.delta21(X, wh, float(e), fine=False),
                ("delta21", "sharp"): lofast.delta21(X, wh, float(e), fine=True, softmax_lip=0.5),
                ("delta22", "fine"): lofast.delta22(X, wh, float(e)),
                ("delta22", "naive"): lofast.naive_delta22(X, wh, float(e))}
        if e > 0:
            vals[("delta21", "pgd")] = lofast.pgd_delta21(X, wh, float(e), seed=seed, **pgd)
            vals[("delta22", "pgd")] = lofast.pgd_delta22(X, wh, float(e), seed=seed, **pgd)
        else:
            vals[("delta21", "pgd")] = torch.zeros(X.shape[0], 1, dtype=X.dtype)
            vals[("delta22", "pgd")] = lofast.delta22(X, wh, 0.0)
        for s in range(X.shape[0]):
            for (q, b), v in vals.items():
                rows.append(dict(quantity=q, variant=b, eps=float(e), sample=s, value=float(v[s].reshape(-1)[0])))
    return rows


def layer_for(source: str, ctx, count: int):
    """(w, X, info) for a bound study: 'vit' (first layer of the lofast_certified ViT, its real attention inputs,
    rows already in the unit ball by LayerProject(1), rescaled onto the unit sphere) or 'minilm' (layer 0)."""
    if source == "vit":
        w, Z, info = vit_layer(ctx, ctx.scale, count)
        return w, unit_rows(Z), dict(model=f"LipViT {BOUNDS_VIT}", **{k: v for k, v in info.items() if k != "artifact"})
    if source == "minilm":
        w, X, info = minilm_layer(count, 16, 0, ctx.seed)
        return w, X, dict(model="all-MiniLM-L6-v2 layer 0 (biases dropped)", pretrained=bool(info.get("pretrained", True)))
    raise ValueError(f"unknown source {source!r}: 'vit' or 'minilm'")


# ---- certification rows shared by lofast_certified and lofast_text -----------------------------------------
def parse_config(s: str) -> Dict[str, Any]:
    """'L2-h8-c0.5' -> depth 2, heads 8, vo_norm 0.5."""
    try:
        L, h, c = s.split("-")
        if not (L[0] == "L" and h[0] == "h" and c[0] == "c"):
            raise ValueError
        return {"depth": int(L[1:]), "heads": int(h[1:]), "vo_norm": float(c[1:])}
    except (ValueError, IndexError):
        raise ValueError(f"bad config {s!r}: expected 'L<layers>-h<heads>-c<norm fraction>', e.g. 'L2-h8-c0.5'")


def certify_rows(model, cfg, info, u, y, eps_list, pgd: Dict[str, int], seed: int, config: str):
    """Prop. 1 certified accuracy per bound and eps, PGD robust accuracy at the same eps, per-point radii."""
    from harness.models.certify import BOUNDS, certify, mnorm_ratio, pgd_attack

    cert = certify(model, u, y)
    arch = parse_config(config)
    common = dict(config=config, **arch, dataset=cfg["dataset"], n_points=len(y), test_acc_full=info["test_acc_f32"],
                  train_seconds=info["train_seconds"], L_in=cert.L_in, L_head=cert.L_head,
                  zeta_mean=float(torch.stack([t.zeta for t in cert.layers]).mean()),
                  converged=bool(all(bool(t.converged.all()) for t in cert.layers)), **mnorm_ratio(cert))
    rows = []
    for e in eps_list:
        attack = pgd_attack(model, u, y, e, seed=seed, **pgd) if e > 0 else -cert.margin
        robust = cert.correct & (attack < 0)
        for b in BOUNDS:
            ok = cert.certified(e, b)
            rows.append(dict(common, kind="curve", bound=b, eps=float(e), clean_acc=float(cert.correct.float().mean()),
                             certified_acc=float(ok.float().mean()), pgd_acc=float(robust.float().mean()),
                             violations=int((ok & ~robust).sum())))
    for b in BOUNDS:
        for i, r in enumerate(cert.radius(b).tolist()):
            rows.append(dict(common, kind="radius", bound=b, point=i, radius=r, margin=float(cert.margin[i])))
    return rows


def plot_certified(table, outdir: Path, stem: str, xlabel: str, paper: str, ours: str):
    """Certified accuracy vs eps per config (4 bounds + PGD + clean) and the radius distributions."""
    from harness import plotting
    from harness.models.certify import BOUNDS

    curves = table[table.kind == "curve"]
    configs = sorted(curves.config.unique())
    fig, axes = plotting.figure(1, len(configs), squeeze=False)
    for ax, cfgname in zip(axes[0], configs):
        t = curves[curves.config == cfgname]
        for b in BOUNDS:
            s = t[t.bound == b].sort_values("eps")
            ax.plot(s.eps, s.certified_acc, label=BOUND_LABELS[b], **BOUND_STYLE[b])
        s = t[t.bound == "fine"].sort_values("eps")
        ax.plot(s.eps, s.pgd_acc, label="PGD (empirical)", **BOUND_STYLE["pgd"])
        ax.axhline(float(s.clean_acc.iloc[0]), color="#000000", lw=0.7, ls="--", label="clean")
        ax.set_xlabel(xlabel)
        ax.set_ylim(0, 1)
        plotting.caption(ax, cfgname)
    axes[0][0].set_ylabel("accuracy")
    axes[0][-1].legend(loc="upper right", fontsize=6)
    plotting.substitute_note(fig, paper, f"{ours}, {int(curves.n_points.iloc[0])} test points", "CPU budget")
    paths = plotting.save(fig, outdir, f"{stem}_curves")

    rad = table[table.kind == "radius"]
    fig, axes = plotting.figure(1, len(configs), squeeze=False)
    for ax, cfgname in zip(axes[0], configs):
        t = rad[rad.config == cfgname]
        for b in BOUNDS:
            r = np.sort(t[t.bound == b].radius.to_numpy())
            ax.plot(r, 1 - np.arange(len(r)) / max(len(r), 1), label=BOUND_LABELS[b], **BOUND_STYLE[b])
        ax.set_xlabel("certified radius")
        plotting.caption(ax, cfgname)
    axes[0][0].set_ylabel("fraction of points with radius >= x")
    axes[0][-1].legend(fontsize=6)
    return paths + plotting.save(fig, outdir, f"{stem}_radius")


def certified_summary(table, eps_ref: float) -> str:
    """Markdown table: clean / certified / PGD accuracy at eps_ref, radii, ||M||/xi, soundness violations."""
    from harness.models.certify import BOUNDS

    curves = table[table.kind == "curve"]
    rad = table[table.kind == "radius"]
    lines = [f"| config | clean acc (full test) | certified acc at eps={eps_ref:g}: naive / coarse / fine / sharp | "
             f"PGD acc at eps={eps_ref:g} | median radius coarse / fine / sharp | largest grid eps with cert > 0 (sharp) | "
             "mean ||M||/xi | violations |", "|---|---|---|---|---|---|---|---|"]
    for cfgname in sorted(curves.config.unique()):
        t = curves[curves.config == cfgname]
        sel = lambda b: t[(t.bound == b) & np.isclose(t.eps, eps_ref)]
        r = rad[rad.config == cfgname]
        med = {b: float(r[r.bound == b].radius.median()) for b in BOUNDS}
        f = t[(t.bound == "sharp") & (t.certified_acc > 0)]
        lines.append(f"| {cfgname} | {t.clean_acc.iloc[0]:.3f} ({t.test_acc_full.iloc[0]:.3f}) | "
                     + " / ".join(f"{float(sel(b).certified_acc.iloc[0]):.3f}" for b in BOUNDS)
                     + f" | {float(sel('fine').pgd_acc.iloc[0]):.3f} | "
                     f"{med['coarse']:.3f} / {med['fine']:.3f} / {med['sharp']:.3f} | "
                     f"{f.eps.max() if len(f) else 0:.2f} | {t.m_over_xi_mean.iloc[0]:.3f} | {int(t.violations.sum())} |")
    return "\n".join(lines)
