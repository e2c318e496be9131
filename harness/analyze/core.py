"""`analyze(model, inputs, ...)`: every registered bound and the true local Lipschitz constant of every requested
attention layer and head of a model at its actual inputs, as one tidy DataFrame.

Rows: one per (input, layer, head, method); head = -1 is the whole multi-head layer F, head l the map f_l
(harness.bounds.registry's HEAD_MAP / LAYER_MAP; biases as the model has them, no residual, no LayerNorm).
Columns: input, n_tokens, layer, head, scope, method, kind (upper / lower / exact / info), bounds (what the value
bounds: "local" = the local Lipschitz constant ||J(X)|| = `truth`; "eps-ball" = sup_{||X'-X||_F <= eps}
||F(X') - F(X)||_F / eps; "ball" = Lip(f_l on B_R^n), R = max token norm), value, truth, ratio = value/truth,
converged, guaranteed, sound, user (a plug-in bound).
Soundness (registry.is_sound, the registry's one rule): a "local" upper bound below the truth is unsound; an
"eps-ball" upper bound is checked against PGD at the same eps, the "ball" lower bound (Prop. 3.4) against Castin's
upper bound. Every certificate of the registry (bounds="ball_change": Theorem 1's naive / coarse / fine / sharp /
refined, second_order, best, and the plug-ins registered so) is an eps-ball row under its registry name, its
delta(X, eps) / eps, checked against PGD the same way; second_order rests on the state's certified truth.
"""
from __future__ import annotations

import itertools
import math
import time
from typing import Callable, Iterable, List, Optional, Sequence, Union

import torch

from harness.analyze import modern, validate
from harness.analyze.inputs import load_model, model_inputs
from harness.analyze.options import AnalyzeOptions
from harness.analyze.state import EXTRA, AnalyzeState, rows_extra, truth_uppers
from harness.bounds import castin, lofast, registry
from harness.kernels.attention import AttentionWeights
from harness.models.adapters import adapter_for, lengths

ENTRY_POINT_GROUP = "attnlip.bounds"


# ---- plug-in bounds -----------------------------------------------------------------------------------------
def register_plugin(fn: Union[str, Callable]) -> str:
    """Register a user bound ("module:function" or a callable) in the bound registry; returns its name.
    The function takes (X, w) or (X, w, causal=...) and returns per-head (..., h) values, or per-layer (...,) if
    it has an attribute `scope = "layer"`; `bound_name` overrides its name."""
    return registry.register_plugin(fn, reserved=EXTRA)[0].name


def entry_point_plugins() -> List[str]:
    """Register every bound an installed package declares in the entry-point group `attnlip.bounds`
    (each entry point loads a bound function, or a list of them); returns their names."""
    from importlib.metadata import entry_points

    names = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        obj = ep.load()
        for fn in obj if isinstance(obj, (list, tuple)) else [obj]:
            names.append(register_plugin(fn))
    return names


