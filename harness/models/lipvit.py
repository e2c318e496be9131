"""Certifiable transformers for LoFAST §5.2 / App. C.3: LayerProject (eq. 24), 1-Lipschitz layers, ||W^V||, ||W^O|| <= c.

Parametrization (our choice, the LoFAST paper leaves it open):
- Linear maps (patch embedding, W^Q, W^K, W^V, W^O, classifier head) use *exact* spectral normalization
  W = c V / sigma_max(V) with sigma_max from torch.linalg.matrix_norm(ord=2) (an SVD of a <= 196 x 64 matrix
  per step, cheap at these sizes). Unlike power-iteration spectral normalization (Miyato et al.) the
  constraint ||W|| = c holds exactly at every step, so the certificate never relies on an estimate that can
  undershoot; unlike the orthogonal parametrization it allows any singular spectrum below c.
- Feed-forward layers are SLL residual layers (Araujo et al. 2023, Thm 3), as in the paper:
  h(x) = x - 2 relu(x W + b) T^{-1} W^T with T = diag_i(sum_j |W^T W|_ij q_j / q_i): 1-Lipschitz for any W, q.
- Blocks: Z = LayerProject(X, 1) row-wise, X = Z + sum_l P_l(Z) Z VO_l (residual attention, H = I, no biases),
  X = LayerProject(X, sqrt(d)) (LayerNorm's place), X = SLL(X). Taking the residual after the projection makes
  each block a 1-Lipschitz map followed by eq. (3) with H = I, so Theorem 1 with zeta (residual) applies.
- Head: LayerProject(sqrt(d)), mean over tokens (||.||_F -> ||.||_2 Lipschitz 1/sqrt(n)), spectral-normalized
  linear map (norm 1).
"""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch
from torch import nn

from harness.kernels.attention import AttentionWeights, attention_unchecked

Tensor = torch.Tensor


def layer_project(x: Tensor, R: float) -> Tensor:
    """LayerProject(x, R) = x R / ||x|| if ||x|| > R else x, row-wise on the last axis (LoFAST eq. 24)."""
    if R <= 0:
        raise ValueError(f"LayerProject radius R must be > 0, got {R}")
    nrm = x.norm(dim=-1, keepdim=True)  # (..., n, 1)
    return x * torch.clamp(R / nrm.clamp_min(torch.finfo(x.dtype).tiny), max=1.0)


class LayerProject(nn.Module):
    """Projection of each token onto the ball of radius R (eq. 24): 1-Lipschitz in Frobenius norm."""

    def __init__(self, R: float):
        super().__init__()
        if R <= 0:
            raise ValueError(f"LayerProject radius R must be > 0, got {R}")
        self.R = float(R)

    def forward(self, x: Tensor) -> Tensor:
        return layer_project(x, self.R)


class SpectralLinear(nn.Module):
    """x -> x W (+ b) with W = c V / sigma_max(V): ||W|| = c exactly (exact spectral normalization)."""

    def __init__(self, din: int, dout: int, c: float = 1.0, bias: bool = False):
        super().__init__()
        if c <= 0:
            raise ValueError(f"spectral norm target c must be > 0, got {c}")
        self.c = float(c)
        self.V = nn.Parameter(torch.randn(din, dout) / math.sqrt(din))
        self.b = nn.Parameter(torch.zeros(dout)) if bias else None

    def weight(self) -> Tensor:
        """W = c V / ||V||: (din, dout)."""
        return self.V * (self.c / torch.linalg.matrix_norm(self.V, ord=2))

    def forward(self, x: Tensor) -> Tensor:
        y = x @ self.weight()
        return y if self.b is None else y + self.b


