"""Deterministic classifier training (Adam, cross-entropy + optional regularizer), cached as an artifact keyed by
the canonical cfg. Used by the LoFAST and JaSMin experiments to train ViTs on real images.

cfg keys (defaults in DEFAULTS): dataset, data_root, train_limit, test_limit, arch ("vit"), model (ViT kwargs:
d, depth, heads, mlp_ratio, patch, qkv_bias), epochs, batch_size, lr, weight_decay, seed, max_steps (None = all).
The regularizer's own cfg and a fingerprint of explicitly passed data join the cache key.
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import nn

from harness.models.vit import ViT, vit_for

TRAIN_VERSION = "train-v1"  # bump when the training loop changes numbers
KIND = "classifier"
DEFAULTS = {"dataset": "fashion_mnist", "data_root": None, "train_limit": None, "test_limit": None,
            "arch": "vit", "model": {}, "epochs": 1, "batch_size": 128, "lr": 1e-3, "weight_decay": 0.0,
            "seed": 0, "max_steps": None}

Data = Tuple[Tuple[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]


def full_cfg(cfg: dict, regularizer=None, data: Optional[Data] = None) -> dict:
    """cfg with defaults filled in, plus the regularizer cfg, data fingerprint and training-code version."""
    unknown = set(cfg) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown training cfg keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    c = copy.deepcopy(DEFAULTS)
    c.update(copy.deepcopy(cfg))
    if c["epochs"] < 1 or c["batch_size"] < 1 or c["lr"] <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1, lr > 0; got {c['epochs']}, {c['batch_size']}, {c['lr']}")
    c["regularizer"] = None if regularizer is None else regularizer.cfg
    c["data_fingerprint"] = None if data is None else data_fingerprint(data)
    c["version"] = TRAIN_VERSION
    return c


def data_fingerprint(data: Data) -> str:
    """sha256 over shapes and bytes of ((Xtr, ytr), (Xte, yte))."""
    h = hashlib.sha256()
    for t in (data[0][0], data[0][1], data[1][0], data[1][1]):
        t = t.detach().cpu().contiguous()
        h.update(str((tuple(t.shape), str(t.dtype))).encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:20]


def load_data(c: dict) -> Tuple[Data, dict]:
    """((Xtr, ytr), (Xte, yte)) and info for cfg's dataset."""
    from harness.data.images import load_images

    Xtr, ytr, info = load_images(c["dataset"], root=c["data_root"], split="train", limit=c["train_limit"])
    Xte, yte, _ = load_images(c["dataset"], root=c["data_root"], split="test", limit=c["test_limit"])
    return ((Xtr, ytr), (Xte, yte)), info


def build_model(c: dict, shape, n_classes: int) -> nn.Module:
    """The architecture named by cfg['arch'] for inputs of `shape` (C, H, W)."""
    if c["arch"] != "vit":
        raise ValueError(f"unknown arch {c['arch']!r}: train_classifier builds 'vit' (pass model_fn for others)")
    return vit_for(tuple(shape), n_classes, **c["model"])


def accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch_size: int = 512) -> float:
    """Clean accuracy in [0, 1] (eval mode, no grad)."""
    was = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(X), batch_size):
            correct += (model(X[i:i + batch_size]).argmax(-1) == y[i:i + batch_size]).sum().item()
    model.train(was)
    return correct / max(1, len(X))


# ---- artifact store (harness.cache when present, else a local atomic torch.save) ------------------------------
def _root(ctx) -> Path:
    if ctx is None:
        try:
            from harness.cache import default_cache_dir

            return default_cache_dir() / "artifacts"
        except ImportError:
            return Path("results/cache/artifacts")
    return Path(ctx.artifacts) if hasattr(ctx, "artifacts") else Path(ctx)


def _local_path(c: dict, root: Path) -> Path:
    key = hashlib.sha256(json.dumps(c, sort_keys=True, default=str).encode()).hexdigest()[:20]
    return root / KIND / f"{key}.pt"


def artifact_file(c: dict, ctx) -> Path:
    """Where the trained model for the full cfg c is (or would be) stored."""
    try:
        from harness.cache import artifact_path

        return artifact_path(KIND, c, _root(ctx))
    except ImportError:
        return _local_path(c, _root(ctx))


def _load(c: dict, ctx):
    try:
        from harness.cache import load_artifact

        return load_artifact(KIND, c, _root(ctx))
    except ImportError:
        p = _local_path(c, _root(ctx))
        return torch.load(p, map_location="cpu", weights_only=False) if p.is_file() else None


def _save(c: dict, ctx, blob: dict) -> Path:
    try:
        from harness.cache import save_artifact

        return save_artifact(KIND, c, blob, _root(ctx), meta={"metrics": blob["metrics"]})
    except ImportError:
        p = _local_path(c, _root(ctx))
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=p.name + ".tmp.")
        os.close(fd)
        torch.save(blob, tmp)
        os.replace(tmp, p)
        return p