# ---- the extra methods ------------------------------------------------------------------------------------------
def _extra(s: AnalyzeState, opts: AnalyzeOptions, want: Optional[set] = None) -> dict:
    """{(method, scope): (values (G, h) or (G,), guaranteed (G,) bool)} for the EXTRA methods in `want` (None:
    all; truth_upper always)."""
    ok = lambda m: want is None or m in want
    X, w = s.X, s.w
    G = X.shape[0]
    yes = torch.ones(G, dtype=torch.bool)
    out = truth_uppers(s)
    e, pgd_steps = float(opts.eps), opts.pgd_steps
    if e > 0:  # every certificate of the registry (second_order's U: the state's certified truth), / eps
        for name, v in registry.ball_changes(s, e, [n for n in registry.ball_change_names() if ok(n)]).items():
            out[(name, "layer")] = (v / e, yes)
    if e > 0 and ok("pgd") and pgd_steps > 0 and not s.causal:
        with torch.enable_grad():
            pg = lofast.pgd_sensitivity(X, w, e, residual=False, steps=pgd_steps, restarts=opts.pgd_restarts,
                                         seed=opts.seed)
        out[("pgd", "layer")] = (pg / e, yes)
    if not s.causal and (ok("prop34") or ok("gamma_R2") or ok("log10_n_star")):
        R = X.norm(dim=-1).amax(-1)  # (G,)
        w0 = AttentionWeights(w.wq, w.wk, w.wv, w.wo)  # Prop. 3.4 is for the bias-free map
        ch = castin.prop34_choice(w0)
        g = torch.stack([torch.tensor(float("nan"), dtype=X.dtype) if c is None else c["gamma"].cpu() for c in ch])
        gr2 = g.to(X.device) * R[:, None] ** 2  # (G, h)
        no_bias = torch.full((G,), not w.has_bias, dtype=torch.bool)
        out[("prop34", "head")] = (castin.lower_bound(w0, X.shape[-2], R, choices=ch), no_bias)
        out[("gamma_R2", "head")] = (gr2, yes)
        out[("log10_n_star", "head")] = (gr2 / math.log(10), yes)
    return out


def forward_device(model) -> torch.device:
    """Where `model`'s forward pass runs: the device of its first parameter or buffer (CPU when it has none)."""
    for t in itertools.chain(model.parameters(), model.buffers()):
        return t.device
    return torch.device("cpu")


def _short(text: str, k: int = 80) -> str:
    """The table's `text` column: the input's first k characters (the full text repeated per row is MBs)."""
    return text if len(text) <= k else text[: k - 3] + "..."


