"""Certify a classifier on a list of inputs: `certify_model(model, inputs, labels)` -> one row per input
(what `attnlip certify` writes and the comparison benchmark reads).

Perturbation models (stated in every row's `perturbation`):
  "word"        l2 ball on one token's word embedding (DeepT's and CROWN's setting): token `position` (default 1, the
                first token after [CLS]; clipped to the last token before [SEP])
  "embeddings"  l2 ball on the whole word-embedding matrix (every token at once, Frobenius norm)
  "pixels"      l2 ball on the (normalized) pixels of an image (ViT)
Labels: the given ones (a dataset's), else the model's own prediction (the certificate is then of that prediction).
"""
from __future__ import annotations

import math
import time
from collections import Counter
from typing import Dict, List, Optional, Sequence

import torch

from harness.certify.core import attack_into, certify_input, summary_row
from harness.certify.programs import Program, patches, program_for

Tensor = torch.Tensor
PERTURBATIONS = ("word", "embeddings", "pixels")


def _attention_winners(blocks) -> str:
    """'second_order x11, refined x1': which certificate bounded each attention block."""
    c = Counter(how for name, how, _ in blocks if name.endswith("attention") and how != "unchanged")
    return ", ".join(f"{k} x{v}" for k, v in c.most_common())


def text_inputs(model, tokenizer, texts: Sequence[str], max_tokens: int = 128) -> List[Tensor]:
    """Word-embedding matrices (n, d) in float64, one per text (tokenized alone: no padding)."""
    if tokenizer is None:
        raise ValueError("texts need the model's tokenizer: save it next to the model (tokenizer.save_pretrained)")
    emb = model.get_input_embeddings().weight.detach()
    out = []
    for t in texts:
        ids = tokenizer(t, truncation=True, max_length=int(max_tokens), return_tensors="pt")["input_ids"][0]
        out.append(emb[ids].to(torch.float64))
    return out


def rows_of(perturb: str, n: int, position: int) -> Optional[tuple]:
    if perturb == "word":
        return (max(1, min(int(position), n - 2)) if n > 2 else n - 1,)
    return None


def certify_model(model, inputs, labels: Optional[Sequence[int]] = None, *, tokenizer=None, perturb: str = "word",
                  position: int = 1, attack: bool = True, network: bool = True, names=None, max_tokens: int = 128,
                  texts: Optional[Sequence[str]] = None, progress: bool = False,
                  program: Optional[Program] = None) -> List[Dict[str, object]]:
    """One row per input. inputs: texts (str), or pixel_values (B, C, H, W) for a ViT. The model is certified in
    float64 (a copy; the caller's model is left as it is)."""
    import copy

    if perturb not in PERTURBATIONS:
        raise ValueError(f"perturbation {perturb!r}: choose from {', '.join(PERTURBATIONS)}")
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if mt == "vit" and perturb != "pixels":
        raise ValueError(f"a ViT is certified on its pixels (perturbation 'pixels'), not {perturb!r}")
    if mt != "vit" and perturb == "pixels":
        raise ValueError("pixels are a ViT's input; a text classifier takes 'word' or 'embeddings'")
    t0 = time.perf_counter()
    model = copy.deepcopy(model).to(torch.float64).eval()
    program = program or program_for(model, names)
    prep_s = time.perf_counter() - t0
    if mt == "vit":
        p = model.config.patch_size
        Xs = [patches(img.to(torch.float64), p) for img in torch.as_tensor(inputs)]
        shown = [f"image {i}" for i in range(len(Xs))]
    else:
        texts = list(inputs) if texts is None else list(texts)
        Xs = text_inputs(model, tokenizer, texts, max_tokens)
        shown = [t if len(t) <= 80 else t[:77] + "..." for t in texts]
    if labels is not None and len(labels) != len(Xs):
        raise ValueError(f"{len(Xs)} inputs but {len(labels)} labels")
    it = range(len(Xs))
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(it, desc="certify", unit="input", dynamic_ncols=True)
    rows = []
    for i in it:
        X = Xs[i]
        y = int(labels[i]) if labels is not None else int(program.forward(X).argmax())
        rws = rows_of(perturb, X.shape[0], position)
        cert = certify_input(program, X, y, rws, network=network)
        if attack:
            attack_into(cert, program, X, rws)
        row = dict(index=i, input=shown[i], n_tokens=int(X.shape[0]),
                   position=-1 if rws is None else rws[0], perturbation=program.perturbation if perturb != "word"
                   else f"l2 on the word embedding at token {rws[0]}", label_source="given" if labels is not None
                   else "prediction", **summary_row(cert), attention_certificates=_attention_winners(cert.blocks))
        if not attack:
            row.update(attack_radius=math.nan, gap=math.nan, attack_seconds=math.nan)
        row["setup_seconds"] = prep_s if i == 0 else 0.0
        rows.append(row)
    return rows
