"""The Jacobian of one multi-head attention layer as a batched matrix-free operator, and its norm (docs/math.md §3).

The measured map is the self-attention layer itself, F(X) = sum_l P_l(X) (X wv_l + bv_l) wo_l + bo (biases as
the weights have them, no residual, no LayerNorm), causally masked when `causal`. Its differential (Lemma C.2
with biases, Castin App. E.3) at X (..., n, d), with q = X wq + bq, k = X wk + bk, v = X wv + bv per head:
    dS = (dX wq k^T + q (dX wk)^T) / sqrt(dh),   dP = P * (dS - rowsum(P * dS)),
    dF = sum_l (dP_l v_l + P_l dX wv_l) wo_l.
`layer_operator` applies it and its adjoint with the forward quantities computed once, about half the cost of
torch.func.jvp/vjp (which recompute the forward pass); tests check it against kernels.power.dense_jacobian.
Pure torch: device and dtype follow the inputs.

Public: layer_operator, layer_map, truth (THE true local Lipschitz constant of a layer or of each head, what the
registry, `attnlip analyze` and the Castin experiments report), lipschitz (||J_F(X)|| per sequence), certified_norm
(Lanczos with a Kuczynski-Wozniakowski upper estimate), reduced_heads, paper_value (the paper code's estimator),
warm_start (start vectors across sequence lengths), stack_heads (one head per batch element).
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

import torch

from harness.settings import (CERT_DENSE_MAX, CERTIFY_STEPS, DENSE_MAX, MIXED_SLACK, MIXED_TOL, REPORT_FAIL_PROB,
                              SVD_ROUNDING, TRUTH_KRYLOV, truth_tol)

from .attention import AttentionWeights, attention_unchecked, causal_mask, check_input
from .krylov import CallableGram, lanczos
from .power import PowerResult, top_singular_value
from .route import basis_plan, basis_vectors, product_bytes, products_route, state_bytes
from .starts import gaussian_rows, weight_tensors
from .streamed import rotate, rotate_t, streamed_operator

Tensor = torch.Tensor


def _heads(t: Tensor, h: int) -> Tensor:
    """(..., n, h*dh) -> (..., h, n, dh)."""
    return t.unflatten(-1, (h, -1)).transpose(-2, -3)


def _merge(t: Tensor) -> Tensor:
    """(..., h, n, dh) -> (..., n, h*dh)."""
    return t.transpose(-2, -3).flatten(-2)


def layer_operator(X: Tensor, w: AttentionWeights, causal: bool = False, rope=None):
    """(matvec, rmatvec) of the Jacobian J_F(X) of F(X) = sum_l P_l (X wv_l + bv_l) wo_l + bo: (..., n, d) both ways.

    Weights may carry leading batch dims broadcasting against X's (e.g. one head per batch element, see
    stack_heads). The three input projections are one (d, 3 h dh) GEMM and the output projection one (h dh, d).
    rope: (cos, sin) (n, dh) rotary tables (kernels.streamed.rope_tables) applied to q and k, or None. The h x n x n
    maps are kept: kernels.streamed is the same operator without them.
    """
    check_input(X, w.d)
    X = X.detach()
    h, dh = w.wq.shape[-3], w.dh
    sc = 1.0 / math.sqrt(dh)
    # (..., d, 3*h*dh): [wq | wk | wv], heads contiguous inside each block
    Wqkv = torch.cat([t.transpose(-2, -3).flatten(-2) for t in (w.wq, w.wk, w.wv)], dim=-1)
    Wo = w.wo.flatten(-3, -2)  # (..., h*dh, d)
    WqkvT, WoT = Wqkv.transpose(-1, -2), Wo.transpose(-1, -2)
    qkv = X @ Wqkv  # (..., n, 3*h*dh)
    q, k, v = (_heads(t, h) for t in qkv.chunk(3, dim=-1))  # (..., h, n, dh)
    if w.bq is not None:
        q = q + w.bq.unsqueeze(-2)
    if w.bk is not None:
        k = k + w.bk.unsqueeze(-2)
    if w.bv is not None:
        v = v + w.bv.unsqueeze(-2)
    rot, rot_t = (lambda t: t), (lambda t: t)
    if rope is not None:
        rot, rot_t = (lambda t: rotate(t, *rope)), (lambda t: rotate_t(t, *rope))
        q, k = rot(q), rot(k)
    S = q @ k.transpose(-1, -2) * sc  # (..., h, n, n)
    if causal:
        S = S.masked_fill(causal_mask(X.shape[-2], X.device), float("-inf"))
    P = torch.softmax(S, dim=-1)  # (..., h, n, n)
    # per product the n x n work is GEMMs: P^T is stored (a transposed operand costs ~40 % more per product),
    # the 1/sqrt(dh) scale sits on the n x dh factors and the two score terms are one product over 2 dh
    PT, vT = P.transpose(-1, -2).contiguous(), v.transpose(-1, -2)
    qs, ks = q * sc, k * sc

    def softmax_diff(dS):  # dP = P * (dS - rowsum(P * dS)) = P dS - P rowsum(P dS); self-adjoint in dS
        PdS = P * dS
        return torch.addcmul(PdS, P, PdS.sum(-1, keepdim=True), value=-1)

    def matvec(U: Tensor) -> Tensor:
        dq, dk, dv = (_heads(t, h) for t in (U @ Wqkv).chunk(3, dim=-1))  # (..., h, n, dh)
        if rope is not None:
            dq, dk = rot(dq), rot(dk)
        pair = lambda a, b: torch.cat(torch.broadcast_tensors(a, b), -1)  # U may carry more batch dims than X
        dS = pair(dq, qs) @ pair(ks, dk).transpose(-1, -2)  # (..., h, n, n)
        dP = softmax_diff(dS)  # masked entries have P = 0, so dP = 0 there
        return _merge(dP @ v + P @ dv) @ Wo  # (..., n, d)

    def rmatvec(G: Tensor) -> Tensor:
        Gh = _heads(G @ WoT, h)  # (..., h, n, dh)
        dS = softmax_diff((Gh * sc) @ vT)  # (..., h, n, n)
        dq, dk, dv = dS @ k, dS.transpose(-1, -2) @ q, PT @ Gh  # (..., h, n, dh)
        if rope is not None:
            dq, dk = rot_t(dq), rot_t(dk)
        return torch.cat([_merge(dq), _merge(dk), _merge(dv)], dim=-1) @ WqkvT  # (..., n, d)

    return matvec, rmatvec


def layer_map(w: AttentionWeights, causal: bool = False):
    """F as a function of X only (for torch.func-based estimators)."""
    return lambda Z: attention_unchecked(Z, w, residual=False, causal=causal)


def lipschitz(X: Tensor, w: AttentionWeights, causal: bool = False, tol: Optional[float] = None,
              iters: int = 2000, v0: Optional[Tensor] = None, seed: int = 0, method: str = "lanczos",
              krylov: int = 30, dense_max: int = DENSE_MAX) -> PowerResult:
    """||J_F(X)|| per sequence (correct estimator, docs/math.md §3) for X (..., n, d): PowerResult with (...,) values.

    Batched: one operator per leading index, all iterated together. v0: warm start (..., n, d).
    tol=None: harness.settings.truth_tol(X.dtype).
    Small layers (n*d <= dense_max, no v0, method="lanczos"): the explicit Jacobian from one batched matvec on
    the identity basis and its SVD (exact to rounding, faster than Lanczos there; `iters` = n*d products).
    Non-convergence is not raised: read `.converged`.
    """
    if tol is None:
        tol = truth_tol(X.dtype)
    matvec, rmatvec = layer_operator(X, w, causal)
    N = X.shape[-2] * X.shape[-1]
    if v0 is None and method == "lanczos" and N <= dense_max:
        return _dense(matvec, X)
    if v0 is None:  # hashed from X and the weights (harness.kernels.starts), not a public seed
        v0 = gaussian_rows(X, N, seed, f"layer;causal={bool(causal)}", weight_tensors(w)).reshape(X.shape)
    return top_singular_value(matvec, rmatvec, v0, event_dims=2, iters=iters, tol=tol,
                              on_nonconvergence="ignore", method=method, krylov=krylov)


def _dense(matvec, X: Tensor) -> PowerResult:
    """SVD of the explicit Jacobian, columns J e_i from one matvec batched over the n*d basis vectors."""
    batch, (n, d) = X.shape[:-2], X.shape[-2:]
    N = n * d
    E = torch.eye(N, dtype=X.dtype, device=X.device).reshape(N, *([1] * len(batch)), n, d)
    cols = matvec(E.expand(N, *batch, n, d))  # (N, ..., n, d): column i of every J
    J = cols.reshape(N, *batch, -1).movedim(0, -1)  # (..., n*d, N)
    _, S, Vh = torch.linalg.svd(J, full_matrices=False)
    value = S[..., 0]
    ok = torch.isfinite(value)
    return PowerResult(value, ok, Vh[..., 0, :].reshape(*batch, n, d), N, torch.zeros_like(value),
                       upper=value * (1 + SVD_ROUNDING * N * torch.finfo(X.dtype).eps), fail_prob=0.0)


def _dense_certified(X: Tensor, w, causal: bool, residual: bool, rope=None, route: str = "auto") -> PowerResult:
    """A certified truth from the explicit Jacobian's SVD, computed in float64 whatever X's dtype (float32 inputs and
    weights are float64 numbers exactly, so this is the layer as given, with float64's rounding allowance), value and
    upper estimate rounded to X's dtype (the upper one upwards)."""
    X64 = X.to(torch.float64)
    if rope is not None:
        rope = tuple(t.to(torch.float64) for t in rope)
    mv, _, name = operator(X64, w if X.dtype == torch.float64 else _cast(w, torch.float64), causal, rope, route,
                           residual)
    r = _dense(mv, X64)
    if X.dtype != torch.float64:
        up = r.upper.to(X.dtype)
        up = torch.where(up.to(torch.float64) < r.upper, torch.nextafter(up, torch.full_like(up, math.inf)), up)
        r = PowerResult(r.value.to(X.dtype), r.converged, r.vector.to(X.dtype), r.iters, r.rel_change.to(X.dtype),
                        upper=up, fail_prob=0.0)
    r.info = dict(route=name, basis="dense")
    return r


def paper_value(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """The paper code's estimator, sqrt(||J_F(X)^T F(X)||_F) (jvp[0] = F(X) defect), in closed form: (...,).

    Equal to kernels.power.paper_estimator(F, X) after its first step (every step computes J^T F(X)); tested.
    """
    _, rmatvec = layer_operator(X, w, causal)
    FX = attention_unchecked(X, w, residual=False, causal=causal)  # (..., n, d)
    return rmatvec(FX).flatten(-2).norm(dim=-1).sqrt()


def warm_start(prev: Optional[Tensor], shape: Sequence[int], seed: int = 0, dtype=None, device=None) -> Tensor:
    """Start vector for length-n sequences from the top vectors of shorter ones: prev (B', m, d) -> (*shape).

    Rows beyond m are filled with a fresh Gaussian at the rms row scale of prev; a 10 % Gaussian is mixed
    in everywhere so no component of the new top vector is exactly missing. None -> plain Gaussian.
    dtype/device default to prev's (float64 on the CPU when prev is None and none is given).
    """
    if dtype is None:
        dtype = prev.dtype if prev is not None else torch.float64
    if device is None and prev is not None:
        device = prev.device
    g = torch.Generator(device=device).manual_seed(seed)
    noise = torch.randn(tuple(shape), dtype=dtype, device=device, generator=g)
    if prev is None:
        return noise
    B, n, d = shape[-3], shape[-2], shape[-1]
    if prev.shape[-1] != d:
        raise ValueError(f"warm start has feature dimension {prev.shape[-1]}, expected {d}")
    p = prev.reshape(-1, prev.shape[-2], d).to(dtype=dtype, device=noise.device)
    p = p[torch.arange(B, device=p.device) % p.shape[0]]  # (B, m, d)
    p = p / p.flatten(1).norm(dim=-1).clamp_min(torch.finfo(dtype).tiny)[:, None, None]
    m = min(n, p.shape[1])
    rms = 1.0 / math.sqrt(p.shape[1])
    v = noise * rms / math.sqrt(d)
    v[:, :m] = p[:, :m]
    return v + 0.1 * noise * rms / math.sqrt(d)


def stack_heads(w: AttentionWeights, heads: Sequence[int], bias: bool = False) -> "BatchedWeights":
    """Single-head weights of several heads stacked on a leading batch axis: wq (H, 1, d, dh), ..., for
    layer_operator on X (H, n, d) whose element b is measured under head heads[b] alone."""
    idx = torch.as_tensor(list(heads), dtype=torch.long, device=w.wq.device)
    pick = lambda t: t[idx].unsqueeze(1)  # (H, 1, ., .)
    pb = (lambda t: None if (t is None or not bias) else t[idx].unsqueeze(1))  # (H, 1, dh)
    return BatchedWeights(pick(w.wq), pick(w.wk), pick(w.wv), pick(w.wo), pb(w.bq), pb(w.bk), pb(w.bv))


class BatchedWeights:
    """Duck-typed AttentionWeights with leading batch dims (layer_operator only reads wq..bv, d, dh)."""

    def __init__(self, wq, wk, wv, wo, bq=None, bk=None, bv=None, bo=None):
        self.wq, self.wk, self.wv, self.wo, self.bq, self.bk, self.bv, self.bo = wq, wk, wv, wo, bq, bk, bv, bo
        self.d, self.dh = wq.shape[-2], wq.shape[-1]


# ---- the truth: one function for the registry, analyze and the Castin experiments ------------------------------
def reduced_heads(X: Tensor, w):
    """Every head's map f_l as an equivalent smaller single-head layer, batched: (X Q_l (..., h, n, r), weights).

    f_l reads X only through X [wq_l | wk_l | wv_l] = X Q_l R_l (QR, Q_l (d, r), r = min(d, 3 dh)), so its
    Jacobian vanishes on the complement of range(Q_l) and ||J_{f_l}(X)|| equals the norm of the same map with
    weights Q_l^T w*_l at X Q_l; on the output side ||G wo_l||_F = ||G R_o^T||_F for wo_l^T = Q_o R_o. The
    operator acts on n x r instead of n x d (r = 3 dh = d/4 for 12 heads). Biases bq, bk, bv are kept."""
    h, d, dh = w.wq.shape
    r = min(d, 3 * dh)
    Q = torch.linalg.qr(torch.cat([w.wq, w.wk, w.wv], dim=-1)).Q[..., :r]  # (h, d, r)
    QT = Q.transpose(-1, -2)
    Ro = torch.linalg.qr(w.wo.transpose(-1, -2)).R  # (h, dh, dh): wo_l = Ro^T Qo^T
    wo = torch.zeros(h, dh, r, dtype=w.wq.dtype, device=w.wq.device)
    wo[..., :dh] = Ro.transpose(-1, -2)  # r >= dh
    pick = lambda t: None if t is None else t.unsqueeze(1)  # (h, 1, ...)
    wr = BatchedWeights(pick(QT @ w.wq), pick(QT @ w.wk), pick(QT @ w.wv), pick(wo), pick(w.bq), pick(w.bk),
                        pick(w.bv))
    return X.unsqueeze(-3) @ Q, wr  # (..., h, n, r)


def gaussian_start(X: Tensor, seed: int, tag: str = "norm", data: Sequence[Optional[Tensor]] = ()) -> Tensor:
    """The certified start for X-shaped problems (..., n, d): Gaussian rows (B, n d) of unit norm, in X's dtype and
    device, each seeded by a hash of its input, `data` (the operator's weights), `tag` (which quantity) and `seed`
    (harness.kernels.starts): unknowable before the model and the input are fixed (the KW certificate's premise),
    the same for the same model and input."""
    x0 = gaussian_rows(X, X.shape[-2:].numel(), seed, tag, data)
    return x0 / x0.norm(dim=-1, keepdim=True)


def truth_start(X: Tensor, w, seed: int, causal: bool, residual: bool = False) -> Tensor:
    """gaussian_start for the layer Jacobian of (X, w): the start of `truth(..., certify=...)` and of the mixed
    route (harness.kernels.mixed.truth), which must be the same vector."""
    return gaussian_start(X, seed, f"layer;causal={bool(causal)};residual={bool(residual)}", weight_tensors(w))


def certified_norm(matvec, rmatvec, X: Tensor, tol: Optional[float] = None, iters: int = 2000, seed: int = 0,
                   steps: int = CERTIFY_STEPS, fail_prob: float = REPORT_FAIL_PROB,
                   x0: Optional[Tensor] = None, krylov: Optional[int] = None) -> PowerResult:
    """||J|| of an operator on X-shaped tensors (..., n, d), by Lanczos on J^T J from a Gaussian drawn before
    looking, at least `steps` products before stopping, so `upper` is the Kuczynski-Wozniakowski certified upper
    estimate (probability >= 1 - fail_prob over the start; docs/math.md §4). Values (...,). x0 (B, n d): the start
    (default gaussian_start(X, seed), hashed from X alone: pass one hashed from the operator's weights too, as
    `truth` does, when the operator is not a function of X alone). krylov: the basis size (default
    max(TRUTH_KRYLOV, steps + 2); at least steps + 2, so the certificate's first cycle is unrestarted)."""
    tol = truth_tol(X.dtype) if tol is None else tol
    batch, event = X.shape[:-2], X.shape[-2:]
    x0 = gaussian_start(X, seed) if x0 is None else x0
    op = CallableGram(matvec, rmatvec, batch, event, x0)
    krylov = max(TRUTH_KRYLOV, steps + 2) if krylov is None else max(int(krylov), steps + 2)
    r = lanczos(op, x0, iters=iters, tol=tol, krylov=krylov, min_steps=steps, fail_prob=fail_prob)
    return PowerResult(r.value.reshape(batch), r.converged.reshape(batch), r.vector.reshape(X.shape), r.products,
                       r.rel.reshape(batch), r.upper.reshape(batch), fail_prob, steps=r.steps.reshape(batch))


def operator(X: Tensor, w, causal: bool = False, rope=None, route: str = "auto", residual: bool = False):
    """(matvec, rmatvec, route name) of J_F(X) (+ I when residual), by kernels.route's rule: the materialised maps
    (layer_operator) while they fit, else the streamed products (kernels.streamed); route forces either."""
    name = products_route(X.shape[:-2].numel(), w.wq.shape[-3], X.shape[-2], X.element_size(), route)
    mv, rmv = (layer_operator if name == "materialised" else streamed_operator)(X, w, causal, rope)
    if residual:  # J_F + I and its adjoint J_F^T + I
        return (lambda E: mv(E) + E), (lambda G: rmv(G) + G), name
    return mv, rmv, name


def _cast(w, dtype):
    """AttentionWeights or BatchedWeights in `dtype`."""
    if isinstance(w, BatchedWeights):
        return BatchedWeights(*(None if t is None else t.to(dtype) for t in (w.wq, w.wk, w.wv, w.wo, w.bq, w.bk,
                                                                              w.bv, w.bo)))
    return w.to(dtype=dtype)


def _mixed_norm(X: Tensor, w, causal, rope, route, residual, tol, iters, steps, fail_prob, x0, plan) -> PowerResult:
    """The certified norm with a float32 basis (docs/math.md §4, "Mixed precision"): the float32 phase from the
    float64 start rounded (first cycle >= steps products, KW estimate padded by MIXED_SLACK), then float64 Lanczos
    from its Ritz vector to tol with plan.krylov vectors; each phase's operator built only while it runs."""
    batch, event = X.shape[:-2], X.shape[-2:]
    f32 = torch.float32
    rope32 = None if rope is None else tuple(t.to(f32) for t in rope)
    mv, rmv, _ = operator(X.to(f32), _cast(w, f32), causal, rope32, route, residual)
    n, d, inner = X.shape[-2], X.shape[-1], w.wq.shape[-3] * w.dh
    B = X.shape[:-2].numel()  # what is left beside the operator and a product's temporaries:
    k32 = basis_vectors(plan.vector_bytes // 2, steps + 2, plan.krylov32, reserve=B * product_bytes(n, d, inner, 4))
    r32 = lanczos(CallableGram(mv, rmv, batch, event, x0.to(f32)), x0.to(f32), iters=iters, tol=max(tol, MIXED_TOL),
                  krylov=k32, min_steps=steps, fail_prob=fail_prob)
    del mv, rmv
    mv, rmv, _ = operator(X, w, causal, rope, route, residual)
    v0 = r32.vector.to(X.dtype)
    k64 = basis_vectors(plan.vector_bytes, 2, TRUTH_KRYLOV, reserve=B * product_bytes(n, d, inner, 8))
    r = lanczos(CallableGram(mv, rmv, batch, event, v0), v0, iters=iters, tol=tol, krylov=k64, min_steps=1)
    up = r32.upper.to(X.dtype) * (1 + MIXED_SLACK)
    up = torch.where(torch.isfinite(up), torch.maximum(up, r.value), up)
    return PowerResult(r.value.reshape(batch), r.converged.reshape(batch), r.vector.reshape(X.shape),
                       r.products + r32.products, r.rel.reshape(batch), up.reshape(batch), fail_prob,
                       steps=(r.steps + r32.steps).reshape(batch),
                       info=dict(products32=r32.products, basis=f"float32 basis of {k32} vectors, then float64 basis "
                                                                f"of {k64} (mixed)"))


def truth(X: Tensor, w, causal: bool = False, heads: bool = False, tol: Optional[float] = None, iters: int = 2000,
          seed: int = 0, certify: Optional[dict] = None, residual: bool = False, route: str = "auto",
          rope=None) -> PowerResult:
    """The true local Lipschitz constant at X (..., n, d): ||J_F(X)|| of the layer (values (...,)) or, heads=True,
    ||J_{f_l}(X)|| of every head's map f_l(X) = P_l (X wv_l + bv_l) wo_l (values (..., h), on reduced_heads).

    tol=None: harness.settings.truth_tol(X.dtype). certify=None: `lipschitz` (explicit Jacobian + SVD on small
    layers, else Lanczos from the hashed Gaussian); certify=dict(steps=..., fail_prob=...): on small layers (n d <=
    CERT_DENSE_MAX) the explicit Jacobian's SVD, `upper` its value padded by SVD_ROUNDING n d eps (fail_prob 0), else
    certified_norm, whose `upper` is the KW estimate. residual=True: the constant of X -> F(X) + X, ||J_F(X) + I||
    (layer only, with certify). Non-convergence is not raised: read `.converged`.
    With certify, the products run by kernels.route's rule (route="auto"; "materialised" / "streamed" force one)
    and the basis is kernels.route.basis_plan's (float64 as always while it fits; a smaller float64 basis, then
    a float32 one through the mixed-precision contract, where memory is short); `info` states both. rope: (cos,
    sin) (n, dh) rotary tables (kernels.streamed.rope_tables), with certify only."""
    if residual and (heads or certify is None):
        raise ValueError("truth(residual=True) is the certified layer constant: pass certify=dict(...), heads=False")
    if rope is not None and certify is None:
        raise ValueError("truth(rope=...) is the certified truth: pass certify=dict(steps=..., fail_prob=...)")
    if heads:
        X, w = reduced_heads(X, w)
    if certify is None:
        return lipschitz(X, w, causal, tol=tol, iters=iters, seed=seed)
    N = X.shape[-2] * X.shape[-1]
    if N <= CERT_DENSE_MAX:  # exact: the explicit Jacobian's SVD, padded for its rounding (no Kuczynski-Wozniakowski
        return _dense_certified(X, w, causal, residual, rope, route)  # inflation where Krylov would span the space)
    tol = truth_tol(X.dtype) if tol is None else tol
    steps, fail_prob = int(certify["steps"]), float(certify["fail_prob"])
    B = X.shape[:-2].numel()
    mixed_ok = X.dtype == torch.float64 and not (X.device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32)
    n, d, inner = X.shape[-2], X.shape[-1], w.wq.shape[-3] * w.dh
    reserved = tuple(B * state_bytes(n, d, inner, size) + X.numel() * X.element_size() for size in (8, 4))
    plan = basis_plan(B, N, steps, X.dtype, mixed_ok=mixed_ok, reserved=reserved)
    x0 = truth_start(X, w, seed, causal, residual)
    if plan.krylov32:  # float32 storage of a float64 problem (a float32 input's plan is a plain one)
        r = _mixed_norm(X, w, causal, rope, route, residual, tol, iters, steps, fail_prob, x0, plan)
        name = products_route(B, w.wq.shape[-3], n, X.element_size(), route)
    else:
        matvec, rmatvec, name = operator(X, w, causal, rope, route, residual)
        k = basis_vectors(plan.vector_bytes, steps + 2, plan.krylov,  # left beside the operator and a product
                          reserve=B * product_bytes(n, d, inner, X.element_size()))
        r = certified_norm(matvec, rmatvec, X, tol, iters, seed, steps, fail_prob, x0=x0, krylov=k)
        r.info = dict(basis=f"{plan.storage} basis of {k} vectors")
    r.info = dict(r.info, route=name, products=r.iters)
    return r
