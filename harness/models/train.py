"""The harness's one training loop (`fit`) and one accuracy function, plus `train_classifier`: a ViT (or any
model_fn) trained on an image set, optionally cached through a store the caller passes in.

`fit` is Adam (or SGD with momentum 0.9) + cross-entropy of `logit_scale * logits` (+ an optional regularizer), a seeded batch order,
a constant or cosine learning-rate schedule. JaSMin's ViTs (train_classifier) and LoFAST's LipViT/LipText
(harness.models.lofast_train) both train through it. Training runs in the model's dtype on the model's device;
batches are moved there one at a time.

Same config, same weights, bitwise, on any machine and at any `--threads`/`-j`: `fit` and `predict` compute with
TRAIN_THREADS torch threads and torch's deterministic algorithms (harness.context.fixed_threads), whatever the
runner set. Measured on 2 cores: a ViT or LipViT trained with 2 threads differs in its weights from the same
training with 1 thread (parallel sums split by thread count round differently, and training compounds it), and
one thread was not slower here (LipViT quick, 94 steps: 3.3 s vs 8.2 s with 2 threads on a shared machine).

train_classifier recipe keys (defaults in DEFAULTS): dataset, data_root, train_limit, test_limit, arch ("vit"),
model (ViT kwargs: d, depth, heads, mlp_ratio, patch, qkv_bias; `pretrained`: a Hugging Face ViT checkpoint to start
from, harness.models.vit_import), epochs, batch_size, lr, optimizer ("adam" | "sgd", see fit), schedule ("constant" |
"cosine", see fit), weight_decay, seed, max_steps (None = all), device ("cpu" | "cuda"; training is float32).
The regularizer's own recipe and a fingerprint of explicitly passed data join the key.

This module imports no store: pass `store` = harness.store.artifacts.cached_artifact (signature
store(kind, recipe, build, root=..., code=[modules])) and `root` (e.g. ctx.artifacts) to cache the trained
state_dict and metrics (plain data only); without a store the model is trained on every call.
"""
from __future__ import annotations

import copy
import hashlib
import math
import sys
import time
from typing import Callable, Dict, Optional, Tuple

import torch
from torch import nn

from harness.context import fixed_threads
from harness.models import regularizers as _regularizers
from harness.models import vit as _vit
from harness.models import vit_import as _vit_import

KIND = "classifier"
DEFAULTS = {"dataset": "fashion_mnist", "data_root": None, "train_limit": None, "test_limit": None,
            "arch": "vit", "model": {}, "epochs": 1, "batch_size": 128, "lr": 1e-3, "optimizer": "adam", "schedule": "constant",
            "weight_decay": 0.0, "seed": 0, "max_steps": None, "device": "cpu"}

Data = Tuple[Tuple[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, torch.Tensor]]
Inputs = Optional[Callable[[nn.Module, torch.Tensor], torch.Tensor]]
TRAIN_THREADS = 1  # torch threads of every training and accuracy computation (see the module docstring)


def _param(model: nn.Module) -> torch.Tensor:
    return next(model.parameters())


