"""`attnlip analyze` on layers whose map carries position terms (RoPE, T5's relative bias, DeBERTa's c2p / p2c;
harness.models.adapters_modern.AttentionMap): the truth by Lanczos on the exact map, the bounds proven for it,
"n/a" rows (with the reason) for the others.

MapState computes every quantity a bound proven for these maps reads from the actual map (bounds.registry's
ANY_SCORES note): the attention maps P, zeta = ||dX -> sum_l P_l dX wv_l wo_l|| (LoFAST Lemma 1, which holds for
any fixed P) and m_l = sqrt(dh) ||J_{s_l}(X)||, the exact norm of head l's score Jacobian (LoFAST Lemma 2's
||M_l(X)|| for standard scores), all matrix-free (torch.func.jvp / vjp, restarted Lanczos).
"""
from __future__ import annotations

import functools
import math
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import torch

from harness.analyze.options import AnalyzeOptions
from harness.analyze.state import EXTRA, AnalyzeState, rows_extra, truth_uppers
from harness.bounds import registry
from harness.kernels.pgd import pgd_maximize
from harness.models.adapters_modern import AttentionMap
from harness.settings import CERTIFY_STEPS, REPORT_FAIL_PROB

Tensor = torch.Tensor
CERTIFICATE_NOT_PROVEN = ("the eps-ball certificates bound the change of standard scores x_i W_Q W_K^T x_j / sqrt(dh) "
                          "(||W_Q W_K^T||-type factors and their second derivative)")
NOT_PROVEN_EXTRA = {  # analyze's own methods that assume standard scores -> the reason they are n/a
    "prop34": "Castin Prop. 3.4 is for standard scores x_i^T A x_j without position terms",
    "gamma_R2": "Castin's gamma is for standard scores x_i^T A x_j without position terms",
    "log10_n_star": "Castin's gamma is for standard scores x_i^T A x_j without position terms",
}


class MapState(AnalyzeState):
    """AnalyzeState of an AttentionMap: truth, P, zeta and m_fine from the exact map (see the module docstring).
    The map is an opaque function of X in the model's dtype, so its norms run in that dtype throughout: `mixed` is
    accepted (AnalyzeOptions.state_kw) and not used."""

    def __init__(self, X: Tensor, amap: AttentionMap, tol: Optional[float] = None, iters: int = 2000,
                 fail_prob: float = REPORT_FAIL_PROB, seed: int = 0, certify_steps: int = CERTIFY_STEPS,
                 mixed: bool = False):
        super().__init__(X, amap.w, amap.causal, tol, iters, fail_prob, seed, certify_steps, mixed=False)
        self.amap = amap

    def _norm(self, f, X: Tensor):
        """||J_f(X)|| for f acting on (..., n, d) batches: (value, converged, certified upper) over X's batch
        dims, Lanczos on J^T J from a seeded Gaussian (at least certify_steps products; docs/math.md §4)."""
        X = X.detach()
        _, vjp = torch.func.vjp(f, X)
        return self._lanczos_norm(X, lambda U: torch.func.jvp(f, (X,), (U,))[1], lambda G: vjp(G)[0])

    def _heads_input(self) -> Tensor:
        X = self.X
        return X.unsqueeze(-3).expand(*X.shape[:-2], self.w.h, *X.shape[-2:]).contiguous()

    @functools.cached_property
    def truth_head(self) -> Tensor:
        value, conv, self.upper["head"] = self._norm(self.amap.heads, self._heads_input())
        self.converged["truth_head"] = conv.all(-1)
        return value

    @functools.cached_property
    def truth_layer(self) -> Tensor:
        value, self.converged["truth_layer"], self.upper["layer"] = self._norm(self.amap.layer, self.X)
        return value

    @functools.cached_property
    def P(self) -> Tensor:
        return self.amap.probs(self.X)

    @functools.cached_property
    def zeta(self) -> Tensor:
        P, w = self.P.detach(), self.w
        VO = w.wv @ w.wo  # (h, d, d)
        value, self.converged["zeta"], _ = self._norm(lambda U: (P @ U.unsqueeze(-3) @ VO).sum(-3), self.X)
        return value

    @functools.cached_property
    def m_fine(self) -> Tensor:
        value, conv, _ = self._norm(self.amap.scores, self._heads_input())
        self.converged["m"] = conv.all(-1)
        return value * math.sqrt(self.w.dh)


