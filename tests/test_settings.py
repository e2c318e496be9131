"""harness/settings.py is the one place a computing setting is written: the dtype vocabulary and its map to torch,
the tolerances, failure probabilities, step counts and size thresholds. AnalyzeOptions validates analyze's
computing arguments once. The greps fail as soon as a module writes one of these values again."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import torch

from harness import settings as S
from harness.analyze.options import AnalyzeOptions
from harness.analyze.validate import UsageError

ROOT = Path(__file__).resolve().parent.parent
NAMES = [n for n in vars(S) if n.isupper()]  # every setting the module names


def _sources():
    files = [p for p in (ROOT / "harness").rglob("*.py") if p.name != "settings.py"]
    files += list((ROOT / "experiments").rglob("*.py"))
    return [(p, p.read_text()) for p in files]


def test_dtype_names_map_to_torch_once_and_bad_names_are_refused():
    assert S.DTYPES == ("float64", "float32", "float16", "bfloat16")
    assert [S.torch_dtype(n) for n in S.DTYPES] == [torch.float64, torch.float32, torch.float16, torch.bfloat16]
    assert S.torch_dtype(torch.float32) is torch.float32 and S.dtype_name(torch.float64) == "float64"
    for bad in ("float8", "double", torch.int64, 3, None):
        with pytest.raises(ValueError, match="unknown dtype .*use float64, float32, float16, bfloat16"):
            S.torch_dtype(bad)
    with pytest.raises(ValueError, match="use float64, float32$"):
        S.torch_dtype(torch.float16, S.COMPUTE_DTYPES)
    assert S.norm_tol(torch.float64) == S.norm_tol("float64") == 1e-10
    assert S.truth_tol(torch.float32) == S.truth_tol("float16") == S.TRUTH_TOL_LOW


def test_the_run_config_and_both_clis_use_the_one_vocabulary():
    from harness import config
    from harness.analyze.options import ANALYZE_DTYPES
    from harness.kernels.attention import SUPPORTED_DTYPES

    assert config.check_dtype("bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        config.check_dtype("float8")
    assert set(ANALYZE_DTYPES) == set(S.COMPUTE_DTYPES)
    assert SUPPORTED_DTYPES == tuple(map(S.torch_dtype, S.COMPUTE_DTYPES))


def test_no_module_writes_a_setting_or_a_dtype_vocabulary_of_its_own():
    """Each setting is assigned in settings.py only; no dtype-name list or name -> torch lookup elsewhere; the
    defaults of fail_prob / certify_steps / steps read the settings instead of numbers (0.0: a deterministic
    value, which fails never)."""
    assign = re.compile(r"^\s*(%s)\s*[:=][^=]" % "|".join(map(re.escape, NAMES)), re.M)
    vocab = re.compile(r"[\"'](float16|bfloat16)[\"']|getattr\(torch,\s*\w*dtype|\{\s*[\"']float64[\"']\s*:")
    literal = re.compile(r"\b(fail_prob|certify_steps|certify_eps)\s*(:\s*\w+\s*)?=\s*(?!0\.0\b)[0-9.]+e?-?\d*\b"
                         r"|\bsteps: int = 24\b")
    hits = []
    for p, text in _sources():
        for pat, what in ((assign, "assigns"), (vocab, "dtype vocabulary"), (literal, "literal default")):
            hits += [f"{p.relative_to(ROOT)}: {what}: {m.group(0).strip()}" for m in pat.finditer(text)]
    assert not hits, "\n".join(hits)


def test_every_setting_has_its_reason_in_the_module_docstring():
    doc = S.__doc__
    documented = {n for n in NAMES if f"`{n}`" in doc or f"`{n}` " in doc}
    grouped = {"NORM_TOL", "NORM_TOL_LOW", "TRUTH_TOL", "TRUTH_TOL_LOW", "KRYLOV_MIN", "KRYLOV_MAX"}  # with norm_tol ...
    assert set(NAMES) - documented - grouped == set()


def test_analyze_options_validate_once_and_keywords_override():
    o = AnalyzeOptions()
    assert (o.dtype, o.fail_prob, o.certify_steps, o.torch_dtype) == ("float64", S.REPORT_FAIL_PROB,
                                                                        S.CERTIFY_STEPS, torch.float64)
    assert AnalyzeOptions(dtype=torch.float32).dtype == "float32"
    o2 = AnalyzeOptions.make(AnalyzeOptions(eps=0.1, seed=2), seed=5)
    assert (o2.eps, o2.seed) == (0.1, 5) and AnalyzeOptions.make(o2) is o2
    assert o2.state_kw() == dict(tol=None, iters=2000, fail_prob=S.REPORT_FAIL_PROB, seed=5,
                                 certify_steps=S.CERTIFY_STEPS, mixed=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o2.eps = 1.0
    bad = [dict(dtype="float16"), dict(dtype="double"), dict(eps=-1.0), dict(eps=float("nan")), dict(pgd_steps=-1),
           dict(pgd_restarts=0), dict(fail_prob=0.0), dict(fail_prob=1.0), dict(tol=0.0), dict(iters=0),
           dict(certify_steps=0)]
    for kw in bad:
        with pytest.raises(UsageError):
            AnalyzeOptions(**kw)
    with pytest.raises(TypeError, match="unexpected keyword arguments \\['epss'\\]; options: .*certify_steps"):
        AnalyzeOptions.make(epss=0.1)
    with pytest.raises(TypeError, match="options must be an AnalyzeOptions"):
        AnalyzeOptions.make({"eps": 0.1})


def test_analyze_eps_and_pgd_steps_are_declared_once_and_checked_once(monkeypatch, tmp_path):
    """The command's defaults are AnalyzeOptions' (read from settings); the command checks eps and PGD steps once,
    by building the options it hands to analyze()."""
    from harness.analyze import cli, core, validate

    p = cli.parser()
    assert p.get_default("eps") == AnalyzeOptions().eps == S.ANALYZE_EPS
    assert p.get_default("pgd_steps") == AnalyzeOptions().pgd_steps == S.ANALYZE_PGD_STEPS
    calls, seen = [], {}
    real = validate.check_numbers
    monkeypatch.setattr(validate, "check_numbers", lambda *a, **k: calls.append(a[:2]) or real(*a, **k))

    def stop(model, inputs, options=None, **kw):
        seen.update(options=options, kw=kw)
        raise ValueError("stopped before computing")

    monkeypatch.setattr(core, "analyze", stop)
    assert cli.main(["--model", "tiny-bert", "--text", "The cat sat.", "--eps", "0.05", "--pgd-steps", "3",
                     "--threads", "1", "--no-progress"]) == 2
    assert calls == [(0.05, 3)] and (seen["options"].eps, seen["options"].pgd_steps) == (0.05, 3)
    assert not {"eps", "pgd_steps", "dtype", "seed"} & set(seen["kw"])


def test_analyze_refuses_a_bad_option_before_loading_anything(monkeypatch):
    from harness.analyze import core

    monkeypatch.setattr(core, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
    with pytest.raises(TypeError, match="epss"):
        core.analyze("minilm", "A text.", epss=0.1)
    with pytest.raises(UsageError, match="--dtype"):
        core.analyze("minilm", "A text.", dtype="float16")


def _layer(seed=0, n=6, d=8, h=2):
    from harness.kernels.attention import AttentionWeights

    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d=d, h=h, generator=g)
    return torch.randn(2, n, d, dtype=torch.float64, generator=g), w


def _dense_residual_norms(X, w):
    """||J_F(X_b) + I|| of every input, from the explicit Jacobian (one product per basis vector)."""
    from harness.kernels.layer import layer_operator

    n, d = X.shape[-2:]
    E = torch.eye(n * d, dtype=X.dtype).reshape(n * d, n, d)
    out = []
    for b in range(X.shape[0]):
        mvb, _ = layer_operator(X[b:b + 1].expand(n * d, n, d), w)
        out.append(torch.linalg.matrix_norm((mvb(E) + E).reshape(n * d, n * d), ord=2))  # row k: (J + I) e_k
    return torch.stack(out)


def test_certified_truth_is_the_layer_truth_of_the_residual_map():
    """second_order.certified_truth is kernels.layer.truth(residual=True): the same numbers as Lanczos on
    J_F + I built by hand (a layer above CERT_DENSE_MAX), and the dense ||J_F + I|| to the truth's tolerance; below
    CERT_DENSE_MAX the dense route itself, its upper estimate the value padded for rounding."""
    from harness.bounds.second_order import certified_truth
    from harness.kernels.krylov import kw_steps
    from harness.kernels.layer import certified_norm, layer_operator, truth_start

    Xs, ws = _layer()
    small = certified_truth(Xs, ws, residual=True)
    assert small.fail_prob == 0.0 and bool((small.upper >= small.value).all())
    assert bool((small.upper <= small.value * (1 + 1e-10)).all())
    dense_small = _dense_residual_norms(Xs, ws)
    for b in range(Xs.shape[0]):
        assert float(small.value[b]) == pytest.approx(float(dense_small[b]), rel=1e-12)
    X, w = _layer(n=65, d=16)  # n d = 1040 > CERT_DENSE_MAX: Lanczos with its KW estimate
    assert X.shape[-2] * X.shape[-1] > S.CERT_DENSE_MAX
    r = certified_truth(X, w, residual=True)
    mv, rmv = layer_operator(X, w)
    steps = kw_steps(X.shape[-2] * X.shape[-1], S.CERTIFY_EPS, S.FAIL_PROB)
    ref = certified_norm(lambda E: mv(E) + E, lambda G: rmv(G) + G, X, steps=steps, fail_prob=S.FAIL_PROB,
                         x0=truth_start(X, w, 0, False, residual=True))  # the start truth hashes from X and w
    assert torch.equal(r.value, ref.value) and torch.equal(r.upper, ref.upper)
    assert torch.allclose(r.value, _dense_residual_norms(X, w), rtol=S.truth_tol(X.dtype))
    with pytest.raises(ValueError, match="residual=True"):
        from harness.kernels.layer import truth

        truth(X, w, residual=True)


def test_refined_and_second_order_share_one_row_terms_per_state(monkeypatch):
    from harness.bounds import lofast_refined, registry
    from harness.bounds.input_state import InputState

    calls = []
    real = lofast_refined.row_terms
    monkeypatch.setattr(lofast_refined, "row_terms", lambda *a, **k: calls.append(1) or real(*a, **k))
    X, w = _layer(1)
    s = InputState(X, w)
    out = registry.ball_changes(s, 0.05, ["refined", "second_order", "best"])
    assert set(out) == {"refined", "second_order", "best"} and len(calls) == 1
    assert (out["best"] <= torch.minimum(out["refined"], out["second_order"])).all()


# Signature defaults that are conventions, not settings: an axis, the batch layout, a seed (every random start is
# seeded by its caller's seed, 0 by default), the index of a head or a term, a batch count or bytes held back (1, 0).
CONVENTIONS = {"dim", "batch_dims", "event_dims", "seed", "head", "k", "products", "batch", "reserve"}
# Modules whose numeric defaults still stand in their signatures (their values are listed by the test's message).
SIGNATURE_DEFAULTS_NOT_YET_IN_SETTINGS = {
    *(f"harness/kernels/{m}.py" for m in ("attention", "deflation", "krylov", "layer", "mixed", "starts")),
    *(f"harness/bounds/{m}.py" for m in ("castin", "castin_weighted", "jasmin", "jasmin_appc", "kim", "lofast",
                                          "mass_splitting"))}


def _numeric_defaults(path: Path):
    """(function, parameter, value) of every int / float literal default in the module's signatures, and of every
    module-level NAME = number."""
    import ast

    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))
            for arg, d in pairs:
                d = d.operand if isinstance(d, ast.UnaryOp) else d
                if isinstance(d, ast.Constant) and type(d.value) in (int, float) and arg.arg not in CONVENTIONS:
                    out.append((node.name, arg.arg, d.value))
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and \
                type(node.value.value) in (int, float):
            out += [("<module>", t.id, node.value.value) for t in node.targets if isinstance(t, ast.Name)]
    return out


def test_kernels_and_bounds_read_their_numeric_defaults_from_settings():
    """An iteration cap, a tolerance, a basis size or a batch threshold in harness/kernels/ or harness/bounds/ is a
    name of harness/settings.py, not a number in a signature (a caller still passes its own)."""
    files = sorted((ROOT / "harness" / "kernels").glob("*.py")) + sorted((ROOT / "harness" / "bounds").glob("*.py"))
    hits, waiting = [], []
    for p in files:
        rel = str(p.relative_to(ROOT))
        found = [f"{rel}: {fn}({arg}={v!r})" for fn, arg, v in _numeric_defaults(p)]
        (waiting if rel in SIGNATURE_DEFAULTS_NOT_YET_IN_SETTINGS else hits).extend(found)
    assert not hits, "\n".join(hits)
    done = [rel for rel in SIGNATURE_DEFAULTS_NOT_YET_IN_SETTINGS if not _numeric_defaults(ROOT / rel)]
    assert not done, f"no numeric defaults left in {done}: take them off SIGNATURE_DEFAULTS_NOT_YET_IN_SETTINGS"
