"""THE list of bounds of self-attention (local constants, ball constants, eps-ball changes): each declared once, here.

A `Bound` says what it is (name, paper, kind: upper / lower / exact), what its value bounds (`bounds`: "local",
the local constant ||J(X)||; "ball", a Lipschitz constant over a ball of inputs around X, hence also the local
one; "ball_change", the change over an eps-ball, delta(X, eps) >= sup_{||X'-X||_F <= eps} ||F(X') - F(X)||_F,
whose fn takes (state, eps): what certification propagates), at which scope it gives values (`head`:
one value per head, (..., h); `layer`: one per multi-head layer, (...,)), which map it bounds (`map`, `residual`),
whether it supports a causal mask, and, where it only holds in some regime, a `guaranteed(state)` predicate
(...,) bool. Consumers (bound_leaderboard, the JaSMin experiments, `attnlip analyze`, certification) iterate over
`bounds()` instead of keeping their own lists; `register_bound` adds a user's bound the same way.

The maps (docs/math.md §0), at an input X (..., n, d) with AttentionWeights w (biases as w has them):
    head map   f_l(X) = P_l(X) (X wv_l + bv_l) wo_l                    (scope "head")
    layer map  F(X)   = sum_l f_l(X) + bo   (+ X when residual)       (scope "layer")
A per-head upper bound b_l gives the layer bound sum_l b_l (triangle inequality; bo is a constant); such layer
entries are registered with `from_heads=True`.

`evaluate(X, w, causal=...)` computes every registered bound (or `names`) for one input state, sharing what they
read (`InputState`, harness.bounds.input_state), and returns an `Evaluation` (values, truth, flags, `.rows()`).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import torch

from harness.bounds import castin, jasmin, kim
from harness.bounds.state_maps import (kim_ok, lofast_limit, lofast_naive_layer, refined_c, residual_changes,
                                       second_order_at)
from harness.bounds.ball_change import VARIANTS, Theorem1Variant
from harness.bounds.input_state import InputState
from harness.kernels.attention import AttentionWeights
from harness.plugins import guarded, is_guarded, load_function
from harness.bounds.soundness import is_sound  # noqa: F401 - THE soundness rule, part of this interface
from harness.settings import ITERS, SOUND_RTOL  # noqa: F401 - its tolerance, read by the consumers of is_sound

Tensor = torch.Tensor

SCOPES = ("head", "layer")
KINDS = ("upper", "lower", "exact")
WHAT = ("local", "ball", "ball_change")  # what a value bounds (see the module docstring)
HEAD_MAP = "f_l(X) = P_l(X) (X wv_l + bv_l) wo_l"
LAYER_MAP = "F(X) = sum_l f_l(X) + bo"
# Score terms of current architectures (harness.models.adapters_modern). Grouped- and multi-query attention need
# none: repeating each key/value head for the query heads it serves gives the same map in the standard form.
FEATURES = {"rope": "rotary position embeddings (scores x_i W_Q R_(j-i) W_K^T x_j)",
            "score_bias": "an additive relative position bias on the scores (T5)",
            "rel_pos": "content-to-position / position-to-content score terms (DeBERTa)"}
# Proven for every score map s_l(X): with P_l = softmax(s_l(X)) and V'_l = (X wv_l + bv_l) wo_l,
# dF = sum_l P_l dX wv_l wo_l + sum_l dP_l V'_l and ||dP_l||_F <= 1/2 ||J_{s_l}(X)|| ||dX||_F (each row's softmax
# Jacobian diag(p) - p p^T has norm <= 1/2), so ||J_F|| <= zeta(P) + 1/2 sum_l ||J_{s_l}(X)|| ||V'_l||, where the
# state gives P, zeta and m_l = sqrt(dh) ||J_{s_l}(X)|| of the actual map (harness.analyze.modern.MapState).
ANY_SCORES = tuple(FEATURES)


# ---- the declaration ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bound:
    """One registered bound. `fn(state)` returns (..., h) for scope "head", (...,) for scope "layer"."""

    name: str
    scope: str
    fn: Callable[[InputState], Tensor]
    paper: str
    label: str
    kind: str = "upper"
    map: str = ""  # the map bounded (HEAD_MAP / LAYER_MAP by default)
    residual: bool = False  # True if the map includes the identity (F(X) + X)
    causal: bool = True  # valid under a causal mask
    guaranteed: Optional[Callable[[InputState], Tensor]] = None  # (...,) bool; None: always valid
    uses: Tuple[str, ...] = ()  # InputState power iterations it reads (for its convergence flag)
    from_heads: bool = False  # layer value = sum over heads of the head entry of the same name
    note: str = ""
    user: bool = False  # registered through register_bound by a user (a plug-in)
    proven_for: Tuple[str, ...] = ()  # score FEATURES beyond softmax(q k^T / sqrt(dh)) under which it is proven
    bounds: str = "local"  # one of WHAT
    theorem1: Optional[Theorem1Variant] = None  # a Theorem 1 certificate: its ingredients (certification)
    # the certified estimates a certificate from this bound rests on ("zeta", "m", "truth"; certification's
    # failure probability is the union bound over them); () for deterministic bounds and plug-ins
    estimates: Tuple[str, ...] = ()

    def unproven(self, features: Iterable[str]) -> Optional[str]:
        """None if the bound is proven for an attention map with these score features, else the reason."""
        miss = [f for f in features if f not in self.proven_for]
        if not miss:
            return None
        return (f"{self.label} is proven for scores x_i W_Q W_K^T x_j / sqrt(dh) only, not with "
                + "; ".join(FEATURES[f] for f in miss))

    @property
    def key(self) -> Tuple[str, str]:
        return (self.name, self.scope)


_BOUNDS: Dict[Tuple[str, str], Bound] = {}


def _add(b: Bound, replace: bool = False) -> Bound:
    if b.scope not in SCOPES:
        raise ValueError(f"bound {b.name!r}: scope must be one of {SCOPES}, got {b.scope!r}")
    if b.kind not in KINDS:
        raise ValueError(f"bound {b.name!r}: kind must be one of {KINDS}, got {b.kind!r}")
    if b.bounds not in WHAT:
        raise ValueError(f"bound {b.name!r}: bounds must be one of {WHAT}, got {b.bounds!r}")
    if b.bounds == "ball_change" and (b.scope != "layer" or b.kind != "upper"):
        raise ValueError(f"bound {b.name!r}: a ball_change bound is an upper bound with scope 'layer' (the change "
                         f"of the whole layer over the eps-ball), got kind {b.kind!r}, scope {b.scope!r}")
    if not b.name or not b.name.replace("_", "").isalnum():
        raise ValueError(f"bound name must be a non-empty identifier, got {b.name!r}")
    if b.key in _BOUNDS and not replace:
        raise ValueError(f"bound {b.name!r} (scope {b.scope}) is already registered")
    if not b.map:
        b = Bound(**{**b.__dict__, "map": HEAD_MAP if b.scope == "head" else LAYER_MAP})
    _BOUNDS[b.key] = b
    return b


def _sum_heads(name: str) -> Callable[[InputState], Tensor]:
    def fn(s: InputState) -> Tensor:
        return get(name, "head").fn(s).sum(-1)

    return fn


def declare(name: str, paper: str, label: str, head=None, layer=None, replace: bool = False, **meta) -> List[Bound]:
    """Register `name` at scope head (fn `head`) and layer (fn `layer`, or the sum over heads if layer is None
    and head is given, for upper bounds)."""
    out = []
    if head is not None:
        out.append(_add(Bound(name, "head", head, paper, label, **meta), replace))
    if layer is not None:
        out.append(_add(Bound(name, "layer", layer, paper, label, **meta), replace))
    elif head is not None and meta.get("kind", "upper") == "upper":
        out.append(_add(Bound(name, "layer", _sum_heads(name), paper, label, from_heads=True, **meta), replace))
    if not out:
        raise ValueError(f"bound {name!r}: give a head and/or a layer function")
    return out


def best_members() -> List[str]:
    """The certificates the "best" bound takes the minimum of: every built-in ball-change bound but itself."""
    return [b.name for b in _BOUNDS.values() if b.bounds == "ball_change" and not b.user and b.name != "best"]


def _best(s: InputState, eps) -> Tensor:
    """The minimum over best_members() at (X, eps): each bounds the change over the ball, so their minimum does."""
    vals = [get(n, "layer").fn(s, eps) for n in best_members() if s.causal is False or get(n, "layer").causal]
    return torch.stack(torch.broadcast_tensors(*vals)).amin(0)


def _builtins() -> None:
    truth = dict(paper="true local Lipschitz constant", label="true ||J(X)|| (Lanczos)", kind="exact",
                 proven_for=ANY_SCORES,
                 note="kernels.layer operator, restarted Lanczos; within the Lanczos tolerance of the truth")
    _add(Bound("truth", "head", lambda s: s.truth_head, uses=("truth_head",), **truth))
    _add(Bound("truth", "layer", lambda s: s.truth_layer, uses=("truth_layer",), **truth))
    declare("kim", "JaSMin (Yudin et al.) Thm 1, after Kim et al. / Specformer", "Kim/Specformer (Thm 1)",
            head=lambda s: kim.bound(s.X, s.w, 0.0), guaranteed=kim_ok,
            note="valid where (||X||_F)^2 sqrt(n)(n+1) >= 1 (harness.bounds.kim.guaranteed); norms only")
    declare("castin", "Castin et al. Thm 3.3 / Thm 4.3 (masked)", "Castin Thm 3.3",
            head=lambda s: castin.bound(s.X, s.w, s.causal), bounds="ball",
            note="bound on the ball of radius R = max token norm, hence on the local constant")
    declare("jasmin", "JaSMin (Yudin et al.) Thm 3, exact ||J_sm||", "JaSMin Thm 3 (exact)",
            head=lambda s: jasmin.from_terms(s.jasmin_terms, use_g1=False))
    declare("jasmin_g1", "JaSMin (Yudin et al.) Thm 3 with g_1 (Cor. 1)", "JaSMin Thm 3 (g_1)",
            head=lambda s: jasmin.from_terms(s.jasmin_terms, use_g1=True))
    for name, m, c, label in (("lofast_fine", "m_fine", 1.0, "LoFAST eps->0 (fine)"),
                              ("lofast_coarse", "m_coarse", 1.0, "LoFAST eps->0 (coarse)"),
                              ("lofast_sharp", "m_fine", 0.5, "LoFAST eps->0 (sharpened, c=1/2)")):
        declare(name, "LoFAST (Havens et al.) Thm 1, eps -> 0" + (" with JaSMin Cor. 1's c = 1/2" if c < 1 else ""),
                label, head=lofast_limit(m, c, True), layer=lofast_limit(m, c, False),
                uses=("zeta", "m") if m == "m_fine" else ("zeta",),
                proven_for=ANY_SCORES if m == "m_fine" else (),
                note="causal: masked P in zeta (ours); the Delta_2 terms stay valid under a mask")
    declare("lofast_naive", "LoFAST (Havens et al.) eq. 9 + coarse Delta_2, eps -> 0", "LoFAST eps->0 (naive)",
            layer=lofast_naive_layer)
    declare("lofast_refined", "LoFAST Thm 1, eps -> 0, with the per-row softmax constant min(1/2, max_k p_ik)",
            "LoFAST eps->0 (refined softmax c)", head=lofast_limit("m_fine", refined_c, True, centered=True),
            layer=lofast_limit("m_fine", refined_c, False, centered=True), uses=("zeta", "m"), proven_for=ANY_SCORES,
            note="||J_sm(p)|| <= min(1/2, max_k p_k) per row (docs/math.md §1); the eps-ball version certifies "
                 "(harness.bounds.lofast_refined, certify bound 'refined')")
    for name, (variant, label, paper) in VARIANTS.items():  # Theorem 1 at finite eps: the certificates
        declare(name, paper, label, layer=lambda s, eps, v=variant: v.at_state(s, eps), bounds="ball_change",
                theorem1=variant, uses=("zeta", "m") if variant.needs_m else ("zeta",),
                estimates=tuple(e for e in variant.estimates.split("+") if e),
                proven_for=ANY_SCORES if variant.needs_m and variant.delta1 == "zeta" else (),
                note="delta(X, eps) of Theorem 1, certify with harness.models.certify")
    declare("second_order", "ours: Taylor's theorem, the exact local constant plus a curvature term (docs/math.md §1)",
            "exact ||J|| + curvature eps^2/2 (ours)", layer=second_order_at, bounds="ball_change",
            uses=("truth_layer", "m"), estimates=("truth", "m"),
            note="U eps + eps^2/2 K(eps), U the truth (its KW upper estimate when the state is certified), K a bound "
                 "on the second derivative over the ball (harness.bounds.second_order); tends to the truth as eps -> 0")
    declare("best", "ours: the minimum of every built-in certificate (each sound, so the minimum is)",
            "best of all certificates (ours)", layer=_best, bounds="ball_change", uses=("zeta", "m", "truth_layer"),
            estimates=("zeta", "m", "truth"),
            note="min over naive, coarse, fine, sharp, refined and second_order at each (X, eps); plug-ins are reported "
                 "beside it, not inside it (their soundness is their author's claim)")


_builtins()


# ---- user bounds --------------------------------------------------------------------------------------------
def register_bound(fn: Callable, name: Optional[str] = None, scope: str = "head", paper: str = "user",
                   label: Optional[str] = None, kind: str = "upper", causal: bool = True,
                   guaranteed: Optional[Callable] = None, replace: bool = False, bounds: str = "local",
                   residual: bool = False) -> List[Bound]:
    """Add a user's bound: `fn(X, w, causal=False)` returning (..., h) per-head (scope "head") or (...,) per-layer
    (scope "layer") values at X (..., n, d), AttentionWeights w; for a single input (h,) or () is accepted. A per-head upper bound also joins the layer
    scope as the sum over heads. `guaranteed(X, w, causal)` -> (...,) bool, optional. Returns the new entries.
    bounds="ball_change" (scope "layer"): `fn(X, w, eps, causal=False)` -> (...,) bounds ||F(X') - F(X)||_F over
    ||X' - X||_F <= eps (eps a number or a (...,) tensor), of F + identity if `residual`; certification uses it.
    `fn` may also be "module:function" (the `--bound` syntax)."""
    if isinstance(fn, str):
        fn = load_function(fn)
    if (name or getattr(fn, "__name__", "")) in {b.name for b in _BOUNDS.values() if not b.user}:
        raise ValueError(f"{name or fn.__name__!r} is a built-in bound: give the plug-in another name")
    if not callable(fn):
        raise ValueError(f"register_bound needs a callable, got {type(fn).__name__}")
    name = name or getattr(fn, "__name__", "")
    spec_ = f"{getattr(fn, '__module__', None) or '?'}:{getattr(fn, '__qualname__', name)}"
    fn = fn if is_guarded(fn) else guarded(fn, spec_)  # private inputs, a time limit, errors naming the plug-in
    guaranteed = guaranteed if guaranteed is None else guarded(guaranteed, spec_ + " (guaranteed)", values=False)
    if scope not in SCOPES:
        raise ValueError(f"scope must be one of {SCOPES}, got {scope!r}")
    takes_causal = "causal" in inspect.signature(fn).parameters
    if bounds == "ball_change" and scope != "layer":
        raise ValueError(f"bound {name!r}: a ball_change bound gives the change of the whole layer: use scope='layer'")

    def call(s: InputState, *eps) -> Tensor:
        out = fn(s.X, s.w, *eps, causal=s.causal) if takes_causal else fn(s.X, s.w, *eps)
        out = torch.as_tensor(out, dtype=s.X.dtype, device=s.X.device)
        want = (*s.X.shape[:-2], s.w.h) if scope == "head" else tuple(s.X.shape[:-2])
        if tuple(out.shape) == want[len(s.X.shape) - 2:] and math.prod(s.X.shape[:-2]) == 1:
            out = out.reshape(want)  # one input: (h,) per head or () per layer, without its batch axes
        if tuple(out.shape) != want:
            raise ValueError(f"user bound {name!r} returned shape {tuple(out.shape)}, expected {want} (scope {scope})")
        return out

    if not takes_causal and causal:
        causal = False  # a function that cannot see the mask is only declared for unmasked layers
    g = None if guaranteed is None else (lambda s: torch.as_tensor(guaranteed(s.X, s.w, s.causal), device=s.X.device))
    meta = dict(kind=kind, causal=causal, guaranteed=g, user=True, note=getattr(fn, "__doc__", "") or "",
                bounds=bounds, residual=bool(residual))
    return declare(name, paper, label or name, replace=replace,
                   **({"head": call} if scope == "head" else {"layer": call}), **meta)


def register_plugin(fn, replace: bool = True, reserved: Iterable[str] = ()) -> List[Bound]:
    """Register a plug-in ("module:function" or a callable) as its attributes declare it: `bound_name` (default:
    the function's name), `scope` ("head" default, or "layer"), `bounds` ("local" default, or "ball_change"),
    `residual`, `paper`. `reserved`: names the caller keeps for itself (an error names the clash)."""
    if isinstance(fn, str):
        fn = load_function(fn)
    name = getattr(fn, "bound_name", None) or getattr(fn, "__name__", "plugin")
    if name in set(reserved):
        raise ValueError(f"plug-in bound {name!r}: the name is taken here; set the function's `bound_name`")
    return register_bound(fn, name=name, scope=getattr(fn, "scope", "head"), paper=getattr(fn, "paper", "user"),
                          bounds=getattr(fn, "bounds", "local"), residual=getattr(fn, "residual", False),
                          replace=replace)


def unregister_bound(name: str) -> None:
    """Remove a user bound (both scopes); built-in bounds cannot be removed."""
    for key in [k for k in _BOUNDS if k[0] == name]:
        if not _BOUNDS[key].user:
            raise ValueError(f"bound {name!r} is built in and cannot be unregistered")
        del _BOUNDS[key]


# ---- queries -------------------------------------------------------------------------------------------------
def bounds(scope: Optional[str] = None, kind: Optional[str] = None, names: Optional[Iterable[str]] = None,
           causal: Optional[bool] = None, what: Optional[Iterable[str]] = None) -> List[Bound]:
    """Registered bounds in declaration order, filtered by scope, kind, names, causal support and what their
    values bound (`what`: a subset of WHAT)."""
    what = None if what is None else ((what,) if isinstance(what, str) else tuple(what))
    names = None if names is None else list(names)
    if names is not None:
        unknown = sorted(set(names) - {k[0] for k in _BOUNDS})
        if unknown:
            raise ValueError(f"unknown bound(s) {unknown}; registered: {bound_names()}")
    return [b for b in _BOUNDS.values() if (scope is None or b.scope == scope) and (kind is None or b.kind == kind)
            and (names is None or b.name in names) and (causal is None or not causal or b.causal)
            and (what is None or b.bounds in what)]


LOCAL = ("local", "ball")  # values that bound the local constant ||J(X)|| (checked against the truth)


def bound_names(kind: Optional[str] = None, what: Optional[Iterable[str]] = None) -> List[str]:
    """Distinct registered names in declaration order (`what`: only those bounding one of these, e.g. LOCAL)."""
    return list(dict.fromkeys(b.name for b in bounds(kind=kind, what=what)))


def ball_change_names() -> List[str]:
    """The eps-ball certificates (built-in, then plug-in; layer scope): what certification and analyze use."""
    return bound_names(what=["ball_change"])


def check_ball_change_names(names: Iterable[str]) -> None:
    """ValueError naming every one of `names` that is not a registered ball-change certificate."""
    bad = [n for n in names if n not in ball_change_names()]
    if bad:
        raise ValueError(f"not a ball-change certificate: {', '.join(map(repr, bad))}; the registered ones are "
                         f"{', '.join(ball_change_names())}")


def get(name: str, scope: str) -> Bound:
    try:
        return _BOUNDS[(name, scope)]
    except KeyError:
        raise ValueError(f"no bound {name!r} at scope {scope!r}; registered: {bound_names()}") from None


def get_any(name: str) -> Bound:
    """The first registered scope of `name`."""
    for b in _BOUNDS.values():
        if b.name == name:
            return b
    raise ValueError(f"no bound {name!r}; registered: {bound_names()}")


def labels() -> Dict[str, str]:
    """name -> human label (for legends)."""
    return {b.name: b.label for b in _BOUNDS.values()}


# ---- evaluation ---------------------------------------------------------------------------------------------
@dataclass
class Evaluation:
    """Values of the evaluated bounds at one input state: values[(name, scope)] (..., h) or (...,)."""

    state: InputState
    values: Dict[Tuple[str, str], Tensor] = field(default_factory=dict)
    converged: Dict[Tuple[str, str], Tensor] = field(default_factory=dict)  # (...,) bool
    guaranteed: Dict[Tuple[str, str], Tensor] = field(default_factory=dict)  # (...,) bool

    def truth(self, scope: str) -> Tensor:
        return self.state.truth_head if scope == "head" else self.state.truth_layer

    def rows(self, **meta) -> List[dict]:
        """Tidy rows, one per (sample, scope, head, method): sample, scope, head (-1 for the layer), method, paper,
        kind, value, truth, ratio, converged, guaranteed, sound (False only for a guaranteed upper bound below
        the truth by more than `tol_sound`), plus `meta`."""
        X = self.state.X
        B = int(math.prod(X.shape[:-2]))
        out = []
        cache = {}
        for (name, scope), v in self.values.items():
            b = get(name, scope)
            if scope not in cache:
                t = self.truth(scope).detach().reshape(B, -1).cpu().tolist()
                tc = self.state.all_converged(["truth_" + scope]).reshape(B).cpu().tolist()
                cache[scope] = (t, tc)
            truth, tconv = cache[scope]
            vals = v.detach().reshape(B, -1).cpu().tolist()
            conv = self.converged[(name, scope)].reshape(B).cpu().tolist()
            ok = self.guaranteed[(name, scope)].reshape(B).cpu().tolist()
            for s in range(B):
                for j, val in enumerate(vals[s]):
                    tr = truth[s][j]
                    ratio = val / tr if tr > 0 else float("nan")
                    sound = is_sound(b.kind, val, tr, ok[s])
                    out.append(dict(meta, sample=s, scope=scope, head=j if scope == "head" else -1, method=name,
                                    kind=b.kind, value=val, truth=tr, ratio=ratio,
                                    converged=bool(conv[s] and tconv[s]), guaranteed=bool(ok[s]), sound=bool(sound)))
        return out


def evaluate(X: Tensor, w: AttentionWeights, causal: bool = False, names: Optional[Iterable[str]] = None,
             scopes: Iterable[str] = SCOPES, tol: Optional[float] = None, iters: int = ITERS,
             state: Optional[InputState] = None, cast: bool = False) -> Evaluation:
    """Every registered bound (or those in `names`; the truth always included) at (X, w), sharing one InputState
    (cast: InputState's). Bounds without causal support are skipped when causal=True; ball changes: `ball_changes`."""
    s = state or InputState(X, w, causal, tol, iters, cast=cast)
    names = None if names is None else list(dict.fromkeys(["truth", *names]))
    ev = Evaluation(s)
    all_ok = torch.ones(s.X.shape[:-2], dtype=torch.bool, device=s.X.device)
    for b in bounds(names=names, causal=s.causal or None, what=LOCAL):
        if b.scope not in scopes:
            continue
        head = (b.name, "head")
        ev.values[b.key] = ev.values[head].sum(-1) if b.from_heads and head in ev.values else b.fn(s)
        ev.guaranteed[b.key] = all_ok if b.guaranteed is None else b.guaranteed(s).to(torch.bool).expand_as(all_ok)
    for key in ev.values:  # after every value: the power iterations they read have run
        b = get(*key)
        ev.converged[key] = s.all_converged(b.uses if not b.from_heads else get(b.name, "head").uses)
    return ev


def ball_changes(state: InputState, eps: float, names: Optional[Iterable[str]] = None,
                 residual: bool = False) -> Dict[str, Tensor]:
    """name -> delta(X, eps) (...,) of every ball-change bound (or those in `names`: unknown ones raise) at `state`;
    residual=True: of X + F(X) (state_maps.residual_changes)."""
    check_ball_change_names(names or ())
    out = {b.name: b.fn(state, eps) for b in bounds(names=names, causal=state.causal or None, what="ball_change")}
    return residual_changes(state, eps, out) if residual else out