# ---- the front door ---------------------------------------------------------------------------------------------
def analyze(model, inputs, options: Optional[AnalyzeOptions] = None, *, tokenizer=None,
            layers: Optional[Iterable[int]] = None, methods: Optional[Iterable[str]] = None,
            bounds: Sequence[Union[str, Callable]] = (), entry_points: bool = True, max_tokens: Optional[int] = None,
            progress: bool = False, timings: Optional[dict] = None, default_max_tokens: Optional[int] = None,
            **option_fields):
    """Every registered bound + the truth for each requested layer and head of `model` at `inputs`: a DataFrame.

    model: a torch module (Hugging Face BERT/RoBERTa/DistilBERT/ALBERT/ELECTRA/GPT-2/ViT, or any module using
    torch.nn.MultiheadAttention as self-attention), an alias ("minilm"), a save_pretrained folder or a cached
    hub name. inputs: a text or list of texts (batched, right padding; needs `tokenizer` unless the model came
    by name), a dict of model keyword arguments, a pixel_values tensor (ViT) or the module's positional input.
    layers: indices (default all; negative ones count from the last layer, -1 = the last; out of range is an
    error). max_tokens: truncation length of texts (and token-id inputs); more than the model's positions is an
    error; None: default_max_tokens (None: no limit), capped at the model's positions with a notice in
    df.attrs["notices"]. options: how the bounds and truths are computed (harness.analyze.options.AnalyzeOptions:
    dtype, device, eps, pgd_steps, pgd_restarts, fail_prob, tol, iters, certify_steps, seed); its fields may also be
    passed as keywords (`analyze(m, x, eps=0.0)`), which replace those of `options`. methods: registry names and
    EXTRA methods to evaluate (default all). bounds: plug-ins ("module:function" or callables) added to the
    registry and checked against the truth. `timings`, if given, is filled with wall times (forward, per layer,
    total).
    A user mistake (layer out of range, empty text, a tokenizer that is not the model's, an unavailable device,
    eps < 0, ...) raises validate.UsageError (a ValueError) before anything is computed.
    """
    import pandas as pd

    t0 = time.perf_counter()
    opts = AnalyzeOptions.make(options, **option_fields)
    dt, eps = opts.torch_dtype, opts.eps
    dev = validate.check_device(opts.device)
    notices: List[str] = []
    plugin_names = [register_plugin(b) for b in bounds]
    if entry_points:
        plugin_names += entry_point_plugins()
    mdl, tok, source = load_model(model, dev)
    adapter = adapter_for(mdl)
    L = adapter.n_layers
    layers = validate.resolve_layers(layers, L)
    texts = [inputs] if isinstance(inputs, str) else inputs
    is_text = isinstance(texts, (list, tuple)) and all(isinstance(t, str) for t in texts)
    if is_text:
        validate.check_texts(texts, "inputs")
    tk = tokenizer or tok
    budget = validate.token_budget(max_tokens, default_max_tokens, mdl, tk if is_text else None, notices)
    if is_text:
        validate.require_tokenizer(tk)
    # the forward pass runs where the model is (a module handed in stays on its device), the bounds on `dev`
    call, mask, labels = model_inputs(mdl, texts, tk, budget, forward_device(mdl))
    if is_text:
        validate.check_tokenizer(mdl, tk, call["input_ids"], mask, notices)
        validate.check_real_tokens(call["input_ids"], mask, tk)
        validate.truncation_notice(tk, texts, budget, validate.position_limit(mdl), notices)
    got = adapter.capture(call, layers)["inputs"]
    causal = adapter.causal
    mask = mask if mask is not None else adapter.padding_mask
    B, n = next(iter(got.values())).shape[:2]
    lens = lengths(mask, B, n)
    groups = {}
    for b, ln in enumerate(lens):
        groups.setdefault(ln, []).append(b)
    methods = None if methods is None else list(methods)
    names = None if methods is None else list(dict.fromkeys([m for m in methods if m not in EXTRA] + plugin_names))
    t_fwd = time.perf_counter() - t0
    rows, per_layer = [], {}
    it = layers
    if progress:
        from tqdm.auto import tqdm

        it = tqdm(layers, desc="layers", unit="layer")
    for l in it:
        tl = time.perf_counter()
        w = adapter.layer_weights(l, dt).to(device=dev)
        for ln, idx in groups.items():
            X = got[l][idx, :ln].to(device=dev, dtype=dt)  # (G, n_b, d): the real tokens only
            meta = [dict(input=b, text=_short(labels[b] if b < len(labels) else f"input {b}"), n_tokens=ln,
                         layer=l) for b in idx]
            amap = adapter.attention_map(l, ln, dt, dev)
            if amap is not None:  # position terms in the scores (RoPE, relative biases): harness.analyze.modern
                rows += modern.rows(X, amap, names, meta, opts, methods)
                continue
            s = AnalyzeState(X, w, causal, **opts.state_kw())
            ev = registry.evaluate(X, w, causal, names=names, state=s)
            for r in ev.rows():
                r.update(meta[r.pop("sample")], bounds="local", user=registry.get(r["method"], r["scope"]).user)
                rows.append(r)
            extra = _extra(s, opts, None if methods is None else set(methods))
            rows += rows_extra(s, ev, extra, meta)
        per_layer[l] = time.perf_counter() - tl
    cols = ["input", "text", "n_tokens", "layer", "head", "scope", "method", "kind", "bounds", "value", "truth",
            "ratio", "converged", "guaranteed", "sound", "user", "note"]
    df = pd.DataFrame(rows, columns=cols).sort_values(["input", "layer", "head", "method"], kind="stable")
    # "n/a: <reason>" where a bound is not proven for the layer's map, else empty
    df["note"] = [v if isinstance(v, str) else "" for v in df["note"]]
    df = df.reset_index(drop=True)
    df.attrs.update(model=str(model) if not isinstance(model, torch.nn.Module) else type(model).__name__,
                    source=source, architecture=adapter.name, causal=causal, dtype=str(dt).replace("torch.", ""),
                    device=str(dev), eps=eps, fail_prob=opts.fail_prob, layers=layers, n_layers=L, plugins=plugin_names,
                    max_tokens=budget, notices=notices)
    if timings is not None:
        timings.update(forward_s=t_fwd, layers_s=per_layer, total_s=time.perf_counter() - t0)
    return df
