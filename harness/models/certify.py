"""LoFAST Prop. 1 certification of LipTransformer classifiers by propagating eps layer by layer (docs/math.md §1).

For a stem input u (image or word embeddings) and ||u' - u|| <= eps:
  tokens X0 move by <= L_in eps (L_in = stem Lipschitz constant); each block is LayerProject(1) (1-Lipschitz),
  then residual attention, which maps a token perturbation e to delta(Z_k, e) (Theorem 1 at the block's
  attention input Z_k), then LayerProject(sqrt d) and an SLL layer (both 1-Lipschitz); the head is
  L_head-Lipschitz. The point is certified at eps iff it is classified correctly and its logit margin exceeds
  sqrt(2) L_head e_final (Prop. 1). The certified radius is the largest such eps (bisection; delta is
  increasing in eps).

Bounds: the ball-change bounds of harness.bounds.registry (`BOUNDS`: its built-in Theorem 1 variants naive /
coarse / fine / sharp / refined, harness.bounds.ball_change; `registry.ball_change_names()` adds the second-order certificate
(harness.bounds.second_order: the certified exact local constant of the block plus a curvature term), "best" (the
minimum of all built-in certificates at each layer and eps, sound as each of them is; `Certificate.best_choice`
names the one that won) and the plug-ins registered with bounds="ball_change"). The per-layer terms are computed once per input with harness.bounds.lofast (zeta,
m_norms, xi, naive_delta1) and Theorem 1's polynomial in eps is then evaluated for any eps; `layer_delta` equals
harness.bounds.lofast.delta (tested). A plug-in is called at the layer input Z with the propagated eps (plus eps
itself when it bounds the map without the identity: triangle inequality) and trusted as deterministic. Certificates (`Certificate.certified`, `radius`, `output_bound`, all with
certified=True by default) use the certified upper estimates of zeta and ||M_l|| instead of the Lanczos values
(which approach the norms from below): each estimate holds with probability >= 1 - lofast.FAIL_PROB over the seeded
Gaussian start (Kuczynski-Wozniakowski, docs/math.md §4), so a certificate holds with probability >= 1 - `guarantee`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Optional

import torch

from harness.bounds import lofast, lofast_refined, registry, second_order
from harness.bounds.input_state import InputState
from harness.kernels.attention import AttentionWeights
from harness.kernels.pgd import pgd_maximize
from harness.models.lipvit import LipTransformer, block_inputs
from harness.settings import CERTIFY_EPS

Tensor = torch.Tensor

BOUNDS = tuple(b.name for b in registry.bounds(scope="layer", what="ball_change") if b.theorem1 is not None)
NEEDS_M = tuple(b for b in BOUNDS if registry.get(b, "layer").theorem1.needs_m)  # use the exact ||M_l||
# the built-in certificates beyond Theorem 1: second_order, then best (the minimum of all the others)
CERTIFICATES = tuple(b.name for b in registry.bounds(scope="layer", what="ball_change")
                     if b.theorem1 is None and not b.user)
BUILTIN = BOUNDS + CERTIFICATES  # every built-in certificate, in the registry's order


def _ball_bound(bound: str) -> registry.Bound:
    if bound not in registry.ball_change_names():
        raise ValueError(f"unknown bound {bound!r}; choose from {registry.ball_change_names()} (a plug-in certifies "
                         "when registered with bounds='ball_change', scope='layer')")
    return registry.get(bound, "layer")


@dataclass
class LayerTerms:
    """Theorem 1 ingredients of one attention layer at its inputs Z (B, n, d)."""

    zeta: Tensor  # (B,) Lemma 1
    naive1: Tensor  # (B,) eq. 9 coefficient ||H|| + sum_l ||VO_l|| ||P_l(Z)||
    m: Optional[Tensor]  # (B, h) exact ||M_l(Z)|| (None if not computed)
    xi: Tensor  # (B, h) eq. 21
    b: Tensor  # (h,) ||B_l|| (unscaled wq_l wk_l^T)
    xvo: Tensor  # (B, h) ||Z VO_l||
    xvo_c: Tensor  # (B, h) ||(Z - 1 zbar) VO_l||: what ours (refined, second_order) read (lofast.centered_value_norm)
    vo: Tensor  # (h,) ||VO_l||
    dh: int
    converged: Tensor  # (B,) power iterations converged
    zeta_up: Optional[Tensor] = None  # (B,) certified upper estimate of zeta (probability >= 1 - fail_prob)
    m_up: Optional[Tensor] = None  # (B, h) certified upper estimate of ||M_l||
    fail_prob: float = 0.0  # failure probability of each certified estimate (over the seeded Lanczos start)
    rows: Optional[lofast_refined.RowTerms] = None  # per-row softmax terms of the "refined" bound
    Z: Optional[Tensor] = None  # the layer inputs (B, n, d) and weights, for plug-in ball-change bounds
    w: Optional[AttentionWeights] = None
    truth: Optional[Tensor] = None  # (B,) ||J(Z)|| of the layer map (F + I with the residual), Lanczos
    truth_up: Optional[Tensor] = None  # (B,) its certified upper estimate (the second-order certificate's U)


def layer_terms(Z: Tensor, w: AttentionWeights, fine: bool = True, residual: bool = True, **power) -> LayerTerms:
    """Per-input Theorem 1 terms of the attention layer w (H = I if residual else 0) at Z (B, n, d).

    zeta and ||M_l|| come with certified upper estimates (Lanczos from a seeded Gaussian start run long enough
    for the Kuczynski-Wozniakowski bound with eps = CERTIFY_EPS, capped by the deterministic eq. 9 / eq. 21
    bounds): each holds with probability >= 1 - fail_prob (lofast.FAIL_PROB) over the start vector.
    """
    w = w.to(dtype=Z.dtype, device=Z.device)
    w.require_no_bias("LoFAST certification")
    power = {"certify_eps": CERTIFY_EPS, **power}
    z, zi = lofast.zeta(Z, w, residual=residual, return_info=True, **power)
    conv = zi.converged
    m = m_up = None
    if fine:
        m, mi = lofast.m_norms(Z, w, return_info=True, **power)
        conv = conv & mi.converged
        m_up = mi.m.upper
    one = torch.ones((), dtype=Z.dtype, device=Z.device)
    VO = w.VO()  # (h, d, d)
    tr = None
    if fine:  # the exact local constant of the block's map, for the second-order certificate
        tr = second_order.certified_truth(Z, w, residual=residual, certify_eps=power["certify_eps"],
                                          fail_prob=power.get("fail_prob", lofast.FAIL_PROB))
        conv = conv & tr.converged
    return LayerTerms(
        zeta=z, naive1=lofast.naive_delta1(Z, w, one, residual=residual), m=m, xi=lofast.xi(Z, w),
        b=w.B_norm(), xvo=torch.linalg.matrix_norm(Z.unsqueeze(-3) @ VO, ord=2), xvo_c=lofast.centered_value_norm(Z, w),
        vo=w.VO_norm(), dh=w.dh, converged=conv, zeta_up=zi.zeta.upper, m_up=m_up, fail_prob=zi.zeta.fail_prob,
        rows=lofast_refined.row_terms(Z, w) if fine else None, Z=Z, w=w,
        truth=None if tr is None else tr.value, truth_up=None if tr is None else tr.upper)


def layer_delta(t: LayerTerms, eps: Tensor, bound: str, certified: bool = False) -> Tensor:
    """Theorem 1 (or eq. 9 + coarse Delta_2 for "naive"): output perturbation bound for input perturbation eps (B,).

    certified=False: with the Lanczos values of zeta and ||M_l|| (equal to lofast.delta); certified=True: with
    their certified upper estimates (what a certificate must use: Ritz values approach the norms from below).
    """
    b = _ball_bound(bound)
    v = b.theorem1
    if bound in _CERTIFIERS:
        return _CERTIFIERS[bound](t, eps, certified)
    if v is None:  # a plug-in: trusted as deterministic, so certified changes nothing
        if t.Z is None or t.w is None:
            raise ValueError(f"plug-in bound {bound!r} needs the layer inputs: LayerTerms from layer_terms")
        out = b.fn(InputState(t.Z, t.w), eps)
        return out if b.residual else out + eps  # F + identity changes by at most delta_F + eps
    if v.needs_m and (t.m is None or (v.c == "refined" and t.rows is None)):
        raise ValueError(f"bound {bound!r} needs the exact ||M_l||: compute layer_terms with fine=True")
    if certified and (t.zeta_up is None or (v.needs_m and t.m_up is None)):
        raise ValueError("certified=True needs the certified upper estimates (LayerTerms from layer_terms)")
    return v.delta(eps, zeta=t.zeta_up if certified else t.zeta, naive1=t.naive1, m_fine=t.m_up if certified else t.m,
                   xi=t.xi, b=t.b, xvo=t.xvo_c if v.c == "refined" else t.xvo, vo=t.vo, dh=t.dh, rows=t.rows)


def _second_order_delta(t: LayerTerms, eps: Tensor, certified: bool) -> Tensor:
    """The second-order certificate (harness.bounds.second_order) of the block's map at Z: U eps + eps^2/2 K(eps),
    U = ||J(Z)|| of F (+ I) (its certified upper estimate when certified), K from ||M_l|| (likewise)."""
    if t.truth is None or t.m is None or t.rows is None:
        raise ValueError("bound 'second_order' needs the layer's exact local constant and ||M_l||: compute "
                         "layer_terms with fine=True")
    m = t.m_up if certified else t.m
    U = t.truth_up if certified else t.truth
    curv = second_order.CurvatureTerms(m=m, b=t.b, xvo=t.xvo_c, vo=t.vo, dh=t.dh, rows=t.rows)
    return second_order.delta(U, curv, eps)


def _best_delta(t: LayerTerms, eps: Tensor, certified: bool) -> Tensor:
    """The minimum of every built-in certificate at (Z, eps) (registry.best_members): sound as each of them is."""
    return torch.stack([layer_delta(t, eps, n, certified) for n in registry.best_members()]).amin(0)


_CERTIFIERS = {"second_order": _second_order_delta, "best": _best_delta}  # the certificates beyond Theorem 1


def _layer_failure(t: LayerTerms, estimates) -> float:
    """Failure probability of one layer's certified estimates in `estimates` (any of "zeta", "m": each head's
    ||M_l||, "truth": the layer's ||J||), each holding with probability >= 1 - t.fail_prob: the union bound."""
    count = ("zeta" in estimates) + ("truth" in estimates) + (t.m_up.shape[-1] if "m" in estimates else 0)
    return t.fail_prob * count