def _batch(model: nn.Module, xb: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    """A data batch on the model's device (floats in its dtype), through `inputs` (e.g. token ids -> embeddings)."""
    p = _param(model)
    xb = xb.to(device=p.device, dtype=p.dtype) if xb.is_floating_point() else xb.to(p.device)
    return xb if inputs is None else inputs(model, xb)


def predict(model: nn.Module, X: torch.Tensor, batch_size: int = 512, inputs: Inputs = None) -> torch.Tensor:
    """Predicted labels (N,) on the CPU (eval mode restored afterwards, no grad)."""
    was = model.training
    model.eval()
    out = []
    with torch.no_grad(), fixed_threads(TRAIN_THREADS):
        for i in range(0, len(X), batch_size):
            out.append(model(_batch(model, X[i:i + batch_size], inputs)).argmax(-1).cpu())
    model.train(was)
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def accuracy(model: nn.Module, X: torch.Tensor, y: torch.Tensor, batch_size: int = 512, inputs: Inputs = None) -> float:
    """Clean accuracy in [0, 1] (the harness's one accuracy function)."""
    if len(X) == 0:
        return 0.0
    return float((predict(model, X, batch_size, inputs) == y.cpu()).float().mean())


def fit(model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int, lr: float, seed: int,
        weight_decay: float = 0.0, max_steps: Optional[int] = None, schedule: str = "constant",
        logit_scale: float = 1.0, inputs: Inputs = None, regularizer=None, pbar=None, optimizer: str = "adam"
        ) -> Dict[str, object]:
    """Train `model` in place on (X, y); returns metrics (plain floats/ints/lists).

    optimizer: "adam" or "sgd" (momentum 0.9, JaSMin's fine-tuning recipe); weight_decay is the optimizer's own.
    schedule: "constant" or "cosine" (lr * (1 + cos(pi t / T)) / 2 over the T steps). logit_scale: the
    temperature tau of LoFAST's loss (cross-entropy of tau * logits). inputs(model, batch): maps a data batch to
    the model's input. A regularizer with `needs_attn` gets the attention maps of forward(x, return_attn=True).
    pbar(total=, desc=): a progress-bar factory (e.g. ctx.pbar) or None. Runs with TRAIN_THREADS threads.
    """
    with fixed_threads(TRAIN_THREADS):
        return _fit(model, X, y, epochs=epochs, batch_size=batch_size, lr=lr, seed=seed, weight_decay=weight_decay,
                    max_steps=max_steps, schedule=schedule, logit_scale=logit_scale, inputs=inputs,
                    regularizer=regularizer, pbar=pbar, optimizer=optimizer)


def _fit(model: nn.Module, X: torch.Tensor, y: torch.Tensor, *, epochs: int, batch_size: int, lr: float, seed: int,
         weight_decay: float, max_steps: Optional[int], schedule: str, logit_scale: float, inputs: Inputs,
         regularizer, pbar, optimizer) -> Dict[str, object]:
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}")
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {schedule!r}")
    if optimizer not in ("adam", "sgd"):
        raise ValueError(f"optimizer must be 'adam' or 'sgd', got {optimizer!r}")
    g = torch.Generator().manual_seed(seed)
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    total = math.ceil(len(X) / batch_size) * epochs
    if max_steps is not None:
        total = min(total, max_steps)
    sched = None
    if schedule == "cosine":
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * min(s / total, 1.0))))
    needs_attn = regularizer is not None and getattr(regularizer, "needs_attn", False)
    if hasattr(regularizer, "reset"):
        regularizer.reset()  # e.g. Specformer's warm-start vectors: every run starts alike
    dev = _param(model).device
    losses, reg_vals, step_times, epoch_loss = [], [], [], []
    bar = pbar(total=total, desc="train") if pbar is not None else None
    model.train()
    step = 0
    for _ in range(epochs):
        perm = torch.randperm(len(X), generator=g)
        run = []
        for i in range(0, len(X), batch_size):
            if step >= total:
                break
            idx = perm[i:i + batch_size]
            xb, yb = _batch(model, X[idx], inputs), y[idx].to(dev)
            t0 = time.perf_counter()
            if needs_attn:
                logits, probs, _ = model(xb, return_attn=True)
            else:
                logits, probs = model(xb), None
            loss = nn.functional.cross_entropy(logit_scale * logits, yb)
            reg = regularizer(model, probs) if regularizer is not None else None
            obj = loss + reg if reg is not None else loss
            opt.zero_grad(set_to_none=True)
            obj.backward()
            opt.step()
            if sched is not None:
                sched.step()
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
    return {"steps": step, "epochs": epochs, "loss_first": losses[0] if losses else float("nan"),
            "loss_last": losses[-1] if losses else float("nan"), "epoch_loss": epoch_loss,
            "loss_curve": losses[:: max(1, len(losses) // 200)], "reg_last": reg_vals[-1] if reg_vals else None,
            "step_time_mean_s": st.mean().item(), "step_time_median_s": st.median().item(),
            "train_time_s": float(sum(step_times)), "n_train": len(X), "threads": torch.get_num_threads()}


# ---- train_classifier (image classifiers, e.g. JaSMin's ViTs) ----------------------------------------------------
def full_recipe(recipe: dict, regularizer=None, data: Optional[Data] = None) -> dict:
    """recipe with defaults filled in, plus the regularizer recipe and the data fingerprint."""
    unknown = set(recipe) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"unknown training recipe keys {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    c = copy.deepcopy(DEFAULTS)
    c.update(copy.deepcopy(recipe))
    if c["epochs"] < 1 or c["batch_size"] < 1 or c["lr"] <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1, lr > 0; got {c['epochs']}, {c['batch_size']}, {c['lr']}")
    c["device"] = str(c["device"]).split(":")[0]  # the kind of device changes numbers, not which one
    c["regularizer"] = None if regularizer is None else regularizer.recipe
    c["data_fingerprint"] = None if data is None else data_fingerprint(data)
    if c["model"].get("pretrained"):  # key the fine-tuned model by the checkpoint's revision / content
        c["model"]["weights"] = _vit_import.weights_source(c["model"]["pretrained"])
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
    """((Xtr, ytr), (Xte, yte)) and info for recipe's dataset."""
    from harness.data.images import load_images

    Xtr, ytr, info = load_images(c["dataset"], root=c["data_root"], split="train", limit=c["train_limit"])
    Xte, yte, _ = load_images(c["dataset"], root=c["data_root"], split="test", limit=c["test_limit"])
    return ((Xtr, ytr), (Xte, yte)), info


def build_model(c: dict, shape, n_classes: int) -> nn.Module:
    """The architecture named by recipe['arch'] for inputs of `shape` (C, H, W)."""
    if c["arch"] != "vit":
        raise ValueError(f"unknown arch {c['arch']!r}: train_classifier builds 'vit' (pass model_fn for others)")
    kw = dict(c["model"])
    pretrained = kw.pop("pretrained", None)
    kw.pop("weights", None)  # the checkpoint's content, in the artifact key only (full_recipe)
    if pretrained:  # a Hugging Face ViT checkpoint, mapped onto our ViT at the data's image and patch size
        if shape[1] != shape[2]:
            raise ValueError(f"square images expected, got {shape[1]}x{shape[2]}")
        unknown = set(kw) - {"patch", "qkv_bias", "d", "depth", "heads"}
        if unknown:
            raise ValueError(f"model keys {sorted(unknown)} come from the checkpoint {pretrained!r}: leave them out")
        cfg = _vit_import.hf_vit_config(pretrained)  # checked before the weights are read
        differ = [f"{k} {kw[k]} (checkpoint: {cfg[k]})" for k in ("d", "depth", "heads") if k in kw and kw[k] != cfg[k]]
        if cfg["in_chans"] != shape[0]:
            differ.append(f"{shape[0]}-channel images (checkpoint: {cfg['in_chans']} channels)")
        if differ:
            raise ValueError(f"the recipe does not fit the checkpoint {pretrained!r}: {', '.join(differ)}")
        return _vit_import.vit_from_hf(pretrained, image_size=int(shape[1]), patch=int(kw.get("patch", 4)),
                                       n_classes=n_classes, seed=c["seed"], qkv_bias=kw.get("qkv_bias"))
    return _vit.vit_for(tuple(shape), n_classes, **kw)


def train_classifier(recipe: dict, ctx=None, regularizer=None, data: Optional[Data] = None,
                     model_fn: Optional[Callable[[dict, tuple, int], nn.Module]] = None,
                     force: bool = False, store=None, root=None) -> nn.Module:
    """Train (or load through `store`) a classifier; returns the model in eval() mode (float32, on recipe's device)
    with `model.train_metrics` (clean test accuracy, losses, per-step time), `model.train_recipe`, `model.cached`.

    data: ((Xtr, ytr), (Xte, yte)) to bypass the loader (fingerprinted into the key). model_fn(recipe, shape,
    n_classes) builds another architecture (its identity must be in recipe, e.g. recipe['arch']; a store keys only
    this module's import closure, so a model_fn's own code is not hashed); it must accept
    forward(x, return_attn=True) -> (logits, probs, inputs) if the regularizer needs attention maps.
    store: cached_artifact-like callable; root: its folder (default ctx.artifacts). ctx: for its pbar/artifacts.
    """
    c = full_recipe(recipe, regularizer, data)
    if data is None:
        data, info = load_data(c)
        n_classes = info["n_classes"]
    else:
        n_classes = int(max(data[0][1].max().item(), data[1][1].max().item())) + 1
    shape = tuple(data[0][0].shape[1:])
    make = model_fn or build_model
    pbar = getattr(ctx, "pbar", None)

    def new_model() -> nn.Module:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(c["seed"])
            return make(c, shape, n_classes).to(device=c["device"], dtype=torch.float32)

    built = []

    def build() -> dict:
        model = new_model()
        (Xtr, ytr), (Xte, yte) = data
        metrics = fit(model, Xtr, ytr, epochs=c["epochs"], batch_size=c["batch_size"], lr=c["lr"], seed=c["seed"],
                      weight_decay=c["weight_decay"], max_steps=c["max_steps"], schedule=c["schedule"],
                      regularizer=regularizer, pbar=pbar, optimizer=c["optimizer"])
        metrics.update(train_acc=accuracy(model, Xtr[:5000], ytr[:5000]), test_acc=accuracy(model, Xte, yte),
                       n_test=len(Xte))
        built.append(model)
        return {"state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "metrics": metrics}

    if store is None or force:
        blob = build()
    else:
        root = root if root is not None else getattr(ctx, "artifacts", None)
        blob = store(KIND, c, build, root=root, code=[sys.modules[__name__], _vit, _vit_import, _regularizers])
    if built:
        model = built[0]
    else:
        model = new_model()
        model.load_state_dict(blob["state_dict"])
    model.eval()
    model.train_metrics, model.train_recipe, model.cached = blob["metrics"], c, not built
    return model
