"""Property-based fuzzing (hypothesis) of what users hand us: command lines of `attnlip analyze` and `run_all.py`,
and crafted cell files. Whatever the input: an exit status (0 ok, 1 a failure on valid input or an unsound bound,
2 a usage error), one message and never a traceback, nothing written outside the output folder, and committed
results byte-identical. Bounded (a few dozen examples each, derandomized) so CI stays fast; the cases a run finds
are kept in hypothesis' example database between local runs."""
from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings, strategies as st  # noqa: E402

from tests.test_analyze_validation import TEXT, folders  # noqa: E402,F401 - the tiny saved model folders

REPO = Path(__file__).resolve().parents[1]
FUZZ = settings(max_examples=30, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _call(main, argv):
    """(exit status, stdout + stderr) of an in-process CLI call; argparse's exits count as statuses."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        try:
            rc = main(argv)
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 2
    return rc, buf.getvalue()


def _committed_state():
    """Size and mtime of every committed result file: a fuzzed command must leave them all alone."""
    return {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted((REPO / "results").rglob("*")) if p.is_file()
            and "cache" not in p.relative_to(REPO / "results").parts}


# ---- attnlip analyze ----------------------------------------------------------------------------------------------
NUMBERS = st.one_of(st.integers(-10**12, 10**12).map(str), st.floats(allow_nan=True, allow_infinity=True).map(repr),
                    st.sampled_from(["", " ", "abc", "1e308", "-0", "0x10", "1_000"]))
ANALYZE_OPTIONS = {
    "--layers": st.sampled_from(["0", "1", "-1", "-2", "2", "99", "-3", "0,1", ",", "a", "0,,1", " ", "1e3", "0.5"]),
    "--eps": NUMBERS,
    "--pgd-steps": st.sampled_from(["-1", "0", "1", "3", "10001", "1000000000", "x"]),
    "--max-tokens": st.integers(-3, 200).map(str),
    "--samples": st.integers(-2, 4).map(str),
    "--dtype": st.sampled_from(["float64", "float32", "float16", "int8", ""]),
    "--device": st.sampled_from(["cpu", "cuda", "cuda:7", "mps", "meta", "gpu", " ", "cpu:0"]),
    "--threads": st.integers(-1, 1000).map(str),
    "--methods": st.sampled_from(["castin", "nope", "castin,jasmin", "", "truth", ",,", "pgd"]),
    "--bound": st.sampled_from(["os:system", "math:sqrt", "nope", "no_colon", "harness:__version__",
                                "builtins:eval", ":", "tests.test_fuzz:_returns_text"]),
    "--seed": st.integers(-2**70, 2**70).map(str),
    "--text": st.text(max_size=40),
}


def _returns_text(X, w):
    """A plug-in that returns a string instead of values."""
    return "not a tensor"


@FUZZ
@given(opts=st.dictionaries(st.sampled_from(sorted(ANALYZE_OPTIONS)), st.none(), max_size=3).flatmap(
    lambda d: st.fixed_dictionaries({k: ANALYZE_OPTIONS[k] for k in d})),
    out=st.sampled_from(["folder", "file", "results", None]))
def test_analyze_command_lines(folders, tmp_path_factory, opts, out):  # noqa: F811
    from harness.analyze import cli

    tmp = tmp_path_factory.mktemp("fz")
    argv = ["--model", folders["ok"], "--text", TEXT, "--layers", "0", "--eps", "0", "--pgd-steps", "0",
            "--no-progress"]
    for k, v in opts.items():
        if k == "--text":
            argv = [a for a in argv if a != TEXT and a != "--text"]
        argv += [k, v]
    target = {"folder": tmp / "o", "file": tmp / "f.txt", "results": REPO / "results" / "quick" / "fz", None: None}[out]
    if out == "file":
        target.write_text("x")
    if target is not None:
        argv += ["--out", str(target)]
    before = _committed_state()
    rc, text = _call(cli.main, argv)
    assert rc in (0, 1, 2), (argv, rc, text)
    assert "Traceback" not in text, (argv, text)
    assert _committed_state() == before and not (REPO / "results" / "quick" / "fz").exists(), argv
    assert sorted(p.name for p in tmp.iterdir() if p.name not in ("o", "f.txt")) == [], argv  # nothing else written


# ---- run_all.py -----------------------------------------------------------------------------------------------------
RUN_OPTIONS = {
    "--set": st.one_of(st.sampled_from(["n=1", "n=abc", "n=", "=3", "n=1,2", "nope=1", "n=1e999", "mult=-1",
                                        "n=[1,2]", "n=None"]), st.text(max_size=12)),
    "--scale": st.sampled_from(["quick", "full", "test", "paper", "huge"]),
    "--dtype": st.sampled_from(["float64", "float32", "bfloat16", "half"]),
    "--device": st.sampled_from(["cpu", "cuda", "auto", "tpu", "cuda:9"]),
    "--jobs": st.integers(-2, 64).map(str),
    "--threads": st.integers(-1, 99).map(str),
    "--seed": st.sampled_from(["0", "-1", "x", "1e3", str(2**80)]),
    "--only": st.sampled_from(["_fake*", "*", "nomatch*", "[", ""]),
    "--verify-sample": st.sampled_from(["1", "0", "-3", "all", "x"]),
    "--executor": st.sampled_from(["serial", "process", "submitit", "mpi"]),
    "--bound": st.sampled_from(["os:system", "math:sqrt", "nope", "no_colon"]),
}


@pytest.fixture
def fake(tmp_path, monkeypatch):
    from tests._harness_fakes import registered_fakes

    yield from registered_fakes(tmp_path, monkeypatch, "fake_fuzz")


@FUZZ
@given(opts=st.dictionaries(st.sampled_from(sorted(RUN_OPTIONS)), st.none(), max_size=3).flatmap(
    lambda d: st.fixed_dictionaries({k: RUN_OPTIONS[k] for k in d})),
    mode=st.sampled_from(["--dry-run", "--list", "--collect", "--stamp", "--render"]),
    names=st.sampled_from([["_fake_squares"], ["nope"], [], ["_fake_squares", "_fake_squares"]]))
def test_run_all_command_lines(fake, tmp_path_factory, opts, mode, names):
    from harness import cli

    results = tmp_path_factory.mktemp("res")
    argv = [mode, "--results-dir", str(results), "--no-progress", "--no-figures", *names]
    for k, v in opts.items():
        argv += [k, v]
    if not names and "--only" not in opts:
        argv += ["--only", "_fake*"]  # never plan every real experiment of the repository
    before = _committed_state()
    rc, text = _call(lambda a: cli.main(a, out=print), argv)
    assert rc in (0, 1, 2, 3), (argv, rc, text)
    assert "Traceback" not in text, (argv, text)
    assert _committed_state() == before, argv


# ---- crafted cell files -------------------------------------------------------------------------------------------
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=6), kids, max_size=3),
                    max_leaves=10)


@FUZZ
@given(field=st.sampled_from(["rows", "cell", "key", "format", "experiment", "meta", "seed", "row0", "value"]),
       value=JSON, fix_checksum=st.booleans(), raw=st.one_of(st.none(), st.binary(max_size=64)))
@example(field="meta", value=None, fix_checksum=True, raw=None)
@example(field="meta", value={"status": "x", "n_rows": [1]}, fix_checksum=True, raw=None)
@example(field="meta", value={"wall_s": {"a": [1, {"b": float("nan")}]}}, fix_checksum=True, raw=None)
@example(field="meta", value={"wall_s": float("nan"), "peak_rss_mb": "1", "threads": True}, fix_checksum=True, raw=None)
def test_crafted_cell_files(fake, tmp_path_factory, field, value, fix_checksum, raw):
    """A cell file edited in any field (with or without a valid checksum) or replaced by arbitrary bytes: the next
    run names it, recomputes it and writes the same table as before, byte for byte."""
    from harness import run as runner
    from harness.store.atomic import canonical_json, sha256

    results = tmp_path_factory.mktemp("cells")
    cfg = runner.RunConfig(results_dir=results, figures=False, progress=False)
    runner.run(["_fake_squares"], cfg, echo=lambda *a: None)
    table = results / "_fake_squares" / "table.csv"
    before = table.read_bytes()
    path = sorted((results / "cache" / "cells" / "_fake_squares").glob("*.json"))[0]
    if raw is not None:
        path.write_bytes(raw)
    else:
        rec = json.loads(path.read_text())
        if field == "row0":
            rec["rows"][0] = value
        elif field == "value":
            rec["rows"][0]["value"] = value
        else:
            rec[field] = value
        if fix_checksum:
            body = {k: v for k, v in rec.items() if k != "checksum"}
            rec["checksum"] = sha256(canonical_json(body))
        path.write_text(json.dumps(rec))
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        (r,) = runner.run(["_fake_squares"], cfg, echo=print)
    assert "Traceback" not in buf.getvalue()
    assert r.ok, (field, value, buf.getvalue(), r.figure_error)
    forged = raw is None and fix_checksum and field == "value" and isinstance(value, (int, float)) and \
        not isinstance(value, bool) and value == value
    if not forged:  # a plausible number under a valid checksum is a forgery no check can tell from a result
        assert table.read_bytes() == before, (field, value, buf.getvalue())


# ---- crafted committed files: manifests and tables -----------------------------------------------------------------
@FUZZ
@given(target=st.sampled_from(["manifest.json", "table.parquet", "table.csv"]),
       content=st.one_of(st.binary(max_size=80), JSON.map(lambda v: json.dumps(v).encode()),
                         st.sampled_from([b"", b"{", b"PAR1", b'{"experiment": 3, "cells": "x"}',
                                          b'{"experiment": "_fake_squares", "cells": [1, {"cell": []}]}'])),
       mode=st.sampled_from(["--verify", "--render", "--collect", "run"]))
def test_crafted_committed_files(fake, tmp_path_factory, target, content, mode):
    """A damaged manifest or table in the results folder: --verify, --render, --collect and a rerun each answer
    with a status and a message (a damaged committed file is itself a finding), never a traceback."""
    from harness import cli
    from harness import run as runner

    results = tmp_path_factory.mktemp("committed")
    cfg = runner.RunConfig(results_dir=results, figures=False, progress=False, scale="quick")
    runner.run(["_fake_squares"], cfg, echo=lambda *a: None)
    (results / "quick" / "_fake_squares" / target).write_bytes(content)
    argv = ["--quick", "--results-dir", str(results), "--no-progress", "--no-figures", "_fake_squares"]
    rc, text = _call(lambda a: cli.main(a, out=print), argv + ([] if mode == "run" else [mode]))
    assert rc in (0, 1, 2, 3), (target, content, mode, rc, text)
    assert "Traceback" not in text, (target, content, mode, text)
