"""LoFAST's certifiable models (LipViT on images, LipText on SST-2): config, data, build, training, cache.

Training goes through the harness's one loop (harness.models.train.fit): Adam, cross-entropy of
temperature-scaled logits (tau * F(u)), cosine learning-rate decay, always in float32 on the config's device
(the training recipe; `train_dtype` in the config says so). The caller casts the trained model to the dtype it
computes in. A trained model is an artifact of `store` (harness.store.artifacts.cached_artifact, passed in:
this layer imports no store) keyed by the config and this module's code closure; the stored object is plain
data ({"state_dict": tensors, "info": floats}).
"""
from __future__ import annotations

import functools
import sys
import time
from typing import Any, Dict, Optional, Tuple

import torch

from harness.context import fixed_threads
from harness.models.lipvit import LipText, LipTransformer, LipViT
from harness.models.train import TRAIN_THREADS, accuracy, fit
from harness.settings import torch_dtype

KIND = "lofast_model"
IMAGE_SHAPE = {"cifar10": (32, 3), "svhn": (32, 3)}  # (size, channels); Fashion-MNIST and synthetic: 28x28x1
KINDS = ("vit", "text")


def model_recipe(kind: str, *, layers: int, heads: int, vo_norm: float, seed: int, dataset: str, train_size: int,
              test_size: int, epochs: int, lr: float, patch: int = 7, device: str = "cpu") -> Dict[str, Any]:
    """The full training config of a LipViT ('vit') or LipText ('text').

    Fixed choices (see docs/notes/lofast-exp.md): d = 64, SLL width 2d, ||W^Q||, ||W^K|| <= 1, batch 128,
    tau = 30; ViT: 28x28x1 images (32x32x3 for CIFAR-10 / SVHN), embed_norm = ||W_e|| = 0.25 (patch tokens then mostly lie inside
    LayerProject(1)'s ball, so L_in = 0.25); text: 32 tokens, embeddings from MiniLM's (PCA to d), embed_scale 0.25.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown model kind {kind!r}; choose from {KINDS}")
    c = dict(kind=kind, d=64, depth=int(layers), heads=int(heads), vo_norm=float(vo_norm), ffn_mult=2, qk_norm=1.0,
             lr=float(lr), batch=128, tau=30.0, seed=int(seed), dataset=str(dataset), n_train=int(train_size),
             n_test=int(test_size), epochs=int(epochs), train_dtype="float32", device=str(device).split(":")[0])
    if kind == "vit":
        c.update(embed_norm=0.25, patch=int(patch))
    else:
        c.update(n=32, embed_scale=0.25, emb_init="minilm-pca")
    return c


TRAIN_KEYS = ("dataset", "train_size", "test_size", "epochs", "lr", "patch")  # the training budget (grid keys)


def recipe_from_cell(kind: str, cell: Dict[str, Any], *, seed: int, device: str = "cpu", **arch) -> Dict[str, Any]:
    """model_recipe from an experiment cell's training-budget keys (TRAIN_KEYS; 'patch' only for 'vit') and the
    architecture (layers, heads, vo_norm) from `arch` or else from the cell."""
    keys = TRAIN_KEYS if kind == "vit" else TRAIN_KEYS[:-1]
    missing = [k for k in keys + ("layers", "heads", "vo_norm") if k not in cell and k not in arch]
    if missing:
        raise ValueError(f"cell lacks training keys {missing}")
    a = {k: arch.get(k, cell.get(k)) for k in ("layers", "heads", "vo_norm")}
    return model_recipe(kind, seed=seed, device=device, **a, **{k: cell[k] for k in keys})


# ---- data ---------------------------------------------------------------------------------------------------
def load_data(recipe: Dict[str, Any], split: str, limit: Optional[int] = None):
    """(X, y, vocab) of a split ('train' | 'test'): images (N, 1, 28, 28) float32 in [0, 1] or token ids (N, n).

    'synthetic' is harness.data's synthetic set (images) or synthetic_labeled_ids (text); SST-2's test split
    is its dev split (the test split has no labels). vocab is None for images."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    limit = limit or (recipe["n_train"] if split == "train" else recipe["n_test"])
    if recipe["kind"] == "vit":
        from harness.data.images import load_images

        X, y, _ = load_images(recipe["dataset"], split=split, limit=limit, n_synthetic=limit)
        return X, y, None
    from harness.data import text

    if recipe["dataset"] == "synthetic":
        return text.synthetic_labeled_ids(split, recipe["n"], limit)
    if recipe["dataset"] != "sst2":
        raise ValueError(f"text dataset must be 'sst2' or 'synthetic', got {recipe['dataset']!r}")
    from harness.models.text import bert_tokenizer

    tok = bert_tokenizer()
    ids, y = text.load_sst2("train" if split == "train" else "dev", max_len=recipe["n"], tokenizer=tok, limit=limit)
    return ids, y, int(tok.vocab_size)


def vocab_size(recipe: Dict[str, Any]) -> Optional[int]:
    if recipe["kind"] == "vit":
        return None
    if recipe["dataset"] == "synthetic":
        return 200
    from harness.models.text import bert_tokenizer

    return int(bert_tokenizer().vocab_size)


