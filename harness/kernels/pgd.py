"""Projected gradient ascent on an l2 (Frobenius) ball, batched with restarts: lower bounds (docs/math.md §1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Union

import torch

from harness.kernels.linalg import all_finite
from harness.settings import PGD_RESTARTS, PGD_STEPS, RANDOM_SEARCH_SAMPLES

Tensor = torch.Tensor


@dataclass
class PGDResult:
    value: Tensor  # (*batch,) best objective found (a lower bound on the max over the ball)
    X: Tensor  # (*batch, *event) the maximizer found
    delta: Tensor  # (*batch, *event) X - X0, ||delta||_F <= eps


def _flat_norm(t: Tensor, event_dims: int) -> Tensor:
    return t.flatten(start_dim=t.dim() - event_dims).norm(dim=-1)


def _bc(s: Tensor, event_dims: int) -> Tensor:
    return s.reshape(*s.shape, *([1] * event_dims))


def project_ball(delta: Tensor, eps: Tensor, event_dims: int) -> Tensor:
    """Project each delta onto {||delta||_F <= eps}: (*batch, *event), eps (*batch,)."""
    nrm = _flat_norm(delta, event_dims)
    scale = torch.where(nrm > eps, eps / nrm.clamp_min(torch.finfo(delta.dtype).tiny), torch.ones_like(nrm))
    return delta * _bc(scale, event_dims)


def pgd_maximize(objective: Callable[[Tensor], Tensor], X0: Tensor, eps: Union[float, Tensor],
                 steps: int = PGD_STEPS, restarts: int = PGD_RESTARTS, step_size: Optional[float] = None,
                 batch_dims: Optional[int] = None, seed: int = 0, include_center: bool = True) -> PGDResult:
    """Maximize objective(X) over ||X - X0||_F <= eps by normalized-gradient ascent with projection.

    objective: (*batch, *event) -> (*batch,), each batch element independent. eps: scalar or (*batch,).
    Restarts start uniformly on the sphere of radius eps (plus one at X0 if include_center); the best value
    over all iterates and restarts is kept, so the result is a valid lower bound of the maximum.
    Step size defaults to 2.5 eps / steps (Madry et al.'s rule of thumb).
    """
    if batch_dims is None:
        batch_dims = max(X0.dim() - 2, 0)
    event_dims = X0.dim() - batch_dims
    batch_shape = X0.shape[:batch_dims]
    eps_t = torch.as_tensor(eps, dtype=X0.dtype, device=X0.device)
    if (eps_t < 0).any() or not all_finite(eps_t):
        raise ValueError(f"eps must be finite and >= 0, got {eps}")
    if steps < 0 or restarts < 1:
        raise ValueError(f"need steps >= 0 and restarts >= 1, got steps={steps}, restarts={restarts}")
    eps_t = eps_t.expand(batch_shape).contiguous()
    X0 = X0.detach()
    g = torch.Generator(device=X0.device)
    g.manual_seed(seed)
    alpha = eps_t * (2.5 / max(steps, 1)) if step_size is None else torch.full_like(eps_t, step_size)

    best_val = torch.full(batch_shape, float("-inf"), dtype=X0.dtype, device=X0.device)
    best_delta = torch.zeros_like(X0)

    def consider(delta, val):
        nonlocal best_val, best_delta
        better = val > best_val
        best_val = torch.where(better, val, best_val)
        best_delta = torch.where(_bc(better, event_dims), delta, best_delta)

    starts = restarts
    for r in range(starts):
        if r == 0 and include_center:
            delta = torch.zeros_like(X0)
            # a zero start has a well-defined gradient direction only if the objective is smooth; add a tiny
            # random nudge so ascent can leave the centre of symmetric objectives.
            delta = project_ball(1e-3 * eps_t.reshape(*batch_shape, *([1] * event_dims)) *
                                 torch.randn(X0.shape, dtype=X0.dtype, device=X0.device, generator=g),
                                 eps_t, event_dims)
        else:
            u = torch.randn(X0.shape, dtype=X0.dtype, device=X0.device, generator=g)
            delta = u / _bc(_flat_norm(u, event_dims).clamp_min(1e-30), event_dims) * _bc(eps_t, event_dims)
        for _ in range(steps):
            delta = delta.detach().requires_grad_(True)
            with torch.enable_grad():
                val = objective(X0 + delta)
                (grad,) = torch.autograd.grad(val.sum(), delta)
            consider(delta.detach(), val.detach())
            gn = _bc(_flat_norm(grad, event_dims).clamp_min(1e-30), event_dims)
            delta = project_ball(delta.detach() + _bc(alpha, event_dims) * grad / gn, eps_t, event_dims)
        with torch.no_grad():
            consider(delta.detach(), objective(X0 + delta).detach())
    return PGDResult(best_val, X0 + best_delta, best_delta)


def random_search_maximize(objective: Callable[[Tensor], Tensor], X0: Tensor, eps: Union[float, Tensor],
                           samples: int = RANDOM_SEARCH_SAMPLES, batch_dims: Optional[int] = None,
                           seed: int = 0) -> Tensor:
    """Best objective over random points on the eps-sphere around X0 (a sampled lower bound): (*batch,)."""
    if batch_dims is None:
        batch_dims = max(X0.dim() - 2, 0)
    event_dims = X0.dim() - batch_dims
    eps_t = torch.as_tensor(eps, dtype=X0.dtype, device=X0.device).expand(X0.shape[:batch_dims])
    g = torch.Generator(device=X0.device)
    g.manual_seed(seed)
    best = torch.full(X0.shape[:batch_dims], float("-inf"), dtype=X0.dtype, device=X0.device)
    with torch.no_grad():
        for _ in range(samples):
            u = torch.randn(X0.shape, dtype=X0.dtype, device=X0.device, generator=g)
            u = u / _bc(_flat_norm(u, event_dims).clamp_min(1e-30), event_dims) * _bc(eps_t, event_dims)
            best = torch.maximum(best, objective(X0 + u))
    return best