# ---- training ----------------------------------------------------------------------------------------------
def _train(c: dict, model: nn.Module, data: Data, regularizer, ctx) -> dict:
    (Xtr, ytr), (Xte, yte) = data
    g = torch.Generator().manual_seed(c["seed"])
    opt = torch.optim.Adam(model.parameters(), lr=c["lr"], weight_decay=c["weight_decay"])
    steps_per_epoch = math.ceil(len(Xtr) / c["batch_size"])
    total = steps_per_epoch * c["epochs"]
    if c["max_steps"] is not None:
        total = min(total, c["max_steps"])
    needs_attn = regularizer is not None and getattr(regularizer, "needs_attn", False)
    if hasattr(regularizer, "reset"):
        regularizer.reset()  # e.g. Specformer's warm-start vectors: every run starts alike
    losses, reg_vals, step_times, epoch_loss = [], [], [], []
    bar = ctx.pbar(total=total, desc=f"train {c['dataset']}") if ctx is not None and hasattr(ctx, "pbar") else None
    model.train()
    step = 0
    for epoch in range(c["epochs"]):
        perm = torch.randperm(len(Xtr), generator=g)
        run = []
        for i in range(0, len(Xtr), c["batch_size"]):
            if step >= total:
                break
            idx = perm[i:i + c["batch_size"]]
            xb, yb = Xtr[idx], ytr[idx]
            t0 = time.perf_counter()
            if needs_attn:
                logits, probs, _ = model(xb, return_attn=True)
            else:
                logits, probs = model(xb), None
            loss = nn.functional.cross_entropy(logits, yb)
            reg = regularizer(model, probs) if regularizer is not None else None
            obj = loss + reg if reg is not None else loss
            opt.zero_grad(set_to_none=True)
            obj.backward()
            opt.step()
            step_times.append(time.perf_counter() - t0)
            losses.append(loss.item())
            run.append(loss.item())
            if reg is not None:
                reg_vals.append(reg.item())
            step += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.3f}")
        if run:
            epoch_loss.append(sum(run) / len(run))
    if bar is not None:
        bar.close()
    model.eval()
    st = torch.tensor(step_times[1:] or step_times or [float("nan")], dtype=torch.float64)
    return {"steps": step, "epochs": c["epochs"], "loss_first": losses[0] if losses else float("nan"),
            "loss_last": losses[-1] if losses else float("nan"), "epoch_loss": epoch_loss,
            "loss_curve": losses[:: max(1, len(losses) // 200)],
            "reg_last": reg_vals[-1] if reg_vals else None,
            "step_time_mean_s": st.mean().item(), "step_time_median_s": st.median().item(),
            "train_time_s": float(sum(step_times)),
            "train_acc": accuracy(model, Xtr[:5000], ytr[:5000]), "test_acc": accuracy(model, Xte, yte),
            "n_train": len(Xtr), "n_test": len(Xte), "threads": torch.get_num_threads()}


def train_classifier(cfg: dict, ctx=None, regularizer=None, data: Optional[Data] = None,
                     model_fn: Optional[Callable[[dict, tuple, int], nn.Module]] = None,
                     force: bool = False, num_threads: Optional[int] = 1) -> nn.Module:
    """Train (or load from the artifact cache) a classifier; returns the model in eval() mode with
    `model.train_metrics` (clean test accuracy, losses, per-step time) and `model.train_cfg`, `model.cached`.

    data: ((Xtr, ytr), (Xte, yte)) to bypass the loader (fingerprinted into the key). model_fn(cfg, shape,
    n_classes) builds another architecture (its identity must be in cfg, e.g. cfg['arch']); it must accept
    forward(x, return_attn=True) -> (logits, probs, inputs) if the regularizer needs attention maps.
    num_threads: torch threads while training (restored afterwards); 1 is fastest for these small models on a
    shared 2-core CPU (measured 8x faster than 2 threads under load); None leaves the setting alone.
    """
    c = full_cfg(cfg, regularizer, data)
    if data is None:
        data, info = load_data(c)
        n_classes = info["n_classes"]
    else:
        n_classes = int(max(data[0][1].max().item(), data[1][1].max().item())) + 1
    shape = tuple(data[0][0].shape[1:])
    build = model_fn or build_model
    prev_threads = torch.get_num_threads()
    if num_threads is not None:
        torch.set_num_threads(num_threads)
    try:
        model, metrics, cached = _get(c, ctx, regularizer, data, shape, n_classes, build, force)
    finally:
        torch.set_num_threads(prev_threads)
    model.eval()
    model.train_metrics, model.train_cfg, model.cached = metrics, c, cached
    return model


def _get(c, ctx, regularizer, data, shape, n_classes, build, force):
    """(model, metrics, cached): load the artifact for c or train and save it."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(c["seed"])
        model = build(c, shape, n_classes)
        blob = None if force else _load(c, ctx)
        cached = blob is not None
        if cached:
            model.load_state_dict(blob["state_dict"])
            metrics = blob["metrics"]
        else:
            metrics = _train(c, model, data, regularizer, ctx)
            _save(c, ctx, {"state_dict": model.state_dict(), "metrics": metrics, "cfg": c,
                           "model_config": getattr(model, "config", None)})
    return model, metrics, cached