@dataclass
class Certificate:
    """Everything Prop. 1 needs for a batch: margins, correctness, Lipschitz constants, per-layer terms."""

    logits: Tensor  # (B, C)
    y: Tensor  # (B,)
    margin: Tensor  # (B,) [F]_y - max_{j != y} [F]_j (negative when misclassified)
    L_in: float
    L_head: float
    layers: List[LayerTerms]

    @property
    def correct(self) -> Tensor:
        return self.margin > 0

    @property
    def guarantee(self) -> float:
        """Failure probability of the certificates (union over every estimated zeta, ||M_l|| and layer ||J||)."""
        return float(sum(_layer_failure(t, ("zeta",) if t.m_up is None else ("zeta", "m", "truth"))
                         for t in self.layers))

    def guarantee_of(self, bound: str) -> float:
        """Failure probability of `bound`'s certificates per input, the union bound over the certified estimates
        it uses (Theorem1Variant.estimates): none for "naive" (eq. 9 and the coarse Delta_2 are deterministic) and
        plug-ins (trusted), zeta of every layer for "coarse" (xi is deterministic), zeta and every ||M_l|| for
        "fine" / "sharp" / "refined" (= `guarantee`). ValueError if the certificate lacks those estimates."""
        est = _ball_bound(bound).estimates
        if "m" in est and any(t.m_up is None for t in self.layers):
            raise ValueError(f"bound {bound!r} uses the exact ||M_l||, but this certificate was made with fine=False "
                             "(no ||M_l|| estimates): certify with fine=True")
        return float(sum(_layer_failure(t, est) for t in self.layers))

    def best_choice(self, eps: Tensor) -> List[str]:
        """Which certificate gives the last layer's change when "best" propagates eps (B,): the member of
        registry.best_members() with the smallest change there, per input (B names)."""
        e = eps * self.L_in
        for t in self.layers[:-1]:
            e = layer_delta(t, e, "best", certified=True)
        names = registry.best_members()
        vals = torch.stack([layer_delta(self.layers[-1], e, n, certified=True) for n in names])  # (bounds, B)
        return [names[i] for i in vals.argmin(0).tolist()]

    def output_bound(self, eps: Tensor, bound: str, certified: bool = True) -> Tensor:
        """Bound on ||F(u') - F(u)||_2 (logits) for ||u' - u|| <= eps (B,), propagated layer by layer (certified:
        with the upper estimates of zeta and ||M_l||, valid with probability >= 1 - guarantee)."""
        e = eps * self.L_in
        for t in self.layers:
            e = layer_delta(t, e, bound, certified)
        return e * self.L_head

    def certified(self, eps, bound: str, certified: bool = True) -> Tensor:
        """Prop. 1: margin > sqrt(2) delta(u, eps): (B,) bool."""
        e = torch.as_tensor(eps, dtype=self.margin.dtype).expand_as(self.margin)
        return self.correct & (self.margin > math.sqrt(2.0) * self.output_bound(e, bound, certified))

    def radius(self, bound: str, iters: int = 50, certified: bool = True) -> Tensor:
        """Largest certified eps per input by bisection (0 when misclassified): (B,)."""
        lo = torch.zeros_like(self.margin)
        hi = torch.ones_like(self.margin)
        for _ in range(60):  # grow hi until it fails everywhere
            ok = self.certified(hi, bound, certified)
            if not ok.any():
                break
            hi = torch.where(ok, 2 * hi, hi)
        for _ in range(iters):
            mid = (lo + hi) / 2
            ok = self.certified(mid, bound, certified)
            lo = torch.where(ok, mid, lo)
            hi = torch.where(ok, hi, mid)
        return torch.where(self.correct, lo, torch.zeros_like(lo))


