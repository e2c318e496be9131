"""The harness contract, checked over the whole registry where it can be:

- a quick run, a --set run and --collect --quick leave the canonical (full-scale) outputs byte-identical;
- every experiment honours --dtype: float32 and float64 tables differ as float32 arithmetic does and agree to
  float32 accuracy, or the experiment refuses float32 clearly before computing;
- editing an experiment's compute function changes its code hash, editing only figures/summary does not;
- imports only go down the layers, no module imports itself back through others (no import cycle); no source
  file over 400 lines.
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from harness import cli, catalog
from harness.run import discovery
from harness import run as runner
from harness.errors import UnsupportedContext
from harness.store import codehash
from tests._harness_fakes import registered_fakes, write_fake

REPO = Path(__file__).resolve().parent.parent
NAMES = catalog.list_experiments()
HARNESS_COLS = {"experiment", "cell", "seed", "device", "dtype", "scale", "cell_key"}


# ------------------------------------------------------------------------------ outputs separated by scale
@pytest.fixture
def fake(tmp_path, monkeypatch):
    fakes = registered_fakes(tmp_path, monkeypatch, "fake_contract")
    mod, _ = next(fakes)
    yield mod
    next(fakes, None)  # unregister


def _snapshot(results: Path):
    """sha256 of every file under results/ except the quick/, custom/ and cache/ folders."""
    out = {}
    for p in sorted(results.rglob("*")):
        rel = p.relative_to(results)
        if p.is_file() and rel.parts[0] not in ("quick", "custom", "cache"):
            out[rel.as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def test_other_scales_and_overrides_never_touch_canonical_outputs(fake, tmp_path, capsys):
    results = tmp_path / "results"
    args = ["_fake_squares", "--results-dir", str(results), "--no-progress"]
    quiet = dict(out=lambda *a: None)
    assert cli.main(args, **quiet) == 0
    before = _snapshot(results)
    assert "_fake_squares/table.csv" in before and "README.md" in before
    assert cli.main(args + ["--quick"], **quiet) == 0
    assert cli.main(args + ["--set", "n=2"], **quiet) == 0
    assert cli.main(args + ["--collect", "--quick"], **quiet) == 0
    assert cli.main(args + ["--quick", "--set", "mult=2.0", "--dtype", "float32"], **quiet) == 0
    assert _snapshot(results) == before
    assert (results / "quick" / "_fake_squares" / "table.csv").is_file()
    assert (results / "quick" / "README.md").is_file()
    assert (results / "custom" / "full__n=2" / "_fake_squares" / "table.csv").is_file()
    assert (results / "custom" / "quick__mult=2,dtype=float32" / "_fake_squares" / "table.csv").is_file() or \
        (results / "custom" / "quick__mult=2__dtype=float32" / "_fake_squares" / "table.csv").is_file()
    t = pd.read_csv(results / "custom" / "full__n=2" / "_fake_squares" / "table.csv")
    assert set(t["n"]) == {2}


def test_canonical_readme_covers_quick_only_experiments(fake, tmp_path):
    results = tmp_path / "results"
    quiet = dict(out=lambda *a: None)
    assert cli.main(["_fake_squares", "--quick", "--results-dir", str(results), "--no-progress"], **quiet) == 0
    assert cli.main(["_fake_slow", "--results-dir", str(results), "--no-progress"], **quiet) == 0
    readme = (results / "README.md").read_text()
    assert "`_fake_squares`" in readme and "`_fake_slow`" in readme and "quick/_fake_squares/table.csv" in readme
    assert not (results / "_fake_squares").exists()
    quick = (results / "quick" / "README.md").read_text()
    assert quick.startswith("# AttnLip results: quick scale") and "not** the canonical" in quick
    assert readme.startswith("# AttnLip results\n")


def test_collect_on_empty_cache_says_what_to_run(fake, tmp_path, capsys):
    rc = cli.main(["_fake_squares", "--collect", "--quick", "--results-dir", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert rc == 1 and "nothing is cached" in err and "run_all.py _fake_squares --scale quick" in err
    assert not (tmp_path / "r" / "quick").exists()


def test_set_values_are_type_checked_at_planning(fake, tmp_path, capsys):
    rc = cli.main(["_fake_squares", "--dry-run", "--set", "n=abc", "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "'n'" in err and "int" in err and "abc" in err
    lines = []
    assert cli.main(["_fake_squares", "--dry-run", "--set", "mult=3", "--results-dir", str(tmp_path)],
                    out=lines.append) == 0  # an int where floats are declared is the same float cell
    assert any("mult=3" in l for l in lines)


def test_unsupported_dtype_refused_before_computing(fake, tmp_path, capsys):
    exp = catalog.get_experiment("_fake_squares")
    exp.dtypes = ("float64",)
    exp.dtype_note = "certificates need float64"
    try:
        rc = cli.main(["_fake_squares", "--dtype", "float32", "--results-dir", str(tmp_path)])
    finally:
        del exp.dtypes, exp.dtype_note
    err = capsys.readouterr().err
    assert rc == 2 and "float32" in err and "certificates need float64" in err
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------------------ dtype is obeyed
def _float_columns(exp, table: pd.DataFrame):
    params = set()
    for scale in ("full", "quick", "test"):
        g = exp.grid_for(scale)
        for sub in (g if isinstance(g, list) else [g]):
            params |= set(sub)
    skip = HARNESS_COLS | params | set(exp.float32_exempt)
    return [c for c in table.columns if c not in skip and pd.api.types.is_float_dtype(table[c])]


@pytest.mark.parametrize("name", NAMES)
def test_dtype_is_obeyed_or_refused(name, tmp_path, experiment_cache):
    exp = catalog.get_experiment(name)
    cfg = {d: runner.RunConfig(scale="test", dtype=d, results_dir=tmp_path / d, cache_dir=experiment_cache,
                               progress=False) for d in ("float64", "float32")}
    if "float32" not in exp.dtypes:
        with pytest.raises(UnsupportedContext, match="float32"):
            runner.check_overrides([name], cfg["float32"])
        return
    tables = {}
    for d, c in cfg.items():
        (res,) = runner.run([name], c, echo=lambda *a: None)
        if res.missing_data and not res.computed and not res.cached:
            pytest.skip(f"{name}: missing data: {res.errors[0]['error']}")
        assert res.failed == 0, runner.format_errors([res])
        tables[d] = pd.read_csv(c.output_root / name / "table.csv")
    t64, t32 = tables["float64"], tables["float32"]
    assert set(t32["dtype"]) == {"float32"} and set(t64["dtype"]) == {"float64"}
    assert len(t32) == len(t64), f"{name}: row count depends on dtype"
    cols = _float_columns(exp, t64)
    assert cols, f"{name}: no float column left to compare (float32_exempt too wide?)"
    differ = [c for c in cols if not t32[c].equals(t64[c])]
    assert differ, f"{name}: float32 and float64 tables are bit-identical: --dtype is ignored"
    bad = []
    for c in cols:
        a, b = t32[c].to_numpy(float), t64[c].to_numpy(float)
        if not np.array_equal(np.isnan(a), np.isnan(b)):
            bad.append(f"{c} (NaN pattern)")
            continue
        atol = 1e-6 * max(1.0, float(np.nanmax(np.abs(b), initial=0.0)))
        if not np.allclose(a, b, rtol=1e-3, atol=atol, equal_nan=True):
            i = int(np.nanargmax(np.abs(a - b) - 1e-3 * np.abs(b)))
            bad.append(f"{c} (row {i}: float32 {a[i]:.6g} vs float64 {b[i]:.6g})")
    assert not bad, f"{name}: float32 disagrees beyond float32 accuracy in {bad}"


# ------------------------------------------------------------------------------ code hash: compute vs present
def _edit_method(source: str, cls_name: str, method: str) -> str:
    """The module source with a statement inserted at the start of cls.method's body (a compute edit)."""
    tree = ast.parse(source)
    cls = next(s for s in tree.body if isinstance(s, ast.ClassDef) and s.name == cls_name)
    fn = next(s for s in cls.body if isinstance(s, ast.FunctionDef) and s.name == method)
    first = fn.body[0]
    if isinstance(first, ast.Expr) and isinstance(getattr(first, "value", None), ast.Constant):
        first = fn.body[1] if len(fn.body) > 1 else first
    lines = source.splitlines()
    indent = re.match(r"\s*", lines[first.lineno - 1]).group(0)
    lines.insert(first.lineno - 1, f"{indent}_edited = 1  # an edit")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("name", NAMES)
