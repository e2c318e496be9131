"""A small standard pre-LN ViT whose self-attention is exactly harness.kernels.attention (row vectors,
x -> x W; heads contiguous on the projection axis).

Patch embedding (linear on flattened p x p patches), cls token, learned position embeddings, L blocks
x = x + MHSA(LN(x)); x = x + MLP(LN(x)), final LN, linear head on the cls token. Each block's attention holds
dense Wq, Wk, Wv (d, d) and Wo (d, d) in the x -> x W convention (heads contiguous on the output axis), so
`attention_weights()` is AttentionWeights.from_dense(...) with no reshuffling; X (the attention input) is
the LN output. Fashion-MNIST 28x28 with patch 7 -> 16 tokens + cls; CIFAR 32x32 with patch 8 -> 16 + cls.
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from torch import nn

from harness.kernels.attention import AttentionWeights, attention_and_probs

Tensor = torch.Tensor


def attend(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tuple[Tensor, Tensor]:
    """(F(X), P): the kernels' attention output (..., n, d) and probabilities (..., h, n, n) in one pass.

    Same formula as harness.kernels.attention.attention_unchecked (tested equal), sharing P.
    """
    return attention_and_probs(X, w, causal=causal)


class MHSA(nn.Module):
    """Multi-head self-attention with dense Wq, Wk, Wv, Wo (x W convention); optional biases."""

    def __init__(self, d: int, heads: int, qkv_bias: bool = False, proj_bias: bool = True):
        super().__init__()
        if d % heads != 0:
            raise ValueError(f"d = {d} is not divisible by heads = {heads}")
        self.d, self.heads = d, heads
        s = 1 / math.sqrt(d)
        self.Wq, self.Wk, self.Wv, self.Wo = (nn.Parameter(torch.randn(d, d) * s) for _ in range(4))
        self.bq, self.bk, self.bv = ((nn.Parameter(torch.zeros(d)) if qkv_bias else None) for _ in range(3))
        self.bo = nn.Parameter(torch.zeros(d)) if proj_bias else None

    def attention_weights(self, with_bo: bool = True) -> AttentionWeights:
        """Per-head AttentionWeights (differentiable views of the parameters). with_bo=False drops the output
        bias (a constant shift: no Jacobian changes) for bounds that refuse biases."""
        return AttentionWeights.from_dense(self.Wq, self.Wk, self.Wv, self.Wo, self.heads,
                                           self.bq, self.bk, self.bv, self.bo if with_bo else None)

    def forward(self, X: Tensor) -> Tuple[Tensor, Tensor]:
        """(F(X) (B, n, d), P (B, h, n, n))."""
        return attend(X, self.attention_weights())


class Block(nn.Module):
    """Pre-LN transformer block: x + MHSA(LN1 x), then x + MLP(LN2 x)."""

    def __init__(self, d: int, heads: int, mlp_ratio: float = 2.0, qkv_bias: bool = False, ln_eps: float = 1e-5):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d, eps=ln_eps), nn.LayerNorm(d, eps=ln_eps)
        self.attn = MHSA(d, heads, qkv_bias=qkv_bias)
        hidden = int(round(d * mlp_ratio))
        self.mlp = nn.Sequential(nn.Linear(d, hidden), nn.GELU(), nn.Linear(hidden, d))

    def attention_weights(self, with_bo: bool = True) -> AttentionWeights:
        return self.attn.attention_weights(with_bo)

    def forward(self, x: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """(x_out (B, n, d), P (B, h, n, n), X = LN1 x (B, n, d))."""
        X = self.ln1(x)
        a, P = self.attn(X)
        x = x + a
        x = x + self.mlp(self.ln2(x))
        return x, P, X


class ViT(nn.Module):
    """Small pre-LN ViT. forward(x) -> logits (B, classes); forward(x, return_attn=True) ->
    (logits, [P_l (B, h, n, n)], [X_l (B, n, d)]) with X_l the exact attention input of block l.
    ln_eps: every LayerNorm's eps (torch's 1e-5 by default; 1e-12 for Hugging Face ViTs, harness.models.vit_import)."""

    def __init__(self, image_size: int = 28, patch: int = 7, in_chans: int = 1, n_classes: int = 10, d: int = 64,
                 depth: int = 4, heads: int = 4, mlp_ratio: float = 2.0, qkv_bias: bool = False,
                 ln_eps: float = 1e-5):
        super().__init__()
        if image_size % patch != 0:
            raise ValueError(f"image_size = {image_size} is not divisible by patch = {patch}")
        if depth < 1:
            raise ValueError(f"depth must be >= 1, got {depth}")
        self.config = dict(image_size=image_size, patch=patch, in_chans=in_chans, n_classes=n_classes, d=d,
                           depth=depth, heads=heads, mlp_ratio=mlp_ratio, qkv_bias=qkv_bias, ln_eps=ln_eps)
        self.patch = patch
        self.n_patches = (image_size // patch) ** 2
        self.n_tokens = self.n_patches + 1
        self.embed = nn.Linear(in_chans * patch * patch, d)
        self.cls = nn.Parameter(torch.zeros(1, 1, d))
        self.pos = nn.Parameter(torch.randn(1, self.n_tokens, d) * 0.02)
        self.blocks = nn.ModuleList(Block(d, heads, mlp_ratio, qkv_bias, ln_eps) for _ in range(depth))
        self.norm = nn.LayerNorm(d, eps=ln_eps)
        self.head = nn.Linear(d, n_classes)

    @classmethod
    def from_config(cls, config: dict) -> "ViT":
        """The ViT of a `config` dict (configs saved before ln_eps existed get the default 1e-5)."""
        return cls(**config)

    def patches(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, n_patches, C p p), row-major patch order."""
        if x.dim() != 4:
            raise ValueError(f"images must be (B, C, H, W), got shape {tuple(x.shape)}")
        B, C, H, W = x.shape
        p = self.patch
        hf_config = self.config
        if C != hf_config["in_chans"] or H != hf_config["image_size"] or W != hf_config["image_size"]:
            raise ValueError(f"images of shape {(C, H, W)} do not match the ViT "
                             f"({hf_config['in_chans']}, {hf_config['image_size']}, {hf_config['image_size']})")
        x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)  # (B, H/p, W/p, C, p, p)
        return x.reshape(B, (H // p) * (W // p), C * p * p)

    def tokens(self, x: Tensor) -> Tensor:
        """Embedded tokens entering block 0: (B, C, H, W) -> (B, n, d) with cls first."""
        e = self.embed(self.patches(x))  # (B, n_patches, d)
        cls = self.cls.expand(e.shape[0], -1, -1)
        return torch.cat([cls, e], dim=1) + self.pos

    def forward_tokens(self, z: Tensor, return_attn: bool = False):
        """Blocks + head on embedded tokens z (B, n, d) (the part JaSMin's Fig. 4 differentiates)."""
        Ps: List[Tensor] = []
        Xs: List[Tensor] = []
        for blk in self.blocks:
            z, P, X = blk(z)
            if return_attn:
                Ps.append(P)
                Xs.append(X)
        logits = self.head(self.norm(z)[:, 0])  # (B, classes)
        return (logits, Ps, Xs) if return_attn else logits

    def forward(self, x: Tensor, return_attn: bool = False):
        return self.forward_tokens(self.tokens(x), return_attn)

    def attention_weights(self, layer: int, with_bo: bool = True, dtype=None) -> AttentionWeights:
        """AttentionWeights of block `layer`: differentiable views of the parameters, or, with dtype given
        (e.g. torch.float64 for analysis), detached copies in that dtype."""
        if not -len(self.blocks) <= layer < len(self.blocks):
            raise ValueError(f"layer {layer} out of range: the ViT has {len(self.blocks)} blocks")
        w = self.blocks[layer].attention_weights(with_bo)
        if dtype is None:
            return w
        with torch.no_grad():
            return AttentionWeights(*[None if t is None else t.detach().to(dtype).clone()
                                      for t in (w.wq, w.wk, w.wv, w.wo, w.bq, w.bk, w.bv, w.bo)])

    def attention_inputs(self, x: Tensor, layers: Optional[List[int]] = None, dtype=None) -> dict:
        """{layer: X (B, n, d)} exact attention inputs for images x, without gradients (cast to dtype if given)."""
        with torch.no_grad():
            _, _, Xs = self.forward(x, return_attn=True)
        layers = range(len(Xs)) if layers is None else layers
        return {l: Xs[l] if dtype is None else Xs[l].to(dtype) for l in layers}


def vit_for(dataset_shape: Tuple[int, int, int], n_classes: int, **kw) -> ViT:
    """A ViT sized for (C, H, W) images: patch 7 for 28x28, 8 for 32x32, 2 for 8x8 (16 patches + cls)."""
    C, H, W = dataset_shape
    if H != W:
        raise ValueError(f"square images expected, got {H}x{W}")
    patch = kw.pop("patch", None) or {28: 7, 32: 8, 8: 2}.get(H) or max(1, H // 4)
    return ViT(image_size=H, patch=patch, in_chans=C, n_classes=n_classes, **kw)
