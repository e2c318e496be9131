"""Castin, Ablin, Peyre, "How smooth is attention?" (formulas in docs/math.md §3), per head.

Per head l: f_l(X) = P_l(X) X VO_l, scores S = X A_l X^T (§0), Castin's A_c = A_l^T, V = VO_l.
- `bound`: Thm 3.3 (unmasked) / Thm 4.3 (masked, same constant), R = max token norm of X:
  Lip(f_l on B_R^n) <= sqrt(3) ||V|| (||A||^2 R^4 (4n+1) + n)^(1/2). A bound on the whole ball, so in
  particular on the local constant ||Df_l(X)||.
- `meanfield_bound`: Thm 3.5, ||V|| (1 + 3||A|| R^2) exp(2||A|| R^2), independent of n.
- `gamma`, `lower_bound`, `adversarial_input`: Prop. 3.4 (real eigenvalues of A_c, see `prop34_choice`).
- `edge_regime_input`, `edge_regime_lower_bound`: Prop. 3.6 (two Diracs, weighted self-attention).
- `large_radius_limit`: Thm 3.7's limit of ||Df(RX)|| as R -> inf.
- Jacobian formula (Lemma C.2 / D.1), weighted self-attention (Def. C.4) and mass splitting are in
  castin_weighted.py / mass_splitting.py and re-exported here.
Biases: `bound` and `meanfield_bound` use JaSMin Remark 2 (w.augmented() on [X, 1], tokens of norm
sqrt(R^2 + 1)), a valid bound for the biased layer; the lower-bound constructions need bias-free weights.
"""
from __future__ import annotations

import math
from typing import Optional, Union

import torch

from harness.bounds.castin_weighted import (check_masses, covariances, dense_jacobian_formula, jacobian_formula,
                                            weighted_attention, weighted_dense_jacobian, weighted_jacobian_norm,
                                            weighted_probs)
from harness.bounds.jasmin import multihead
from harness.bounds.mass_splitting import (covariance_term, duplicate_tokens, duplicated_lipschitz,
                                           mass_splitting_map, split_lipschitz, split_terms)
from harness.kernels.attention import AttentionWeights, augment_input, causal_mask, check_input, check_pair
from harness.kernels.layer import truth as layer_truth
from harness.kernels.linalg import all_finite
from harness.settings import ITERS

Tensor = torch.Tensor

__all__ = ["bound", "meanfield_bound", "real_eigenvalues", "prop34_choice", "gamma", "lower_bound",
           "adversarial_input", "quadratic_example_input", "first_token_lower_bound", "edge_regime_input",
           "edge_regime_lower_bound", "large_radius_limit", "layer_bound", "max_gamma_head", "score_gaps",
           "head_attention", "head_lipschitz", "head_lipschitz_dense", "dense_head_jacobians",
           "attention_jacobian", "multihead",
           # re-exports (castin_weighted, mass_splitting)
           "jacobian_formula", "dense_jacobian_formula", "weighted_attention", "weighted_probs",
           "weighted_jacobian_norm", "weighted_dense_jacobian", "covariances", "check_masses",
           "duplicate_tokens", "duplicated_lipschitz", "covariance_term", "split_terms", "split_lipschitz",
           "mass_splitting_map"]


def _check_w(w) -> None:
    if not isinstance(w, AttentionWeights):
        raise ValueError(f"w must be an AttentionWeights, got {type(w).__name__}")


def _check_radius(R, name: str = "radius") -> Tensor:
    R = torch.as_tensor(R, dtype=torch.float64)
    if not all_finite(R):
        raise ValueError(f"{name} must be finite, got {R}")
    if (R < 0).any():
        raise ValueError(f"{name} must be >= 0, got {R}")
    return R


# ---- upper bounds -------------------------------------------------------------------------------------------