def test_compute_edits_invalidate_presentation_edits_do_not(name):
    exp = catalog.get_experiment(name)
    cls = type(exp)
    src = inspect.getsource(inspect.getmodule(cls))

    def h(s):
        nodes, _ = codehash.compute_part(s, cls.__name__, cls.DECLARATIONS, cls.PRESENTATION)
        return codehash.sha256("\n".join(ast.dump(n) for n in nodes))

    base = h(src)
    owner = next(k for k in cls.__mro__ if "run" in vars(k) or "compute" in vars(k))
    if owner is cls:
        assert h(_edit_method(src, cls.__name__, "run" if "run" in vars(cls) else "compute")) != base
    for m in ("figures", "summary"):
        if m in vars(cls):
            assert h(_edit_method(src, cls.__name__, m)) == base, f"{name}: editing {m}() would recompute"
    assert h(src + "\n# a comment\n") == base


def test_declarations_are_the_fields_experiment_declares():
    """Experiment.DECLARATIONS (left out of every key) is exactly the data fields of the base class: a new field
    must be classified, and a method can never be declared away."""
    base = catalog.Experiment
    fields = {k for k, v in vars(base).items() if not k.startswith("_") and not callable(v)
              and not isinstance(v, property) and k not in ("DECLARATIONS", "PRESENTATION")}
    assert base.DECLARATIONS == fields
    assert base.PRESENTATION <= {k for k, v in vars(base).items() if callable(v)} | {"figures", "summary"}