def margins(logits: Tensor, y: Tensor) -> Tensor:
    """[F]_y - max_{j != y} [F]_j: (B, C), (B,) -> (B,)."""
    true = logits.gather(-1, y[:, None]).squeeze(-1)
    other = logits.scatter(-1, y[:, None], float("-inf")).amax(-1)
    return true - other


@torch.no_grad()
def certify(model: LipTransformer, u: Tensor, y: Tensor, fine: bool = True, **power) -> Certificate:
    """Prop. 1 ingredients for stem inputs u (B, ...) with labels y (B,); model evaluated in u's dtype."""
    if u.shape[0] != y.shape[0]:
        raise ValueError(f"u has {u.shape[0]} inputs but y has {y.shape[0]} labels")
    model = model.eval()
    logits, Zs = block_inputs(model, u)
    ws = model.attention_weights()
    layers = [layer_terms(Z, w, fine=fine, **power) for Z, w in zip(Zs, ws)]
    return Certificate(logits, y, margins(logits, y), model.stem_lipschitz(), model.head_lipschitz(), layers)


def pgd_attack(model: LipTransformer, u: Tensor, y: Tensor, eps: float, steps: int = 20, restarts: int = 2,
               seed: int = 0) -> Tensor:
    """Empirical attack: the largest max_{j != y} [F]_j - [F]_y found over ||u' - u||_F <= eps: (B,).

    The point is broken (misclassified) iff the value is >= 0. Unconstrained l2 ball (no [0, 1] box), the
    threat model of the certificate.
    """
    model = model.eval()

    def objective(v: Tensor) -> Tensor:  # (B, ...) -> (B,)
        return -margins(model(v), y)

    return pgd_maximize(objective, u, float(eps), steps=steps, restarts=restarts, batch_dims=1, seed=seed).value


def mnorm_ratio(cert: Certificate) -> Dict[str, float]:
    """Mean and min over layers, heads and inputs of ||M_l|| / xi_l (exact vs eq. 21)."""
    rs = [t.m / t.xi for t in cert.layers if t.m is not None]
    if not rs:
        return {"m_over_xi_mean": float("nan"), "m_over_xi_min": float("nan")}
    r = torch.cat([x.flatten() for x in rs])
    return {"m_over_xi_mean": float(r.mean()), "m_over_xi_min": float(r.min())}
