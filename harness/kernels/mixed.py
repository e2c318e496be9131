"""Mixed-precision Krylov: float64 results from float32 iterations (docs/math.md §4, "Mixed precision").

Most Lanczos products only find the direction of the top singular vector; float64 is needed for the last digits
and for the certificate. Both routines run thick-restart Lanczos (kernels.krylov) on a float32 copy of a float64
operator from a Gaussian start until the float32 tolerance MIXED_TOL, then continue in float64 from the float32
Ritz vector until the requested tolerance (a few float64 products):

- `lanczos_mixed(op, op32, x0, fail_prob, **opts)`: any pair of Gram operators (bounds.lofast's zeta and ||M_l||
  with mixed=True);
- `truth(X, w, causal, heads, ...)`: kernels.layer.truth with a certificate, the true local constant of the layer
  or of every head (analyze's input state with mixed=True).

Contract, float64 inputs. `value` is a Ritz value of the float64 operator whose relative Ritz residual met the
float64 tolerance: the float64 solver's own stopping test, so it means what a float64 run's value means.
`upper` is the float32 phase's Kuczynski-Wozniakowski estimate (its Gaussian start drawn before looking, its first
cycle at least min_steps products long) padded by MIXED_SLACK for float32 rounding, and never below `value`. Other
dtypes, and CUDA with TF32 matrix products allowed (whose rounding MIXED_SLACK does not cover), run the plain
solver.
"""
from __future__ import annotations

from typing import Optional

import torch

from harness.kernels import layer
from harness.kernels.krylov import CallableGram, lanczos
from harness.kernels.power import PowerResult
from harness.settings import CERT_DENSE_MAX, MIXED_SLACK, MIXED_TOL, truth_tol

Tensor = torch.Tensor


def applies(X: Tensor) -> bool:
    """Whether the mixed route runs for inputs like X: float64, and no TF32 rounding in the float32 phase."""
    if X.dtype != torch.float64:
        return False
    return not (X.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32)


def _padded(upper32: Optional[Tensor], value: Tensor) -> Optional[Tensor]:
    """The float32 KW estimate in float64, padded by MIXED_SLACK and never below the float64 value."""
    if upper32 is None:
        return None
    up = upper32.to(value.dtype) * (1 + MIXED_SLACK)
    return torch.where(torch.isfinite(up), torch.maximum(up, value), up)


def lanczos_mixed(op, op32, x0: Tensor, fail_prob: Optional[float], iters: int, tol: float, krylov: int,
                  min_steps: int = 1, check_every: int = 3):
    """float32 Lanczos on op32 from x0 (tol max(tol, MIXED_TOL); the KW estimate when fail_prob is given), then float64
    Lanczos on op from its Ritz vectors to tol. Returns (float64 LanczosResult with `upper` padded from the
    float32 run and `steps` counting both phases, float32 products)."""
    r32 = lanczos(op32, x0.to(torch.float32), fail_prob=fail_prob, iters=iters, tol=max(tol, MIXED_TOL),
                  krylov=krylov, min_steps=min_steps, check_every=check_every)
    r = lanczos(op, r32.vector.to(x0.dtype), iters=iters, tol=tol, krylov=krylov, min_steps=1,
                check_every=check_every)
    r.upper = _padded(r32.upper, r.value)
    r.steps = r.steps + r32.steps.to(r.steps.device)
    return r, r32.products


def _as32(w):
    """w (AttentionWeights or kernels.layer.BatchedWeights) in float32."""
    if isinstance(w, layer.BatchedWeights):
        return layer.BatchedWeights(*(None if t is None else t.to(torch.float32)
                                      for t in (w.wq, w.wk, w.wv, w.wo, w.bq, w.bk, w.bv, w.bo)))
    return w.to(dtype=torch.float32)


def truth(X: Tensor, w, causal: bool = False, heads: bool = False, tol: Optional[float] = None, iters: int = 2000,
          seed: int = 0, certify: Optional[dict] = None) -> PowerResult:
    """kernels.layer.truth(X, w, causal, heads, tol, iters, seed, certify) through the mixed route: the certified
    norm in float32 from kernels.layer.certified_norm's float64 Gaussian start rounded to float32 (the head reduction
    done once, in float64, so both phases see the same operator), then float64 Lanczos from its Ritz vector.
    certify=dict(steps=..., fail_prob=...) is required (the mixed route is for certified truths); where `applies(X)`
    is False this is kernels.layer.truth itself. `products` counts both phases."""
    if certify is None:
        raise ValueError("mixed.truth is the certified truth: pass certify=dict(steps=..., fail_prob=...)")
    if not applies(X):
        return layer.truth(X, w, causal, heads, tol, iters, seed, certify)
    tol = truth_tol(X.dtype) if tol is None else tol
    if heads:
        X, w = layer.reduced_heads(X, w)
    if X.shape[-2] * X.shape[-1] <= CERT_DENSE_MAX:  # small (reduced) layers: layer.truth's exact dense route
        return layer.truth(X, w, causal, False, tol, iters, seed, certify)
    batch, event = X.shape[:-2], X.shape[-2:]
    steps, fail_prob = int(certify["steps"]), float(certify["fail_prob"])
    x0 = layer.truth_start(X, w, seed, causal)  # kernels.layer.truth's certified start, in float64
    # products by kernels.route's rule (the maps while they fit, else streamed), as layer.truth's
    op = CallableGram(*layer.operator(X, w, causal)[:2], batch, event, x0)
    op32 = CallableGram(*layer.operator(X.to(torch.float32), _as32(w), causal)[:2], batch, event,
                        x0.to(torch.float32))
    r, products32 = lanczos_mixed(op, op32, x0, fail_prob, iters=iters, tol=tol, krylov=max(30, steps + 2),
                                  min_steps=steps)
    value = r.value.reshape(batch)
    return PowerResult(value, r.converged.reshape(batch), r.vector.reshape(X.shape), r.products + products32,
                       r.rel.reshape(batch), r.upper.reshape(batch), fail_prob, steps=r.steps.reshape(batch))
