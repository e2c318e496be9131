"""What `analyze` (core.py) and its position-term path (modern.py) share: analyze's own methods beside the
registry's bounds (EXTRA), the input state whose truths carry a certified upper estimate (AnalyzeState), and the
table rows of those methods with their soundness check (rows_extra). Both import this module; neither imports
the other's callers, so the package has no import cycle.
"""
from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from harness.bounds import registry
from harness.bounds.input_state import InputState
from harness.kernels.layer import certified_norm, gaussian_start
from harness.kernels.starts import weight_tensors
from harness.kernels.mixed import applies as mixed_applies, truth as mixed_truth
from harness.settings import CERTIFY_STEPS, REPORT_FAIL_PROB

Tensor = torch.Tensor
EXTRA = {  # analyze's own columns beside the registry's bounds: name -> (scope, kind, bounds, label)
    "truth_upper": ("both", "upper", "local", "true ||J(X)||, certified upper estimate (prob. >= 1 - fail_prob)"),
    "pgd": ("layer", "lower", "eps-ball", "PGD max ||F(X') - F(X)||_F / eps"),
    "prop34": ("head", "lower", "ball", "Castin Prop. 3.4 lower bound on B_R^n (bias-free map)"),
    "gamma_R2": ("head", "info", "ball", "Castin gamma R^2 (bias-free A)"),
    "log10_n_star": ("head", "info", "ball", "log10 n* = gamma R^2 / ln 10 (sqrt(n) growth below n*)"),
}


class AnalyzeState(InputState):
    """bounds.input_state.InputState whose truths start from a Gaussian drawn before looking, so they also carry
    the Kuczynski-Wozniakowski certified upper estimate (`upper[scope]`, probability >= 1 - fail_prob over the start;
    kernels.layer.certified_norm, docs/math.md §4).

    mixed=True (float64 inputs): the truths iterate in float32 and are refined in float64 (harness.kernels.mixed:
    the same float64 stopping test, the KW estimate padded for float32 rounding). zeta and ||M_l|| stay in float64:
    their tolerance (settings.norm_tol, 1e-10) is five decades below float32's, and a float64 phase restarted from
    one float32 Ritz vector then costs about as many products as float64 alone (docs/notes/kernels.md)."""

    def __init__(self, X: Tensor, w, causal: bool = False, tol: Optional[float] = None, iters: int = 2000,
                 fail_prob: float = REPORT_FAIL_PROB, seed: int = 0, certify_steps: int = CERTIFY_STEPS,
                 mixed: bool = False):
        self.fail_prob, self.seed, self.certify_steps = float(fail_prob), int(seed), int(certify_steps)
        super().__init__(X, w, causal, tol, iters,
                         certify=dict(steps=self.certify_steps, fail_prob=self.fail_prob, seed=self.seed))
        self.mixed = bool(mixed) and mixed_applies(self.X)

    def _truth(self, heads: bool):
        if not self.mixed:
            return super()._truth(heads)
        r = mixed_truth(self.X, self.w, self.causal, heads, self.tol, self.iters, self.seed,
                        dict(steps=self.certify_steps, fail_prob=self.fail_prob))
        return r.value, r.converged, r.upper

    def _lanczos_norm(self, X: Tensor, matvec, rmatvec):
        """kernels.layer.certified_norm of the operator (matvec, rmatvec) at X with this state's settings:
        (value, converged, upper), each (...,) over X's batch dims."""
        x0 = gaussian_start(X, self.seed, f"map;causal={bool(self.causal)}", weight_tensors(self.w))
        r = certified_norm(matvec, rmatvec, X, self.tol, self.iters, self.seed, self.certify_steps, self.fail_prob,
                           x0=x0)
        return r.value, r.converged, r.upper


def truth_uppers(s: AnalyzeState) -> dict:
    """{("truth_upper", scope): (certified upper estimate of the truth, guaranteed)} for the head and layer scopes
    (computes the truths if they are not yet)."""
    yes = torch.ones(s.X.shape[0], dtype=torch.bool)
    out = {}
    for scope in ("head", "layer"):
        _ = s.truth_head if scope == "head" else s.truth_layer
        out[("truth_upper", scope)] = (s.upper[scope], yes)
    return out


def rows_extra(s: AnalyzeState, ev: registry.Evaluation, extra: dict, meta: Sequence[dict]) -> List[dict]:
    """Table rows of analyze's own methods `extra` ({(method, scope): (values, guaranteed)}; a name outside EXTRA
    is a registry certificate), each with its soundness (registry.is_sound) against the truth, PGD or Castin."""
    rows = []
    for (name, scope), (val, ok) in extra.items():
        if name in EXTRA:
            _, kind, bounds, _ = EXTRA[name]
            uses, user = (), False
        else:  # a registry certificate: delta(X, eps) / eps
            b = registry.get(name, "layer")
            kind, bounds, uses, user = b.kind, "eps-ball", b.uses, b.user
        truth = ev.truth(scope).detach().cpu()
        tconv = s.all_converged(["truth_" + scope, *uses]).cpu()
        val = val.detach().cpu()
        ref = None  # what the soundness of this row is checked against
        if bounds == "local":
            ref = truth
        elif bounds == "eps-ball" and kind == "upper" and ("pgd", "layer") in extra:
            ref = extra[("pgd", "layer")][0].detach().cpu()
        elif name == "prop34" and ("castin", "head") in ev.values:
            ref = ev.values[("castin", "head")].detach().cpu()
        for b in range(val.shape[0]):
            v_b = val[b].reshape(-1).tolist()
            t_b = truth[b].reshape(-1).tolist()
            for j, v in enumerate(v_b):
                sound = ref is None or registry.is_sound(kind, v, float(ref[b].reshape(-1)[j]), bool(ok[b]))
                t = t_b[j]
                rows.append(dict(meta[b], scope=scope, head=j if scope == "head" else -1, method=name, kind=kind,
                                 bounds=bounds, value=v, truth=t, ratio=v / t if t > 0 else float("nan"),
                                 converged=bool(tconv[b]), guaranteed=bool(ok[b]), sound=bool(sound), user=user))
    return rows