class SLL(nn.Module):
    """SDP-based Lipschitz residual layer (Araujo et al. 2023, Thm 3): x - 2 relu(x W + b) T^{-1} W^T, 1-Lipschitz."""

    def __init__(self, d: int, k: int):
        super().__init__()
        self.W = nn.Parameter(torch.randn(d, k) * math.sqrt(2.0 / (d + k)))
        self.b = nn.Parameter(torch.zeros(k))
        self.log_q = nn.Parameter(torch.zeros(k))

    def t(self) -> Tensor:
        """T_ii = sum_j |W^T W|_ij q_j / q_i: (k,)."""
        q = self.log_q.exp()
        G = (self.W.T @ self.W).abs()  # (k, k)
        return (G * q[None, :]).sum(-1) / q

    def forward(self, x: Tensor) -> Tensor:  # (..., d) -> (..., d)
        return x - 2.0 * (torch.relu(x @ self.W + self.b) / self.t()) @ self.W.T


class LipAttention(nn.Module):
    """Residual multi-head attention F(Z) = Z + sum_l P_l(Z) Z VO_l, ||W^Q||, ||W^K|| <= qk_norm, ||W^V||, ||W^O|| <= c."""

    def __init__(self, d: int, heads: int, vo_norm: float, qk_norm: float = 1.0):
        super().__init__()
        if d % heads != 0:
            raise ValueError(f"d = {d} is not divisible by heads = {heads}")
        self.heads = heads
        self.q = SpectralLinear(d, d, qk_norm)
        self.k = SpectralLinear(d, d, qk_norm)
        self.v = SpectralLinear(d, d, vo_norm)
        self.o = SpectralLinear(d, d, vo_norm)

    def weights(self) -> AttentionWeights:
        """The layer as AttentionWeights (no biases), for harness.bounds.lofast."""
        return AttentionWeights.from_dense(self.q.weight(), self.k.weight(), self.v.weight(), self.o.weight(),
                                           self.heads)

    def forward(self, Z: Tensor) -> Tensor:
        return attention_unchecked(Z, self.weights(), residual=True)


class LipBlock(nn.Module):
    """LayerProject(1) -> residual attention -> LayerProject(sqrt d) -> SLL feed-forward."""

    def __init__(self, d: int, heads: int, vo_norm: float, ffn_mult: int = 2, qk_norm: float = 1.0):
        super().__init__()
        self.pre = LayerProject(1.0)
        self.attn = LipAttention(d, heads, vo_norm, qk_norm)
        self.mid = LayerProject(math.sqrt(d))
        self.ffn = SLL(d, ffn_mult * d)

    def forward(self, X: Tensor, record: Optional[List[Tensor]] = None) -> Tensor:
        Z = self.pre(X)  # (B, n, d), rows in the unit ball
        if record is not None:
            record.append(Z)
        return self.ffn(self.mid(self.attn(Z)))


class LipTransformer(nn.Module):
    """Token trunk shared by LipViT and LipText: blocks, LayerProject(sqrt d), mean pool, 1-Lipschitz head."""

    def __init__(self, n: int, d: int, depth: int, heads: int, vo_norm: float, classes: int,
                 ffn_mult: int = 2, qk_norm: float = 1.0):
        super().__init__()
        for name, v in (("n", n), ("d", d), ("depth", depth), ("heads", heads), ("classes", classes)):
            if int(v) < 1:
                raise ValueError(f"{name} must be >= 1, got {v}")
        if not 0 < vo_norm:
            raise ValueError(f"vo_norm must be > 0, got {vo_norm}")
        self.n, self.d = n, d
        self.pos = nn.Parameter(torch.zeros(n, d))
        self.blocks = nn.ModuleList([LipBlock(d, heads, vo_norm, ffn_mult, qk_norm) for _ in range(depth)])
        self.final = LayerProject(math.sqrt(d))
        self.head = SpectralLinear(d, classes, 1.0, bias=True)

    def forward_tokens(self, X: Tensor, record: Optional[List[Tensor]] = None) -> Tensor:
        """Logits from the stem output X (B, n, d) (positional embedding already added); records block inputs Z."""
        for blk in self.blocks:
            X = blk(X, record)
        return self.head(self.final(X).mean(dim=-2))  # (B, classes)

    def attention_weights(self) -> List[AttentionWeights]:
        return [blk.attn.weights() for blk in self.blocks]

    def head_lipschitz(self) -> float:
        """Lipschitz constant of X (Frobenius) -> logits (l2): ||W_head|| / sqrt(n) (mean pool)."""
        W = self.head.weight().detach().double()
        return float(torch.linalg.matrix_norm(W, ord=2)) / math.sqrt(self.n)

    def forward(self, u: Tensor) -> Tensor:
        return self.forward_tokens(self.stem(u))


