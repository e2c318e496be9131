"""Models and inputs for `attnlip analyze`: load a model by alias / hub name / folder, texts from files or
Hugging Face `datasets`, images from a folder or a .npy batch, and turn them into model keyword arguments.

Texts are tokenized as one right-padded batch (padding masks), truncated to `max_tokens`.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from harness.data import sources, text as corpora
from harness.errors import DataNotFound
from harness.models import checkpoint, hub, text as text_models

SHIPPED = {  # dataset name -> {split as the user writes it: split of harness.data.text}
    "sst2": {"train": "train", "validation": "dev", "dev": "dev"},
    "ag_news": {"test": "test"},
}
TEXT_COLUMNS = ("text", "sentence", "content", "document", "review", "description")
BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".txt": "text", ".parquet": "parquet"}


def load_model(spec, device="cpu"):
    """(model, tokenizer or None, source string). spec: a torch module (returned as is), an alias ("minilm",
    "tiny-bert", "tiny-gpt2"; harness.models.text), a local folder saved with save_pretrained, or a Hugging Face
    hub name (the local hub cache, else downloaded unless HF_HUB_OFFLINE is set; harness.models.hub). Weights are
    loaded with attn_implementation="eager"."""
    if isinstance(spec, torch.nn.Module):
        return spec.eval(), None, f"module:{type(spec).__name__}"
    name = str(spec)
    if os.path.isdir(name):
        from transformers import AutoTokenizer

        if not (Path(name) / "config.json").is_file():
            raise DataNotFound(f"--model {name!r} is a folder without config.json, so no model can be built from it."
                               " Fix: save the model there with model.save_pretrained(DIR) and its tokenizer with "
                               "tokenizer.save_pretrained(DIR)")

        checkpoint.check_folder(name)  # damaged weights or absurd sizes: one line naming the file, before loading
        # never the folder's own Python: check_model_folder refuses auto_map configs, and this refuses the rest
        model = checkpoint.load(name, attn_implementation="eager")
        model = model.to(device).eval()
        tok = AutoTokenizer.from_pretrained(name, trust_remote_code=False) if hub.has_tokenizer(name) else None
        return model, tok, f"folder:{Path(name).resolve()}"
    low = name.lower()
    if name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name:  # a path, not a hub name
        raise DataNotFound(f"--model {name!r}: no such folder. Fix: give the folder written by "
                           f"model.save_pretrained(DIR), an alias ({', '.join(('minilm', *text_models.TINY))}), or a "
                           "hub name such as sentence-transformers/all-MiniLM-L6-v2")
    pretrained = False if low in text_models.TINY else True
    try:
        tm = text_models.load(name, pretrained=pretrained, device=device)
    except DataNotFound as e:
        if low in text_models.MINILM_ALIASES:
            raise
        if low in text_models.TINY:  # random weights, but the real tokenizer: say which piece is missing
            raise DataNotFound(f"--model {name!r} (random-init, {text_models.TINY[low][0]}'s tokenizer) cannot be "
                               f"built here: {e}", fix=e.fix) from e
        why = e.reason if isinstance(e, text_models.WeightsUnavailable) else str(e)
        get = f"a hub name after `{e.fix}` with network access" if e.fix else "a hub name in the local cache"
        raise DataNotFound(f"--model {name!r} is not an alias ({', '.join(('minilm', *text_models.TINY))}), not a "
                           f"local folder, and not an available hub model ({why}). Fix: pass --model minilm, a "
                           "folder written by model.save_pretrained(DIR) and tokenizer.save_pretrained(DIR), or "
                           f"{get}", fix=e.fix) from e
    return tm.model, tm.tokenizer, tm.source


def read_text_file(path: str) -> List[str]:
    """One text per non-empty line."""
    with open(path, encoding="utf-8") as f:
        return [ln.strip() for ln in f if ln.strip()]


def _text_of(row: dict, cols: Sequence[str]) -> str:
    parts = [str(row[c]) for c in cols if c in row and row[c] is not None]
    return " ".join(parts).strip()


def load_dataset_texts(spec: str, samples: int, seed: int = 0) -> List[str]:
    """Texts through Hugging Face `datasets`: spec = NAME_OR_FILES[:split]. Shipped names ("sst2", "ag_news")
    are read as the experiments read them (harness.data.text: the mirror, a fetched copy, else a download); a file path (or comma-separated paths) uses the builder of its
    extension (.csv/.tsv/.json/.jsonl/.txt/.parquet); anything else is a hub dataset name. `samples` rows are
    drawn with `seed` (all rows if samples >= the split size)."""
    import datasets

    name, _, split = spec.partition(":")
    low = name.lower().replace("-", "_")
    if low in SHIPPED:
        splits = SHIPPED[low]
        split = split or next(iter(splits))
        if split not in splits:
            raise ValueError(f"dataset {name!r} has splits {sorted(splits)}, got {split!r}")
        try:  # the mirror, a fetched copy or a download, as the experiments read it
            texts = corpora.load_corpus(low, splits[split] if low == "sst2" else None)
        except DataNotFound as e:
            raise DataNotFound(f"--dataset {spec} reads {sources.get(low).what.split(':')[0]}, which is not available here: {e}",
                               fix=e.fix or f"attnlip data fetch {low}") from None
        ds = datasets.Dataset.from_dict({"text": texts})
        cols = ["text"]
    else:
        files = [f for f in name.split(",") if f]
        if files and all(os.path.exists(f) for f in files):
            ext = Path(files[0]).suffix.lower()
            if ext not in BUILDERS:
                raise ValueError(f"cannot read {files[0]!r}: expected one of {sorted(BUILDERS)}")
            kw = {"delimiter": "\t"} if ext == ".tsv" else {}
            ds = datasets.load_dataset(BUILDERS[ext], data_files={"data": files}, split="data", **kw)
        else:
            try:
                ds = datasets.load_dataset(name, split=split or "train")
            except Exception as e:
                raise DataNotFound(f"dataset {name!r} is neither a shipped name ({sorted(SHIPPED)}), an existing "
                                   f"file, nor a hub dataset available here: {e}") from e
        cols = [c for c in TEXT_COLUMNS if c in ds.column_names]
        if not cols:
            strs = [c for c, f in ds.features.items() if getattr(f, "dtype", None) in ("string", "large_string")]
            if not strs:
                raise ValueError(f"dataset {name!r} has no text column (columns {ds.column_names})")
            cols = strs[:1]
        cols = cols[:1]
    n = len(ds)
    if samples < n:
        ds = ds.shuffle(seed=seed).select(range(samples))
    return [t for t in (_text_of(r, cols) for r in ds) if t]


def load_images(path: str, image_size: int, channels: int = 3) -> torch.Tensor:
    """pixel_values (B, C, H, W): a .npy batch ((B, H, W, C) or (B, C, H, W), values in [0, 1] or [0, 255]) or a
    folder of PNG/JPEG files, resized to image_size and normalized with mean = std = 0.5 (ViT's default)."""
    import numpy as np

    if str(path).endswith(".npy"):
        a = torch.as_tensor(np.load(path, allow_pickle=False)).float()
        if a.dim() == 3:
            a = a[..., None]
        if a.shape[-1] in (1, 3) and a.shape[1] not in (1, 3):
            a = a.permute(0, 3, 1, 2)
    else:
        from PIL import Image

        files = sorted(p for p in Path(path).iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg"))
        if not files:
            raise DataNotFound(f"no PNG/JPEG images in {path}")
        imgs = [np.asarray(Image.open(f).convert("RGB").resize((image_size, image_size))) for f in files]
        a = torch.as_tensor(np.stack(imgs)).float().permute(0, 3, 1, 2)  # (B, 3, H, W)
    if a.max() > 1.5:
        a = a / 255.0
    if a.shape[1] != channels:
        a = a.expand(-1, channels, -1, -1) if a.shape[1] == 1 else a[:, :channels]
    a = torch.nn.functional.interpolate(a, size=(image_size, image_size), mode="bilinear", align_corners=False)
    return (a - 0.5) / 0.5


def tokenize(tokenizer, texts: Sequence[str], max_tokens: Optional[int]) -> dict:
    """Right-padded batch {input_ids, attention_mask} (truncated to max_tokens)."""
    if tokenizer is None:
        raise ValueError("texts need a tokenizer: pass tokenizer=..., or save one next to the model "
                         "(tokenizer.save_pretrained(folder))")
    if getattr(tokenizer, "pad_token", None) is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    kw = dict(truncation=True, max_length=int(max_tokens)) if max_tokens else {}
    enc = tokenizer(list(texts), padding=True, return_tensors="pt", **kw)
    return {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}


def model_inputs(model, inputs, tokenizer=None, max_tokens: Optional[int] = None, device="cpu"
                 ) -> Tuple[object, Optional[torch.Tensor], List[str]]:
    """(what to call the model with, attention mask or None, input labels). inputs: str or list of str (texts),
    a dict of model keyword arguments (e.g. a tokenizer's output), or a tensor / tuple (positional arguments;
    for a ViT a pixel_values tensor)."""
    if isinstance(inputs, str):
        inputs = [inputs]
    if isinstance(inputs, (list, tuple)) and inputs and all(isinstance(t, str) for t in inputs):
        enc = tokenize(tokenizer, inputs, max_tokens)
        return {k: v.to(device) for k, v in enc.items()}, enc["attention_mask"], list(inputs)
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if isinstance(inputs, dict):
        inputs = dict(inputs)
        mask = inputs.get("attention_mask")
        if max_tokens and "input_ids" in inputs:
            for k in ("input_ids", "attention_mask", "token_type_ids"):
                if k in inputs:
                    inputs[k] = inputs[k][:, :max_tokens]
            mask = inputs.get("attention_mask")
        inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}
        B = next(v for v in inputs.values() if torch.is_tensor(v)).shape[0]
        return inputs, mask, [f"input {i}" for i in range(B)]
    if torch.is_tensor(inputs) and mt == "vit":
        return {"pixel_values": inputs.to(device)}, None, [f"image {i}" for i in range(inputs.shape[0])]
    if torch.is_tensor(inputs) and not inputs.is_floating_point():
        ids = inputs if inputs.dim() == 2 else inputs[None]
        if max_tokens:
            ids = ids[:, :max_tokens]
        return {"input_ids": ids.to(device)}, None, [f"input {i}" for i in range(ids.shape[0])]
    return inputs, None, ["input"]
