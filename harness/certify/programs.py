"""Models as certificate programs: the chain of blocks from the perturbed input to the pooled representation,
plus the classifier's linear head (docs/math.md §6).

    BERT / MiniLM (post-LN)  word embeddings -> LayerNorm(x + position + type) -> per layer
                             LayerNorm(X + Attention(X)) -> LayerNorm(X + MLP(X)) -> [CLS] -> tanh pooler -> head
    DistilBERT (post-LN)     word embeddings -> LayerNorm(x + position) -> the same layers -> [CLS] ->
                             ReLU pre-classifier -> head
    ViT (pre-LN)             pixels as patches -> patch projection, [CLS], positions -> per layer
                             X + Attention(LN(X)), X + MLP(LN(X)) -> LayerNorm -> [CLS] -> head

The perturbed input is what a certificate's eps measures: the word-embedding rows (before position and type
embeddings are added: DeepT's and CROWN's setting) for text, the pixels for images. `Program.forward` equals the
model's logits (tested); every block is taken from the model's own modules, in float64.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List

import torch

from harness.certify.attention import Attention
from harness.certify.block import Block, Chain, Linear, Residual, SelectRow
from harness.certify.layernorm import LayerNorm
from harness.certify.mlp import MLP, Dense
from harness.models.adapters import adapter_for

Tensor = torch.Tensor


@dataclass
class Program:
    """chain: perturbed input (n, d_in) -> pooled representation (1, d'); logits = pooled W + b."""

    chain: Chain
    W: Tensor  # (d', C)
    b: Tensor  # (C,)
    kind: str
    perturbation: str  # what eps measures

    @property
    def fail_prob(self) -> float:
        """Failure probability of one input's certificate: the union bound over the certified Lanczos estimates of
        every attention block."""
        return sum(b.estimates * b.fail_prob for b in _leaves(self.chain) if isinstance(b, Attention))

    def forward(self, X: Tensor) -> Tensor:
        """Logits (..., C) at the perturbed input X (..., n, d_in)."""
        return (self.chain.forward(X) @ self.W + self.b)[..., 0, :]


def _leaves(b: Block) -> List[Block]:
    if isinstance(b, Chain):
        return [x for c in b.blocks for x in _leaves(c)]
    if isinstance(b, Residual):
        return _leaves(b.inner)
    return [b]


def _f64(t):
    return None if t is None else t.detach().to(torch.float64).clone()


def _ln(m, name: str, shift=None) -> LayerNorm:
    if m.weight is None:
        raise ValueError(f"{name}: a LayerNorm without elementwise affine weights is not supported")
    beta = m.bias if m.bias is not None else torch.zeros_like(m.weight)
    return LayerNorm(_f64(m.weight), _f64(beta), m.eps, shift, name=name)


def _linear(m):
    """nn.Linear -> (W (in, out), b) in float64 for row vectors."""
    return _f64(m.weight.T), _f64(m.bias)


class PatchEmbed(Block):
    """Pixels as non-overlapping patches (n_p, C p p) -> [CLS; patches W + b] + positions: change <= ||W|| r
    (the flattened patch matrix has the image's l2 norm, as stride = kernel)."""

    def __init__(self, conv, cls: Tensor, pos: Tensor):
        if tuple(conv.stride) != tuple(conv.kernel_size) or any(p != 0 for p in conv.padding):
            raise ValueError("ViT patch projection with overlapping patches or padding is not supported")
        self.lin = Linear(_f64(conv.weight.flatten(1).T), _f64(conv.bias))
        self.cls, self.pos, self.name = _f64(cls).reshape(1, -1), _f64(pos).reshape(-1, self.lin.W.shape[1]), "patches"

    def forward(self, X: Tensor) -> Tensor:
        cls = self.cls.expand(*X.shape[:-2], 1, self.cls.shape[-1])
        return torch.cat([cls, self.lin.forward(X)], dim=-2) + self.pos[: X.shape[-2] + 1]

    def change(self, prep, r: float, rows):
        out = None if rows is None else tuple(i + 1 for i in rows)
        return self.lin.norm * r, out, "spectral norm"

    def jacobian(self, prep, r: float, rows):
        return self.lin.norm, 0.0


def patches(pixels: Tensor, p: int) -> Tensor:
    """(C, H, W) -> (n_p, C p p) in the order of Conv2d(kernel = stride = p) flattened row-major."""
    C, H, W = pixels.shape
    x = pixels.reshape(C, H // p, p, W // p, p).permute(1, 3, 0, 2, 4)
    return x.reshape((H // p) * (W // p), C * p * p)


def _act(config, attr: str) -> str:
    return str(getattr(config, attr))


def text_program(model, names=None) -> Program:
    """A BERT-family or DistilBERT sequence classifier as a Program over its word embeddings."""
    cfg = model.config
    mt = cfg.model_type
    adapter = adapter_for(model)
    if getattr(cfg, "position_embedding_type", "absolute") != "absolute":
        raise ValueError(f"position_embedding_type {cfg.position_embedding_type!r}: only absolute positions are "
                         "supported")
    blocks: List[Block] = []
    if mt == "bert":
        emb = model.bert.embeddings
        shift = _f64(emb.position_embeddings.weight) + _f64(emb.token_type_embeddings.weight[0])
        blocks.append(_ln(emb.LayerNorm, "embeddings.LayerNorm", shift))
        for i, L in enumerate(model.bert.encoder.layer):
            w = adapter.weights(L.attention.self, torch.float64)
            blocks += [Attention(w, residual=True, names=names, name=f"layer{i}.attention"),
                       _ln(L.attention.output.LayerNorm, f"layer{i}.attention.LayerNorm"),
                       MLP(*_linear(L.intermediate.dense), *_linear(L.output.dense), _act(cfg, "hidden_act"),
                           residual=True, name=f"layer{i}.mlp"),
                       _ln(L.output.LayerNorm, f"layer{i}.output.LayerNorm")]
        if model.bert.pooler is None:
            raise ValueError("a BERT classifier without its pooler is not supported")
        blocks += [SelectRow(0), Dense(*_linear(model.bert.pooler.dense), "tanh", name="pooler")]
    elif mt == "distilbert":
        emb = model.distilbert.embeddings
        blocks.append(_ln(emb.LayerNorm, "embeddings.LayerNorm", _f64(emb.position_embeddings.weight)))
        for i, L in enumerate(model.distilbert.transformer.layer):
            w = adapter.weights(L.attention, torch.float64)
            blocks += [Attention(w, residual=True, names=names, name=f"layer{i}.attention"),
                       _ln(L.sa_layer_norm, f"layer{i}.sa_layer_norm"),
                       MLP(*_linear(L.ffn.lin1), *_linear(L.ffn.lin2), _act(cfg, "activation"), residual=True,
                           name=f"layer{i}.ffn"),
                       _ln(L.output_layer_norm, f"layer{i}.output_layer_norm")]
        blocks += [SelectRow(0), Dense(*_linear(model.pre_classifier), "relu", name="pre_classifier")]
    else:
        raise ValueError(f"model_type {mt!r}: certify supports bert (BERT, MiniLM), distilbert and vit classifiers")
    W, b = _linear(model.classifier)
    return Program(Chain(blocks, "model"), W, b, mt, "l2 on word embeddings")


def vit_program(model, names=None) -> Program:
    """A ViT image classifier as a Program over its pixels (as patches)."""
    adapter = adapter_for(model)
    vit = model.vit
    emb = vit.embeddings
    blocks: List[Block] = [PatchEmbed(emb.patch_embeddings.projection, emb.cls_token, emb.position_embeddings)]
    layers = vit.layers if hasattr(vit, "layers") else vit.encoder.layer
    act = _act(model.config, "hidden_act")
    for i, L in enumerate(layers):
        w = adapter.weights(L.attention, torch.float64)
        mlp = L.mlp if hasattr(L, "mlp") else None
        fc1, fc2 = (mlp.fc1, mlp.fc2) if mlp is not None else (L.intermediate.dense, L.output.dense)
        blocks += [Residual(Chain([_ln(L.layernorm_before, f"layer{i}.layernorm_before"),
                                   Attention(w, names=names, name=f"layer{i}.attention")]), f"layer{i}.attention"),
                   Residual(Chain([_ln(L.layernorm_after, f"layer{i}.layernorm_after"),
                                   MLP(*_linear(fc1), *_linear(fc2), act, name=f"layer{i}.mlp")]), f"layer{i}.mlp")]
    blocks += [_ln(vit.layernorm, "layernorm"), SelectRow(0)]
    W, b = _linear(model.classifier)
    return Program(Chain(blocks, "model"), W, b, "vit",
                   "l2 on the normalized pixels ((x - 0.5) / 0.5: half of it in [0, 1] pixel units)")


def program_for(model, names=None) -> Program:
    mt = getattr(getattr(model, "config", None), "model_type", None)
    if mt == "vit":
        return vit_program(model, names)
    if mt in ("bert", "distilbert"):
        return text_program(model, names)
    raise ValueError(f"certify supports Hugging Face bert (BERT, MiniLM), distilbert and vit classifiers; got "
                     f"{type(model).__name__}" + (f" (model_type {mt!r})" if mt else ""))