class LipViT(LipTransformer):
    """Certifiable ViT: non-overlapping patches, 1-Lipschitz patch embedding, LipTransformer trunk."""

    def __init__(self, image_size: int = 28, patch: int = 7, channels: int = 1, d: int = 64, depth: int = 2,
                 heads: int = 4, vo_norm: float = 0.5, classes: int = 10, ffn_mult: int = 2, qk_norm: float = 1.0,
                 embed_norm: float = 1.0):
        if image_size % patch != 0:
            raise ValueError(f"image_size {image_size} is not divisible by patch {patch}")
        n = (image_size // patch) ** 2
        super().__init__(n, d, depth, heads, vo_norm, classes, ffn_mult, qk_norm)
        self.image_size, self.patch, self.channels = image_size, patch, channels
        self.embed = SpectralLinear(channels * patch * patch, d, embed_norm, bias=True)  # ||W_e|| = embed_norm <= 1

    def patches(self, x: Tensor) -> Tensor:
        """(B, C, H, W) -> (B, n, C p p), disjoint patches (so the l2 image norm equals the Frobenius norm)."""
        if x.dim() != 4 or x.shape[1] != self.channels or x.shape[-1] != self.image_size or x.shape[-2] != self.image_size:
            raise ValueError(f"expected images (B, {self.channels}, {self.image_size}, {self.image_size}), "
                             f"got {tuple(x.shape)}")
        p = self.patch
        B, C, H, W = x.shape
        x = x.reshape(B, C, H // p, p, W // p, p).permute(0, 2, 4, 1, 3, 5)
        return x.reshape(B, (H // p) * (W // p), C * p * p)

    def stem(self, x: Tensor) -> Tensor:
        """Tokens X0 = patches W_e + b_e + pos: (B, n, d)."""
        return self.embed(self.patches(x)) + self.pos

    def stem_lipschitz(self) -> float:
        """Lipschitz constant image (l2) -> X0 (Frobenius): ||W_e|| (exact, float64)."""
        return float(torch.linalg.matrix_norm(self.embed.weight().detach().double(), ord=2))


class LipText(LipTransformer):
    """Certifiable text classifier: perturbations act on the word embeddings E (B, n, d), rows of norm 1;
    X0 = embed_scale E + pos, so L_in = embed_scale (the role of ||W_e|| in LipViT)."""

    def __init__(self, vocab: int, n: int = 32, d: int = 64, depth: int = 3, heads: int = 4, vo_norm: float = 0.5,
                 classes: int = 2, ffn_mult: int = 2, qk_norm: float = 1.0, embed_scale: float = 1.0):
        super().__init__(n, d, depth, heads, vo_norm, classes, ffn_mult, qk_norm)
        if embed_scale <= 0:
            raise ValueError(f"embed_scale must be > 0, got {embed_scale}")
        self.embed_scale = float(embed_scale)
        self.emb = nn.Embedding(vocab, d)

    def embed_ids(self, ids: Tensor) -> Tensor:
        """Word embeddings E with unit-norm rows: (B, n) -> (B, n, d), the perturbed quantity."""
        if ids.dim() != 2 or ids.shape[1] != self.n:
            raise ValueError(f"expected token ids (B, {self.n}), got {tuple(ids.shape)}")
        E = self.emb(ids)
        return E / E.norm(dim=-1, keepdim=True).clamp_min(1e-12)

    def stem(self, E: Tensor) -> Tensor:
        return self.embed_scale * E + self.pos

    def stem_lipschitz(self) -> float:
        return self.embed_scale


def block_inputs(model: LipTransformer, u: Tensor) -> Tuple[Tensor, List[Tensor]]:
    """Logits and the attention inputs Z_k (B, n, d) of every block for stem input u."""
    rec: List[Tensor] = []
    logits = model.forward_tokens(model.stem(u), rec)
    return logits, rec