def split(names: Optional[Iterable[str]], features: Sequence[str], causal: bool
          ) -> Tuple[List[str], Dict[Tuple[str, str], str]]:
    """(registry names proven for these score features, {(name, scope): reason} for the requested others)."""
    ok, na = [], {}
    for b in registry.bounds(names=None if names is None else list(names), causal=causal or None, what=registry.LOCAL):
        why = b.unproven(features)
        if why is None:
            ok.append(b.name)
        else:
            na[b.key] = why
    return list(dict.fromkeys(ok)), na


def extra(s: MapState, opts: AnalyzeOptions, want: Optional[set] = None) -> Tuple[dict, Dict[Tuple[str, str], str]]:
    """analyze's extra methods on the exact map: truth_upper always, PGD (eps > 0) on F itself (causal too);
    returns (values as core._extra gives them, {(method, scope): reason} for those not proven here)."""
    ok = lambda m: want is None or m in want
    G = s.X.shape[0]
    yes = torch.ones(G, dtype=torch.bool)
    out = truth_uppers(s)
    e = float(opts.eps)
    if e > 0 and ok("pgd") and opts.pgd_steps > 0:
        F0 = s.amap.layer(s.X).detach()
        obj = lambda Z: (s.amap.layer(Z) - F0).flatten(-2).norm(dim=-1)
        res = pgd_maximize(obj, s.X, e, steps=opts.pgd_steps, restarts=opts.pgd_restarts, seed=opts.seed)
        out[("pgd", "layer")] = (res.value / e, yes)
    scopes = {"prop34": "head", "gamma_R2": "head", "log10_n_star": "head"}
    na = {(m, scopes[m]): why for m, why in NOT_PROVEN_EXTRA.items() if ok(m)}
    if e > 0:  # the certificates' eps-ball terms bound the change of standard scores q k^T / sqrt(dh) only
        na.update({(m, "layer"): CERTIFICATE_NOT_PROVEN for m in registry.ball_change_names() if ok(m)})
    return out, na


def na_rows(ev: registry.Evaluation, na: Dict[Tuple[str, str], str], kinds: Dict[str, tuple],
            meta: Sequence[dict]) -> List[dict]:
    """One row per (input, head or layer) of each method not proven for the map: value and ratio NaN, the truth
    beside it, the reason in `note`. kinds: method -> (kind, bounds, user)."""
    rows = []
    nan = float("nan")
    for (name, scope), why in na.items():
        kind, bounds, user = kinds[name]
        truth = ev.truth(scope).detach().cpu()
        for b, m in enumerate(meta):
            for j, t in enumerate(truth[b].reshape(-1).tolist()):
                rows.append(dict(m, scope=scope, head=j if scope == "head" else -1, method=name, kind=kind,
                                 bounds=bounds, value=nan, truth=t, ratio=nan, converged=True, guaranteed=False,
                                 sound=True, user=user, note=f"n/a: {why}"))
    return rows


def rows(X: Tensor, amap: AttentionMap, names: Optional[List[str]], meta: Sequence[dict], opts: AnalyzeOptions,
         methods: Optional[List[str]]) -> List[dict]:
    """core.analyze's rows for one group of equal-length inputs X (G, n, d) of a layer with map `amap`."""
    s = MapState(X, amap, **opts.state_kw())
    ok, na = split(names, amap.features, amap.causal)
    ev = registry.evaluate(X, amap.w, amap.causal, names=ok, state=s)
    out = []
    for r in ev.rows():
        r.update(meta[r.pop("sample")], bounds="local", user=registry.get(r["method"], r["scope"]).user)
        out.append(r)
    want = None if methods is None else set(methods)
    ex, na_extra = extra(s, opts, want)
    out += rows_extra(s, ev, ex, meta)
    kinds = {b.name: (b.kind, "eps-ball" if b.bounds == "ball_change" else "local", b.user) for b in registry.bounds()}
    kinds.update({m: (v[1], v[2], False) for m, v in EXTRA.items()})
    out += na_rows(ev, {**na, **na_extra}, kinds, meta)
    return out
