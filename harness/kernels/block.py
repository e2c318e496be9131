"""The post-LayerNorm attention block BERT runs (Hugging Face `BertAttention`), F(X) = LN(X + attn(X)), and the
norm of its Jacobian: the map Castin et al. measured on real data (residual and LayerNorm included).

attn(X) = sum_l P_l(X) (X wv_l + bv_l) wo_l + bo (kernels.attention with biases), LN the last-axis LayerNorm with
weight/bias/eps as the model has them. The Jacobian is applied through torch.func.jvp / vjp (jvp redoes the
cheap forward pass; torch.func.linearize's tracing costs more at these sizes), batched over leading dims (the
map acts per sequence, so J is block diagonal and Lanczos runs per sequence). Pure torch: device and dtype
follow the inputs.

Public: block_map, block_operator, block_lipschitz (||J_F(X)|| per sequence), block_paper_value (the authors'
estimator sqrt(||J^T F(X)||) on this map).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from harness.settings import ITERS, truth_tol

from .attention import AttentionWeights, attention_unchecked, check_input
from .power import PowerResult, top_singular_value

Tensor = torch.Tensor


def block_map(w: AttentionWeights, ln_weight: Tensor, ln_bias: Tensor, eps: float,
              causal: bool = False) -> Callable[[Tensor], Tensor]:
    """F(X) = LayerNorm(X + attn(X)) on (..., n, d); ln_weight/ln_bias (d,)."""
    def F(X: Tensor) -> Tensor:
        Y = X + attention_unchecked(X, w, residual=False, causal=causal)
        return torch.nn.functional.layer_norm(Y, (Y.shape[-1],), ln_weight, ln_bias, eps)

    return F


def block_operator(F: Callable[[Tensor], Tensor], X: Tensor):
    """(F(X), matvec, rmatvec) of J_F(X), each (..., n, d) -> (..., n, d)."""
    X = X.detach()
    FX, vjp_fn = torch.func.vjp(F, X)
    return FX, (lambda U: torch.func.jvp(F, (X,), (U,))[1]), (lambda G: vjp_fn(G)[0])


def block_lipschitz(F: Callable[[Tensor], Tensor], X: Tensor, d: int, tol: Optional[float] = None,
                    iters: int = ITERS, seed: int = 0, v0: Optional[Tensor] = None, operator=None) -> PowerResult:
    """||J_F(X)|| per sequence of X (..., n, d): Lanczos on J^T J (PowerResult, values (...,)); non-convergence is
    not raised (read `.converged`). tol=None: harness.settings.truth_tol (the truth's tolerance). operator: block_operator(F, X)
    when the caller already has it (one forward pass serves the norm, the paper's value and F(X))."""
    check_input(X, d)
    if tol is None:
        tol = truth_tol(X.dtype)
    _, matvec, rmatvec = operator if operator is not None else block_operator(F, X)
    if v0 is None:
        g = torch.Generator(device=X.device).manual_seed(seed)
        v0 = torch.randn(X.shape, dtype=X.dtype, device=X.device, generator=g)
    return top_singular_value(matvec, rmatvec, v0, event_dims=2, iters=iters, tol=tol,
                              on_nonconvergence="ignore")


def block_paper_value(F: Callable[[Tensor], Tensor], X: Tensor, operator=None) -> Tensor:
    """The authors' estimator on this map: sqrt(||J_F(X)^T F(X)||_F) per sequence (their `jvp(...)[0]` is F(X)).
    operator: block_operator(F, X) when the caller already has it."""
    FX, _, rmatvec = operator if operator is not None else block_operator(F, X)
    return rmatvec(FX).flatten(-2).norm(dim=-1).sqrt()