def bound(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """Thm 3.3 / 4.3 per head: sqrt(3) ||VO_l|| (||A_l||^2 R^4 (4n+1) + n)^(1/2), R = max_i ||x_i||: (..., h).

    `causal` is accepted for symmetry with the other bounds: Thm 4.3 (masked) has the same right-hand side.
    """
    _check_w(w)
    check_pair(X, w)
    if w.has_bias:
        X, w = augment_input(X), w.augmented()
    n = X.shape[-2]
    R = X.norm(dim=-1).amax(-1, keepdim=True)  # (..., 1)
    a, v = w.A_norm(), w.VO_norm()  # (h,), from the rank-dh factors
    return math.sqrt(3) * v * (a.square() * R ** 4 * (4 * n + 1) + n).sqrt()


def layer_bound(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """Thm 3.3 / 4.3 for the whole multi-head layer: the sum of bound() over heads (docs/math.md §0): (...,)."""
    return bound(X, w, causal=causal).sum(-1)


def meanfield_bound(w: AttentionWeights, R: Union[float, Tensor]) -> Tensor:
    """Thm 3.5 (mean field, derived): ||VO_l|| (1 + 3||A_l|| R^2) exp(2||A_l|| R^2): R (...,) -> (..., h)."""
    _check_w(w)
    R = _check_radius(R, "R").to(dtype=w.dtype, device=w.device)
    if w.has_bias:
        R, w = (R.square() + 1).sqrt(), w.augmented()
    a, v = w.A_norm(), w.VO_norm()  # (h,)
    r2 = R.unsqueeze(-1).square()  # (..., 1)
    return v * (1 + 3 * a * r2) * torch.exp(2 * a * r2)


# ---- Prop. 3.4: lower bound and adversarial inputs ---------------------------------------------------------

def real_eigenvalues(M: Tensor, rtol: float = 1e-9) -> list:
    """Real eigenvalues of each (d, d) matrix in M (h, d, d): list of 1-D tensors (possibly empty)."""
    ev = torch.linalg.eigvals(M)  # (h, d) complex
    scale = torch.linalg.matrix_norm(M, ord=2).clamp_min(1.0)  # (h,)
    out = []
    for l in range(M.shape[0]):
        real = ev[l].imag.abs() <= rtol * scale[l]
        out.append(ev[l].real[real].to(M.dtype))
    return out


def _null_vector(M: Tensor) -> Tensor:
    """Unit u minimizing ||M u|| (the eigenvector of a real eigenvalue when M = A_c - lam I): (d, d) -> (d,)."""
    return torch.linalg.svd(M).Vh[-1]


def _choose(lams: Tensor):
    """Prop. 3.4's eigenvalue among the real ones: (lam, case, gamma), gamma = max(lam_max / 4, -2 lam_min)."""
    lmax, lmin = lams.max(), lams.min()
    return (lmax, "max", lmax / 4) if lmax > -8 * lmin else (lmin, "min", -2 * lmin)


def prop34_choice(w: AttentionWeights, method: str = "factors", rtol: float = 1e-9) -> list:
    """Per head: dict(gamma, lam, u, case) of Prop. 3.4 for A_c = A_l^T, or None if A_c has no real eigenvalue.

    gamma = max(lam_max / 4, -2 lam_min) over the real eigenvalues; case "max" (lam_max > -8 lam_min, uses
    lam_max) or "min" (uses lam_min); u the unit real eigenvector of A_c for the chosen eigenvalue.
    method "factors" (default): A_c = wk wq^T / sqrt(dh) has rank <= dh, so its nonzero eigenvalues are those
    of M = wq^T wk / sqrt(dh) (dh x dh) with eigenvectors u = wk z (M z = lam z), plus 0 when dh < d:
    O(h dh^3), ~0.1 s per GPT-2 layer. method "dense": eigenvalues of the d x d A_c (the oracle; ~30 s there).
    """
    _check_w(w)
    w.require_no_bias("Castin Prop. 3.4")
    if method == "dense":
        return _prop34_dense(w, rtol)
    if method != "factors":
        raise ValueError(f"unknown method {method!r}: use 'factors' or 'dense'")
    M = w.wq.transpose(-1, -2) @ w.wk / math.sqrt(w.dh)  # (h, dh, dh)
    ev, vec = torch.linalg.eig(M)  # (h, dh), (h, dh, dh) complex
    scale = torch.linalg.matrix_norm(M, ord=2).clamp_min(1.0)  # (h,)
    out = []
    for l in range(w.h):
        real = ev[l].imag.abs() <= rtol * scale[l]
        lams = ev[l].real[real].to(w.dtype)
        if w.dh < w.d:
            lams = torch.cat([lams, lams.new_zeros(1)])
        if lams.numel() == 0:
            out.append(None)
            continue
        lam, case, g = _choose(lams)
        j = int((lams - lam).abs().argmin())
        if j < int(real.sum()) and lam != 0:
            ph = vec[l][:, real][:, j]  # (dh,) complex; a real eigenvalue's eigenvector is real up to a phase
            big = ph[ph.abs().argmax()]
            u = w.wk[l] @ (ph / (big / big.abs())).real.to(w.dtype)
        else:  # eigenvalue 0: any unit u orthogonal to the columns of wq (A_c u = wk wq^T u / sqrt(dh) = 0)
            u = torch.linalg.svd(w.wq[l].T, full_matrices=True).Vh[-1]
        out.append(dict(gamma=g, lam=lam, u=u / u.norm(), case=case))
    return out


def _prop34_dense(w: AttentionWeights, rtol: float) -> list:
    """prop34_choice from the d x d eigenproblem of A_c (oracle for the factored route)."""
    Ac = w.A().transpose(-1, -2)  # (h, d, d)
    eye = torch.eye(w.d, dtype=w.dtype, device=w.device)
    out = []
    for l, ev in enumerate(real_eigenvalues(Ac, rtol)):
        if ev.numel() == 0:
            out.append(None)
            continue
        lam, case, g = _choose(ev)
        out.append(dict(gamma=g, lam=lam, u=_null_vector(Ac[l] - lam * eye), case=case))
    return out


def gamma(w: AttentionWeights) -> Tensor:
    """Prop. 3.4's gamma = max(lam_max / 4, -2 lam_min) per head (NaN if A_c has no real eigenvalue): (h,)."""
    ch = prop34_choice(w)
    nan = torch.tensor(float("nan"), dtype=w.dtype, device=w.device)
    return torch.stack([nan if c is None else c["gamma"] for c in ch])


def lower_bound(w: AttentionWeights, n: Union[int, Tensor], R: Union[float, Tensor],
                choices: Optional[list] = None) -> Tensor:
    """Prop. 3.4: sqrt(n-1) ||VO_l^T u|| P_n (1 + gamma R^2 (1 - P_n)), P_n = 1/(1 + (n-1) e^{-gamma R^2}).

    A lower bound on Lip(f_l on B_R^n), attained at `adversarial_input`. n, R broadcast: (...,) -> (..., h).
    NaN for heads whose A_c has no real eigenvalue (the construction needs a real eigenvector).
    choices: prop34_choice(w) when already computed (it is recomputed otherwise).
    """
    R = _check_radius(R, "R").to(dtype=w.dtype, device=w.device)
    n_t = torch.as_tensor(n, dtype=w.dtype, device=w.device)
    if (n_t < 1).any() or (n_t != n_t.round()).any():
        raise ValueError(f"n must be an integer >= 1, got {n}")
    ch = prop34_choice(w) if choices is None else choices
    VO = w.VO()
    nan = torch.tensor(float("nan"), dtype=w.dtype, device=w.device)
    g = torch.stack([nan if c is None else c["gamma"] for c in ch])  # (h,)
    vu = torch.stack([nan if c is None else (VO[l].T @ c["u"]).norm() for l, c in enumerate(ch)])  # (h,)
    r2 = R.unsqueeze(-1).square()  # (..., 1)
    nn = n_t.unsqueeze(-1)
    Pn = 1 / (1 + (nn - 1) * torch.exp(-g * r2))
    return (nn - 1).sqrt() * vu * Pn * (1 + g * r2 * (1 - Pn))


def adversarial_input(w: AttentionWeights, head: int, n: int, radius: float,
                      choices: Optional[list] = None) -> Tensor:
    """Prop. 3.4 input for head l: R(u, u/2, ..., u/2) (case max) or R(-u, u, ..., u) (case min): (n, d).

    choices: prop34_choice(w) when already computed (it is recomputed otherwise)."""
    _check_w(w)
    if not 0 <= head < w.h:
        raise ValueError(f"head index {head} out of range for h = {w.h}")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    R = float(_check_radius(radius))
    c = (prop34_choice(w) if choices is None else choices)[head]
    if c is None:
        raise ValueError(f"A_c of head {head} has no real eigenvalue (all eigenvalues complex, possible for even d): "
                         "Prop. 3.4's construction needs a real eigenvector")
    u = c["u"]
    if c["case"] == "max":
        X = torch.cat([u[None], 0.5 * u[None].expand(n - 1, -1)])
    else:
        X = torch.cat([-u[None], u[None].expand(n - 1, -1)])
    return R * X


# ---- Prop. 3.6 (edge regime) and Thm 3.7 (large radius) ----------------------------------------------------

def edge_regime_input(w: AttentionWeights, head: int, R: float):
    """Prop. 3.6's two Diracs for head l: X (2, d) = (Ru, Ru/2) or (-Ru, Ru), masses (p, 1-p).

    (1-p)/p = 3 e^{gamma R^2}: the edge regime where Thm 3.3 and Thm 3.5 grow alike.
    """
    X = adversarial_input(w, head, 2, R)
    g = float(prop34_choice(w)[head]["gamma"])
    p = 1.0 / (1.0 + 3.0 * math.exp(g * float(R) ** 2))
    if not p > 0:
        raise ValueError(f"gamma R^2 = {g * float(R) ** 2:.1f} is too large: the small mass underflows")
    return X, torch.tensor([p, 1 - p], dtype=w.dtype, device=w.device)


def edge_regime_lower_bound(w: AttentionWeights, R: Union[float, Tensor]) -> Tensor:
    """Prop. 3.6 asymptotic (derived): (3 sqrt(3)/16) ||VO_l^T u|| gamma R^2 e^{gamma R^2/2}: (...,) -> (..., h).

    Asymptotically equal (R -> inf) to ||Df^w||_w at `edge_regime_input`; an asymptotic, not a strict, bound.
    """
    R = _check_radius(R, "R").to(dtype=w.dtype, device=w.device)
    ch = prop34_choice(w)
    VO = w.VO()
    nan = torch.tensor(float("nan"), dtype=w.dtype, device=w.device)
    g = torch.stack([nan if c is None else c["gamma"] for c in ch])
    vu = torch.stack([nan if c is None else (VO[l].T @ c["u"]).norm() for l, c in enumerate(ch)])
    gr2 = g * R.unsqueeze(-1).square()
    return 3 * math.sqrt(3) / 16 * vu * gr2 * torch.exp(gr2 / 2)


def max_gamma_head(w: AttentionWeights) -> int:
    """Index of the head of largest Prop. 3.4 gamma (bias-free weights; heads without a real eigenvalue last)."""
    return max(enumerate(prop34_choice(w)), key=lambda t: -math.inf if t[1] is None else float(t[1]["gamma"]))[0]


def score_gaps(X: Tensor, w: AttentionWeights, head: int = 0) -> Tensor:
    """Smallest top-1 minus top-2 score gap over the rows of X A_l X^T: (..., n, d) -> (...,).

    At radius R the rows of RX leave the softmax transition once R^2 x gap >> 1, where Thm 3.7's limit holds."""
    S = X @ w.A()[head] @ X.transpose(-1, -2)  # (..., n, n)
    top = S.topk(2, dim=-1).values  # (..., n, 2)
    return (top[..., 0] - top[..., 1]).amin(-1)


def large_radius_limit(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """Thm 3.7: lim_{R->inf} ||Df_l(RX)|| = ||VO_l|| sqrt(max_j #{i : j*(i) = j}), j*(i) = argmax_j <A_c x_i, x_j>.

    Valid on the generic set where each argmax is unique (Thm 3.7's measure-zero exclusion): (..., h).
    """
    _check_w(w)
    check_input(X, w.d)
    w.require_no_bias("Castin Thm 3.7 (large radius limit)")
    S = X.unsqueeze(-3) @ w.A() @ X.unsqueeze(-3).transpose(-1, -2)  # (..., h, n, n)
    if causal:
        S = S.masked_fill(causal_mask(X.shape[-2], X.device), float("-inf"))
    jstar = S.argmax(-1)  # (..., h, n)
    counts = torch.nn.functional.one_hot(jstar, X.shape[-2]).sum(-2)  # (..., h, n)
    return w.VO_norm() * counts.amax(-1).to(X.dtype).sqrt()


def quadratic_example_input(w: AttentionWeights, head: int, n: int, R: float) -> Tensor:
    """App. C.7 (after Kim et al.): x_1 = 0, the other tokens at +-R v alternately on a line: (n, d).

    Row 1 attends uniformly (s_1j = 0), so Cov_1 is the empirical variance ~ R^2 v v^T. v is the unit vector,
    among the singular vectors of A_l and VO_l, maximizing ||VO_l^T v|| ||A_l v|| (= ||VO^T v v^T A_c||).
    """
    _check_w(w)
    w.require_no_bias("Castin App. C.7 example")
    if not 0 <= head < w.h:
        raise ValueError(f"head index {head} out of range for h = {w.h}")
    if not isinstance(n, int) or n < 2:
        raise ValueError(f"n must be an integer >= 2, got {n!r}")
    R = float(_check_radius(R, "R"))
    A, V = w.A()[head], w.VO()[head]
    cands = torch.cat([torch.linalg.svd(M).U.T for M in (A, A.T, V, V.T)])  # (4d, d) unit vectors
    score = (cands @ V).norm(dim=-1) * (cands @ A.T).norm(dim=-1)  # ||V^T v|| ||A v||
    v = cands[score.argmax()]
    signs = torch.tensor([(-1.0) ** j for j in range(n - 1)], dtype=w.dtype, device=w.device)
    return torch.cat([torch.zeros(1, w.d, dtype=w.dtype, device=w.device), R * signs[:, None] * v[None]])


def first_token_lower_bound(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """||VO_l^T (P_11 I + Cov_1 A_c)||, exact lower bound of ||Df_l(X)|| when x_1 = 0 (moving only token 1,
    reading only output 1, Lemma C.2): (..., n, d) -> (..., h). Grows like the variance of the tokens (App. C.7).
    """
    _check_w(w)
    check_input(X, w.d)
    w.require_no_bias("first_token_lower_bound")
    if float(X[..., 0, :].abs().max()) != 0.0:
        raise ValueError("first_token_lower_bound needs x_1 = 0 (App. C.7 configuration)")
    A, V = w.A(), w.VO()  # (h, d, d)
    S = X.unsqueeze(-3) @ A @ X.unsqueeze(-3).transpose(-1, -2)  # (..., h, n, n)
    if causal:  # row 1 of a causal map sees only token 1: Cov_1 = 0, P_11 = 1
        S = S.masked_fill(causal_mask(X.shape[-2], X.device), float("-inf"))
    P = torch.softmax(S, -1)
    cov1 = covariances(X.unsqueeze(-3), P)[..., 0, :, :]  # (..., h, d, d)
    eye = torch.eye(w.d, dtype=X.dtype, device=X.device)
    M = V.transpose(-1, -2) @ (P[..., 0, 0, None, None] * eye + cov1 @ A.transpose(-1, -2))  # V^T(P_11 I + Cov_1 A_c)
    return torch.linalg.matrix_norm(M, ord=2)


# ---- true per-head local Lipschitz constants ---------------------------------------------------------------

def head_attention(Xr: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """f_l(X_l) = P_l(X_l) (X_l wv_l + bv_l) wo_l for a per-head copy Xr (..., h, n, d) -> (..., h, n, d)."""
    q = Xr @ w.wq  # (..., h, n, dh)
    k = Xr @ w.wk
    v = Xr @ w.wv
    if w.bq is not None:
        q = q + w.bq[:, None, :]
    if w.bk is not None:
        k = k + w.bk[:, None, :]
    if w.bv is not None:
        v = v + w.bv[:, None, :]
    S = q @ k.transpose(-1, -2) / math.sqrt(w.dh)  # (..., h, n, n)
    if causal:
        S = S.masked_fill(causal_mask(Xr.shape[-2], Xr.device), float("-inf"))
    return torch.softmax(S, dim=-1) @ v @ w.wo


def head_lipschitz(X: Tensor, w: AttentionWeights, causal: bool = False, tol: Optional[float] = None,
                   iters: int = ITERS, seed: int = 0) -> Tensor:
    """True local Lipschitz constant ||Df_l(X)|| of every head, f_l as head_attention computes it: (..., h).
    The one truth of the toolkit (kernels.layer.truth, tolerance harness.settings.truth_tol)."""
    _check_w(w)
    check_input(X, w.d)
    return layer_truth(X, w, causal, heads=True, tol=tol, iters=iters, seed=seed).value


def attention_jacobian(X: Tensor, w: AttentionWeights, head: int, causal: bool = False) -> Tensor:
    """Dense Jacobian of head l at a single X (n, d) from Lemma C.2 / D.1 (bias-free): (n*d, n*d)."""
    _check_w(w)
    check_input(X, w.d)
    w.require_no_bias("attention_jacobian (Lemma C.2)")
    if not 0 <= head < w.h:
        raise ValueError(f"head index {head} out of range for h = {w.h}")
    return dense_jacobian_formula(X, w.A()[head], w.VO()[head], causal=causal)


def _single_head(Xs, wq, wk, wv, wo, bq, bk, bv, causal: bool):
    """One head on one sequence: Xs (n, d) -> (n, d) (building block of the dense oracle)."""
    S = (Xs @ wq + bq) @ (Xs @ wk + bk).T / math.sqrt(wq.shape[-1])
    if causal:
        S = S.masked_fill(causal_mask(Xs.shape[0], Xs.device), float("-inf"))
    return torch.softmax(S, -1) @ (Xs @ wv + bv) @ wo


def dense_head_jacobians(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """Explicit per-head Jacobians by torch.func.jacrev (oracle for small sizes): (..., n, d) -> (..., h, nd, nd)."""
    _check_w(w)
    check_input(X, w.d)
    n, d = X.shape[-2:]
    Xf = X.reshape(-1, n, d)
    z = torch.zeros(w.h, w.dh, dtype=w.dtype, device=w.device)
    bq, bk, bv = (z if b is None else b for b in (w.bq, w.bk, w.bv))
    jac = torch.func.jacrev(lambda Xs, *p: _single_head(Xs, *p, causal))  # (n, d, n, d)
    per_head = torch.func.vmap(jac, in_dims=(None, 0, 0, 0, 0, 0, 0, 0))
    J = torch.func.vmap(per_head, in_dims=(0,) + (None,) * 7)(Xf, w.wq, w.wk, w.wv, w.wo, bq, bk, bv)
    return J.reshape(*X.shape[:-2], w.h, n * d, n * d)


def head_lipschitz_dense(X: Tensor, w: AttentionWeights, causal: bool = False) -> Tensor:
    """||Df_l(X)|| per head from the dense jacrev Jacobian and an SVD (small sizes only): (..., h)."""
    return torch.linalg.matrix_norm(dense_head_jacobians(X, w, causal), ord=2)