# ---- model --------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=2)
def minilm_pca_embeddings(d: int) -> torch.Tensor:
    """MiniLM's (pretrained) word-embedding table projected onto its top-d principal directions: (vocab, d).

    pca_lowrank is randomized: it draws from a fixed seed (not from whatever global RNG state the first caller in a
    process left) and computes with the training's fixed thread count, so a text model's initialization does not
    depend on which cell ran first or on --threads."""
    from harness.models import text

    E = text.load("minilm").model.get_input_embeddings().weight.detach().float()  # (vocab, 384)
    with torch.random.fork_rng(devices=[]), fixed_threads(TRAIN_THREADS):
        torch.manual_seed(0)
        E = E - E.mean(0)
        _, _, V = torch.pca_lowrank(E, q=d, center=False, niter=4)
        return E @ V[:, :d]  # (vocab, d)


def build(recipe: Dict[str, Any]) -> LipTransformer:
    """The untrained float32 CPU model of a config, initialized from seed recipe['seed'] (a text model's
    embeddings start from MiniLM's, PCA'd to d, unless the data is synthetic)."""
    common = dict(d=recipe["d"], depth=recipe["depth"], heads=recipe["heads"], vo_norm=recipe["vo_norm"],
                  ffn_mult=recipe["ffn_mult"], qk_norm=recipe["qk_norm"])
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(recipe["seed"])
        if recipe["kind"] == "vit":
            size, channels = IMAGE_SHAPE.get(recipe["dataset"], (28, 1))
            return LipViT(image_size=size, patch=recipe["patch"], channels=channels, classes=10,
                          embed_norm=recipe["embed_norm"], **common)
        vocab = vocab_size(recipe)
        m = LipText(vocab=vocab, n=recipe["n"], classes=2, embed_scale=recipe["embed_scale"], **common)
    if recipe.get("emb_init") == "minilm-pca" and recipe["dataset"] != "synthetic":
        with torch.no_grad():
            m.emb.weight.copy_(minilm_pca_embeddings(recipe["d"])[:vocab])
    return m


def _train_inputs(model: LipTransformer, batch: torch.Tensor) -> torch.Tensor:
    """fit's inputs hook: images as they are, token ids -> unit-norm word embeddings (differentiable)."""
    return model.embed_ids(batch) if isinstance(model, LipText) else batch


def train(recipe: Dict[str, Any], pbar=None) -> Dict[str, Any]:
    """Train the model of `recipe` from scratch: {"state_dict": CPU tensors, "info": plain floats}."""
    Xtr, ytr, _ = load_data(recipe, "train")
    Xte, yte, _ = load_data(recipe, "test")
    model = build(recipe).to(device=recipe["device"], dtype=torch_dtype(recipe["train_dtype"]))
    t0 = time.time()
    desc = f"train {recipe['kind']} L{recipe['depth']} h{recipe['heads']} c{recipe['vo_norm']}"
    m = fit(model, Xtr, ytr, epochs=recipe["epochs"], batch_size=recipe["batch"], lr=recipe["lr"], seed=recipe["seed"],
            schedule="cosine", logit_scale=recipe["tau"], inputs=_train_inputs,
            pbar=None if pbar is None else (lambda total, desc_=desc, **_: pbar(total=total, desc=desc_)))
    info = {"train_seconds": time.time() - t0, "train_acc": accuracy(model, Xtr[:2000], ytr[:2000], inputs=_train_inputs),
            "test_acc": accuracy(model, Xte, yte, inputs=_train_inputs), "final_loss": float(m["loss_last"]),
            "steps": int(m["steps"])}
    return {"state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()}, "info": info}


def trained_model(recipe: Dict[str, Any], *, store=None, root=None, dtype=torch.float64, device="cpu",
                  pbar=None) -> Tuple[LipTransformer, Dict[str, Any]]:
    """The trained model of `recipe` in eval mode, cast to (dtype, device), and its training info.

    store(kind, recipe, build, root=, code=[modules]): a cached_artifact-like callable; None trains every call."""
    built = []

    def make() -> Dict[str, Any]:
        built.append(True)
        return train(recipe, pbar)

    blob = make() if store is None else store(KIND, recipe, make, root=root, code=[sys.modules[__name__]])
    model = build(recipe)
    model.load_state_dict(blob["state_dict"])
    return model.to(device=device, dtype=dtype).eval(), dict(blob["info"], cached=not built)


def test_batch(recipe: Dict[str, Any], count: int, device="cpu") -> Tuple[torch.Tensor, torch.Tensor]:
    """The first `count` test points as a data batch (images float32, or token ids) and labels, on `device`.
    stem_inputs(model, batch) turns it into the model's stem input u in the model's dtype."""
    X, y, _ = load_data(recipe, "test")
    return X[:count].to(device), y[:count].to(device)


def stem_inputs(model: LipTransformer, batch: torch.Tensor) -> torch.Tensor:
    """Stem input u of a data batch in the model's dtype and device (no grad): images as they are, token ids ->
    unit-norm word embeddings."""
    p = next(model.parameters())
    with torch.no_grad():
        if batch.is_floating_point():
            batch = batch.to(device=p.device, dtype=p.dtype)
        else:
            batch = batch.to(p.device)
        u = model.embed_ids(batch) if isinstance(model, LipText) else batch
    return u.detach()