def test_editing_compute_recomputes_editing_figures_does_not(fake, tmp_path):
    cfg = runner.RunConfig(results_dir=tmp_path / "r", progress=False)
    quiet = dict(echo=lambda *a: None)
    assert runner.run(["_fake_squares"], cfg, **quiet)[0].computed == 6
    write_fake(fake, replace=[('ax.plot(table["n"], table["value"], "o")', 'ax.plot(table["n"], table["value"], "s")'),
                              ('return f"max value', 'return f"largest value')])
    discovery.load_module_file(fake)
    r = runner.run(["_fake_squares"], cfg, **quiet)[0]
    assert (r.computed, r.cached) == (0, 6)
    write_fake(fake, replace=[('"value": cell["n"] ** 2 * cell["mult"]', '"value": cell["n"] ** 2 * cell["mult"] + 0')])
    discovery.load_module_file(fake)
    assert runner.run(["_fake_squares"], cfg, **quiet)[0].computed == 6


def test_large_tables_are_written_gzipped(tmp_path, monkeypatch):
    """No committed table file exceeds the size limit: over it, table.csv.gz replaces table.csv (and back)."""
    import gzip

    from harness import report
    from harness.run import outputs

    monkeypatch.setattr(outputs, "CSV_LIMIT", 20)
    big, small = "a,b\n" + "1,2\n" * 10, "a,b\n1,2\n"
    outputs.write_csv(tmp_path, big)
    assert not (tmp_path / "table.csv").exists()
    assert gzip.decompress((tmp_path / "table.csv.gz").read_bytes()).decode() == big
    assert report._csv(tmp_path).name == "table.csv.gz" and len(pd.read_csv(report._csv(tmp_path))) == 10
    outputs.write_csv(tmp_path, small)
    assert (tmp_path / "table.csv").read_text() == small and not (tmp_path / "table.csv.gz").exists()


def test_convergence_line_counts_only_rows_an_iterative_solver_produced(tmp_path):
    """A blank `converged` (a closed-form term) is neither converged nor 'NOT converged'."""
    from harness import report

    (tmp_path / "table.csv").write_text("value,converged\n1,True\n2,\n3,False\n4,\n5,True\n")
    assert report._convergence(tmp_path) == ("*Iterative solvers: 2 of 3 values converged. **1 NOT converged** "
                                             "(treat those values as lower estimates)*")
    (tmp_path / "table.csv").write_text("value,converged\n1,\n2,\n")
    assert report._convergence(tmp_path) == ""


def test_plugins_are_keyed_by_their_source_not_by_the_whole_tree(tmp_path, monkeypatch):
    """Plug-ins load by name (harness.plugins, which the code hash neither hashes nor walks), so the bound registry
    does not widen bound_leaderboard's hash to every harness file; the plug-ins a cell evaluates (its `plugins`
    grid key, or --bound) are keyed by their own source instead."""
    import importlib

    P = importlib.import_module("harness.run.plan")

    code = codehash.experiment_code(catalog.get_experiment("bound_leaderboard"))
    files = {f.relative_to(codehash.REPO_ROOT).as_posix() for f in code["files"]}
    assert {"harness/bounds/registry.py", "harness/bounds/lofast.py"} <= files  # what evaluate() calls is hashed
    assert not {"harness/plugins.py", "experiments/lofast/figures/plots.py", "harness/cli.py"} & files
    assert len(code["files"]) < len(codehash.compute_files())

    plug = tmp_path / "my_plugin_mod.py"
    plug.write_text("def my_bound(X, w):\n    return X.new_zeros(X.shape[:-2] + (w.h,))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    exp = catalog.get_experiment("bound_leaderboard")
    cfg = runner.RunConfig(scale="test", results_dir=tmp_path / "r", progress=False)
    cell = {"plugins": ["my_plugin_mod:my_bound"]}
    before = P.plugin_sources(exp, cfg, cell)
    assert before and before[0]["bound"] == "my_plugin_mod:my_bound" and before[0]["source"] != "unknown"
    plug.write_text(plug.read_text() + "# edited\n")
    assert P.plugin_sources(exp, cfg, cell) != before  # editing the plug-in recomputes its cells
    assert P.plugin_sources(exp, cfg, {}) is None  # no plug-in, no entry (keys of other cells unchanged)
    assert P.plugin_sources(exp, cfg, {"plugins": ["no_such_module_xyz:f"]})[0]["source"] == "unknown"


def test_repository_plugins_are_keyed_by_their_import_closure(tmp_path, monkeypatch):
    """A plug-in under harness/ is keyed by its closure: editing a helper it imports recomputes its cells too."""
    import importlib

    P = importlib.import_module("harness.run.plan")
    cfg = runner.RunConfig(scale="test", results_dir=tmp_path / "r", progress=False)
    exp = catalog.get_experiment("bound_leaderboard")
    spec = "harness.bounds.jasmin_appc:jasmin_appc"
    got = P.plugin_sources(exp, cfg, {"plugins": [spec]})[0]
    assert got["source"] == codehash.closure_hash(["harness.bounds.jasmin_appc"])[0]
    closure = codehash.closure_hash(["harness.bounds.jasmin_appc"])[1]
    files = {f.relative_to(codehash.REPO_ROOT).as_posix() for f in closure}
    assert "harness/bounds/jasmin_appc.py" in files and "harness/kernels/attention.py" in files
