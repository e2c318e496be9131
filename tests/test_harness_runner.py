"""Runner + cache behaviour (benchopt-style cache tests) on throw-away experiments in a temp dir."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness import cli, catalog
from harness.run import discovery
from harness import run as runner
from harness.store import atomic, cells, codehash, keys
from tests._harness_fakes import write_fake

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """Register the fake experiments from a temp module; env for counters; results dir in tmp."""
    mod = write_fake(tmp_path / "fake_exps.py")
    counter = tmp_path / "counter.txt"
    counter.touch()
    monkeypatch.setenv("ATTNLIP_TEST_COUNTER", str(counter))
    for k in ("ATTNLIP_TEST_SLEEP", "ATTNLIP_TEST_FAIL", "ATTNLIP_TEST_MISSING"):
        monkeypatch.delenv(k, raising=False)
    discovery.load_all()
    discovery.load_module_file(mod)

    class F:
        module = mod
        results = tmp_path / "results"

        @staticmethod
        def count():
            return counter.read_text().splitlines()

        @staticmethod
        def cfg(**kw):
            kw.setdefault("figures", False)
            kw.setdefault("progress", False)
            return runner.RunConfig(results_dir=tmp_path / "results", **kw)

    yield F
    for n in ("_fake_squares", "_fake_slow"):
        catalog.unregister(n)
    sys.modules.pop("_attnlip_ext_fake_exps", None)


def _run(names, cfg):
    return {r.name: r for r in runner.run(names, cfg, echo=lambda *a: None)}


def _table(results_dir, name):
    t = pd.read_csv(Path(results_dir) / name / "table.csv")
    return t.sort_values(["cell", "k"] if "k" in t else ["cell"]).reset_index(drop=True)


def test_second_run_computes_nothing(fake):
    r = _run(["_fake_squares"], fake.cfg())["_fake_squares"]
    assert (r.computed, r.cached, r.failed) == (6, 0, 0)
    r = _run(["_fake_squares"], fake.cfg())["_fake_squares"]
    assert (r.computed, r.cached, r.failed) == (0, 6, 0)
    assert len(fake.count()) == 6
    t = _table(fake.results, "_fake_squares")
    assert len(t) == 12 and {"experiment", "cell", "seed", "device", "dtype", "n", "mult", "value"} <= set(t)
    man = json.loads((fake.results / "_fake_squares" / "manifest.json").read_text())
    assert man["complete"] and len(man["cells"]) == 6
    assert all(c["wall_s"] >= 0 and c["peak_rss_mb"] > 0 for c in man["cells"])
    assert man["versions"]["torch"] and man["git"] is not None


def test_force_recomputes(fake):
    _run(["_fake_squares"], fake.cfg())
    r = _run(["_fake_squares"], fake.cfg(force=True))["_fake_squares"]
    assert (r.computed, r.cached) == (6, 0)
    assert len(fake.count()) == 12


def test_keys_do_not_depend_on_order(fake):
    exp = catalog.get_experiment("_fake_squares")
    code = codehash.experiment_code(exp)["hash"]
    k1 = keys.cell_key("e", {"n": 1, "mult": 2.0}, 0, "float64", "cpu", code)
    k2 = keys.cell_key("e", {"mult": 2.0, "n": 1}, 0, "float64", "cpu", code)
    assert k1 == k2
    assert keys.cell_key("e", {"n": 1, "mult": 2.0}, 1, "float64", "cpu", code) != k1  # seed
    assert keys.cell_key("e", {"n": 1, "mult": 2.0}, 0, "float32", "cpu", code) != k1  # dtype
    assert keys.cell_key("e", {"n": 1, "mult": 2.0}, 0, "float64", "cpu", code, model_source="hub:x") != k1
    assert keys.cell_key("e", {"n": 1, "mult": 2.0}, 0, "float64", "cpu", code,
                         versions={"torch": "0.0"}) != k1  # library versions that change numbers
    assert keys.cell_key("e", {"n": 1, "mult": 2.0}, 0, "float64", "cuda:1", code) == \
        keys.cell_key("e", {"n": 1, "mult": 2.0}, 0, "float64", "cuda:0", code)
    _run(["_fake_slow", "_fake_squares"], fake.cfg())
    res = _run(["_fake_squares", "_fake_slow"], fake.cfg())
    assert all(r.computed == 0 for r in res.values())
    # a reordered --set selection hits the same cells
    res = _run(["_fake_squares"], fake.cfg(overrides={"n": [3, 1]}))
    assert res["_fake_squares"].computed == 0 and res["_fake_squares"].cached == 4


def test_editing_a_harness_dependency_invalidates(fake, monkeypatch):
    exp = catalog.get_experiment("_fake_squares")
    files = codehash.experiment_code(exp)["files"]
    names = {Path(f).relative_to(codehash.REPO_ROOT).as_posix() for f in files}
    assert "harness/context.py" in names  # the context, seeding and deterministic blocks: in every key
    assert not {"harness/catalog.py", "harness/run/worker.py", "harness/cli.py", "harness/plotting.py",
                "harness/config.py", "harness/store/cells.py"} & names  # infrastructure (harness.boundary)
    before = codehash.experiment_code(exp)["hash"]
    real = codehash.sha256
    monkeypatch.setattr(codehash, "sha256", lambda b: real(
        b + b"edited" if isinstance(b, bytes) and b"class Context" in b else b))
    assert codehash.experiment_code(exp)["hash"] != before


def test_import_closure_follows_helpers(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from .kern import f\n")
    (pkg / "sub" / "kern.py").write_text("from ..util import g\n")
    (pkg / "util.py").write_text("X = 1\n")
    (pkg / "unrelated.py").write_text("Y = 2\n")
    (pkg / "dyn.py").write_text("import importlib\nimportlib.import_module('pkg.unrelated')\n")
    roots = {"pkg": pkg}
    got = {p.relative_to(tmp_path).as_posix() for p in codehash.module_closure(["pkg.sub"], roots)}
    assert got == {"pkg/__init__.py", "pkg/sub/__init__.py", "pkg/sub/kern.py", "pkg/util.py"}
    h1 = codehash.files_hash(codehash.module_closure(["pkg.sub"], roots), tmp_path)
    (pkg / "util.py").write_text("X = 2  # edited helper\n")
    assert codehash.files_hash(codehash.module_closure(["pkg.sub"], roots), tmp_path) != h1
    assert codehash.module_closure(["pkg.dyn"], roots) is None  # dynamic import -> caller hashes everything


def test_failed_cell_not_cached_and_retried(fake, monkeypatch, capsys):
    monkeypatch.setenv("ATTNLIP_TEST_FAIL", "2")
    rc = cli.main(["_fake_squares", "--results-dir", str(fake.results), "--no-figures", "--no-progress"],
                  out=lambda *a: None)
    assert rc == 1
    err = capsys.readouterr().err
    assert "boom at n=2" in err and "RuntimeError" in err
    t = _table(fake.results, "_fake_squares")
    assert sorted(t["n"].unique()) == [1, 3]  # the other cells completed
    assert (fake.results / "cache" / "failures" / "_fake_squares").is_dir()
    monkeypatch.delenv("ATTNLIP_TEST_FAIL")
    r = _run(["_fake_squares"], fake.cfg())["_fake_squares"]
    assert (r.computed, r.cached, r.failed) == (2, 4, 0)
    assert not list((fake.results / "cache" / "failures" / "_fake_squares").glob("*.txt"))


def test_missing_data_runs_the_rest_then_fails_with_the_fix(fake, monkeypatch, capsys):
    monkeypatch.setenv("ATTNLIP_TEST_MISSING", "3")
    r = _run(["_fake_squares"], fake.cfg())["_fake_squares"]
    assert (r.computed, r.missing_data, r.failed) == (4, 2, 0) and not r.ok  # never passes silently
    rc = cli.main(["_fake_squares", "--results-dir", str(fake.results), "--no-figures", "--no-progress"],
                  out=lambda *a: None)
    err = capsys.readouterr().err
    assert rc == 1
    assert "MISSING DATA" in err and "n=3" in err and "fake data folder absent" in err and "fix:" in err


def test_corrupt_cell_detected_and_recomputed(fake):
    _run(["_fake_squares"], fake.cfg())
    files = sorted((fake.results / "cache" / "cells" / "_fake_squares").glob("*.json"))
    files[0].write_bytes(files[0].read_bytes()[:40])  # truncated
    rec = json.loads(files[1].read_text())
    rec["rows"][0]["value"] = 123.0  # edited without fixing the checksum
    files[1].write_text(json.dumps(rec))
    with pytest.raises(cells.CorruptCell):
        cells.load_cell(files[0])
    with pytest.raises(cells.CorruptCell, match="checksum"):
        cells.load_cell(files[1])
    r = _run(["_fake_squares"], fake.cfg())["_fake_squares"]
    assert (r.corrupt, r.computed, r.cached) == (2, 2, 4)
    assert 123.0 not in set(_table(fake.results, "_fake_squares")["value"])


def test_a_crafted_cell_with_a_valid_checksum_is_corrupt_too(fake):
    """A checksum proves a file unchanged, not sensible: text where the other cells hold numbers, parameters that
    are not the cell's, or no rows, each with a freshly computed checksum, are recomputed and the table is the same
    as before (byte for byte)."""
    from harness.store.atomic import canonical_json, sha256

    _run(["_fake_squares"], fake.cfg())
    before = (fake.results / "_fake_squares" / "table.csv").read_bytes()
    files = sorted((fake.results / "cache" / "cells" / "_fake_squares").glob("*.json"))

    def craft(path, edit):
        rec = json.loads(path.read_text())
        edit(rec)
        body = {k: v for k, v in rec.items() if k != "checksum"}
        rec["checksum"] = sha256(canonical_json(body))
        path.write_text(json.dumps(rec))
        cells.load_cell(path)  # the checksum holds

    craft(files[0], lambda r: r["rows"][0].update(value="not a number"))
    craft(files[1], lambda r: r["cell"].update(n=99))
    craft(files[2], lambda r: r.update(rows=[]))
    r = _run(["_fake_squares"], fake.cfg())["_fake_squares"]
    assert (r.corrupt, r.computed, r.cached) == (3, 3, 3)
    assert (fake.results / "_fake_squares" / "table.csv").read_bytes() == before


def test_collect_rebuilds_from_cache_alone(fake):
    _run(["_fake_squares"], fake.cfg(figures=True))
    before = _table(fake.results, "_fake_squares")
    import shutil

    shutil.rmtree(fake.results / "_fake_squares")
    rc = cli.main(["_fake_squares", "--collect", "--results-dir", str(fake.results), "--no-progress"],
                  out=lambda *a: None)
    assert rc == 0 and len(fake.count()) == 6
    pd.testing.assert_frame_equal(_table(fake.results, "_fake_squares"), before)
    assert (fake.results / "_fake_squares" / "figures" / "squares.png").is_file()
    assert (fake.results / "_fake_squares" / "figures" / "squares.pdf").is_file()
    assert (fake.results / "_fake_squares" / "table.parquet").is_file()
    readme = (fake.results / "README.md").read_text()
    assert "_fake_squares" in readme and "Fake Fig. 0" in readme and "squares.png" in readme
    assert "max value 18" in readme
    # collect with cells missing from the cache: reported, non-zero
    rc = cli.main(["_fake_squares", "--collect", "--set", "n=4", "--results-dir", str(fake.results)],
                  out=lambda *a: None)
    assert rc == 1


def test_process_and_submitit_match_serial(fake):
    _run(["_fake_squares"], fake.cfg())
    serial = _table(fake.results, "_fake_squares")
    for ex in ("process", "submitit"):
        cfg = fake.cfg(executor=ex, jobs=2, cluster="local" if ex == "submitit" else None)
        cfg.results_dir = fake.results.parent / f"results_{ex}"
        cfg.cache_dir = cfg.results_dir / "cache"
        r = _run(["_fake_squares"], cfg)["_fake_squares"]
        assert (r.computed, r.failed) == (6, 0), runner.format_errors([r])
        pd.testing.assert_frame_equal(_table(cfg.results_dir, "_fake_squares"), serial)
    assert len(fake.count()) == 18


def test_unknown_experiment_is_a_clear_error(fake, capsys):
    assert cli.main(["_fake_squaers", "--results-dir", str(fake.results)]) == 2
    err = capsys.readouterr().err
    assert "unknown experiment '_fake_squaers'" in err and "_fake_squares" in err
    assert cli.main(["--only", "zzz*", "--results-dir", str(fake.results)]) == 2
    assert "matches no experiment" in capsys.readouterr().err
    assert cli.main(["_fake_squares", "--set", "nope=1", "--results-dir", str(fake.results)]) == 2
    assert "nope" in capsys.readouterr().err


def test_list_and_dry_run(fake):
    _run(["_fake_squares"], fake.cfg(overrides={"n": [1]}))
    lines = []
    assert cli.main(["_fake_*", "--list", "--results-dir", str(fake.results)], out=lines.append) == 0
    row = next(l for l in lines if l.startswith("_fake_squares"))
    assert "Fake Fig. 0" in row and row.split()[-3:-1] == ["6", "2"]
    lines = []
    assert cli.main(["_fake_squares", "--dry-run", "--quick", "--set", "mult=2.0",
                     "--results-dir", str(fake.results)], out=lines.append) == 0
    head = next(l for l in lines if l.startswith("_fake_squares"))
    assert "2 cells, 1 cached" in head  # equal cells of two scales share one computation (scale not read)
    lines = []
    cli.main(["_fake_squares", "--dry-run", "--results-dir", str(fake.results)], out=lines.append)
    states = [l.split()[0] for l in lines[1:]]
    assert states.count("cached") == 2 and states.count("missing") == 4


def test_seed_reaches_cells(fake):
    cli.main(["_fake_squares", "--seed", "7", "--set", "n=1", "--results-dir", str(fake.results),
              "--no-figures"], out=lambda *a: None)
    root = runner.RunConfig(results_dir=fake.results, seed=7, overrides={"n": [1]}).output_root
    assert root == fake.results / "custom" / "full__n=1__seed=7"  # its own folder, named after what differs
    t = _table(root, "_fake_squares")
    assert set(t["seed"]) == {7} and set(t["ctx_seed"]) == {7}


def test_stale_tmp_files_removed(fake):
    d = fake.results / "cache" / "cells" / "_fake_squares"
    d.mkdir(parents=True)
    import socket

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = d / f".abc.json{atomic.TMP_MARK}{socket.gethostname()}.{dead.pid}.xyz"
    stale.write_text("{partial")
    mine = d / f".def.json{atomic.TMP_MARK}{socket.gethostname()}.{os.getpid()}.xyz"
    mine.write_text("{in progress")
    _run(["_fake_squares"], fake.cfg())
    assert not stale.exists() and mine.exists()  # a live writer's temp file is left alone


def test_sigkill_mid_run_resumes(fake):
    env = dict(os.environ, ATTNLIP_EXPERIMENTS_PATH=str(fake.module), ATTNLIP_TEST_SLEEP="0.3",
               PYTHONWARNINGS="ignore")
    cell_dir = fake.results / "cache" / "cells" / "_fake_slow"
    proc = subprocess.Popen([sys.executable, str(REPO / "run_all.py"), "_fake_slow", "--results-dir",
                             str(fake.results), "--no-figures", "--no-progress"], env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline and len(list(cell_dir.glob("*.json"))) < 2 and proc.poll() is None:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    done = {p.stem for p in cell_dir.glob("*.json")}
    assert 2 <= len(done) < 8, f"kill came too late/early: {len(done)} cells done"
    for p in cell_dir.glob("*.json"):
        cells.load_cell(p)  # every visible cell file is complete
    before = len(fake.count())
    r = _run(["_fake_slow"], fake.cfg())["_fake_slow"]
    assert r.cached == len(done) and r.computed == 8 - len(done) and r.failed == 0
    recomputed = {l.split("i=")[1] for l in fake.count()[before:]}
    finished_before = {str(c["i"]) for c in (json.loads((cell_dir / f"{k}.json").read_text())["cell"] for k in done)}
    assert not recomputed & finished_before
    leftovers = [p for p in fake.results.rglob("*") if atomic.TMP_MARK in p.name]
    assert not leftovers
    assert len(_table(fake.results, "_fake_slow")) == 8


def test_figure_failure_reported_table_kept(fake, monkeypatch, capsys):
    monkeypatch.setenv("ATTNLIP_TEST_FIGFAIL", "1")
    rc = cli.main(["_fake_squares", "--set", "n=1", "--results-dir", str(fake.results), "--no-progress"],
                  out=lambda *a: None)
    assert rc == 1 and "figure bug" in capsys.readouterr().err
    assert len(_table(fake.results / "custom" / "full__n=1", "_fake_squares")) == 4


def test_decorator_figures_kwarg_means_paper_refs():
    @catalog.experiment(name="_fake_kw", figures=["Paper Fig. 9"])
    class K(catalog.Experiment):
        def run(self, cell, ctx):
            return []

    try:
        e = catalog.get_experiment("_fake_kw")
        assert e.figures_ref == ["Paper Fig. 9"] and callable(e.figures)
    finally:
        catalog.unregister("_fake_kw")


def test_dead_worker_loses_no_other_cell(fake, monkeypatch, tmp_path):
    """A cell whose worker process is killed (as by the OOM killer) takes the pool down: the runner retries the
    unfinished cells in fresh processes, so every other cell is computed; a cell that kills its worker even alone
    is reported failed with a clear reason, never cached."""
    monkeypatch.setenv("ATTNLIP_TEST_KILL_DIR", str(tmp_path))
    monkeypatch.setenv("ATTNLIP_TEST_KILL_ONCE", "1")
    monkeypatch.setenv("ATTNLIP_TEST_KILL_ALWAYS", "4")
    cfg = fake.cfg(executor="process", jobs=2)
    r = _run(["_fake_killer"], cfg)["_fake_killer"]
    assert (r.computed, r.failed) == (5, 1), runner.format_errors([r])
    assert "even running this cell alone" in runner.format_errors([r])
    assert sorted(_table(fake.results, "_fake_killer")["i"].unique()) == [0, 1, 2, 3, 5]
    monkeypatch.delenv("ATTNLIP_TEST_KILL_ALWAYS")  # a rerun computes only the failed cell
    r = _run(["_fake_killer"], cfg)["_fake_killer"]
    assert (r.computed, r.cached, r.failed) == (1, 5, 0)


def test_fresh_workers_run_each_cell_in_its_own_process(fake):
    cfg = fake.cfg(executor="process", jobs=2)
    cfg.fresh_workers = True
    r = _run(["_fake_squares"], cfg)["_fake_squares"]
    assert (r.computed, r.failed) == (6, 0)
    cells = json.loads((fake.results / "_fake_squares" / "manifest.json").read_text())["cells"]
    assert len({c["pid"] for c in cells}) == 6


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_manifest_dirty_flag_ignores_results_only(tmp_path):
    """A collect rewrites committed files under results/ while it writes manifests: that is not dirty code;
    an edited tracked file elsewhere is."""
    from harness.manifest import git_info

    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "table.csv").write_text("a\n1\n")
    (tmp_path / "code.py").write_text("x = 1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", "commit", "-qm", "init")
    assert git_info(tmp_path)["dirty"] is False
    (tmp_path / "results" / "table.csv").write_text("a\n2\n")
    assert git_info(tmp_path)["dirty"] is False
    (tmp_path / "code.py").write_text("x = 2\n")
    assert git_info(tmp_path)["dirty"] is True


def test_jobs_without_executor_uses_the_process_pool():
    """`run_all.py -j 2` must not silently run serially; an explicit --executor wins."""
    ap = cli.build_parser()
    assert cli._run_config(ap.parse_args(["-j", "2"])).executor == "process"
    assert cli._run_config(ap.parse_args([])).executor == "serial"
    assert cli._run_config(ap.parse_args(["-j", "2", "--executor", "serial"])).executor == "serial"
    assert cli._run_config(ap.parse_args(["-j", "3", "--executor", "submitit"])).executor == "submitit"
    assert cli._run_config(ap.parse_args(["-j", "3", "--cluster", "local"])).executor == "submitit"
    assert cli._run_config(ap.parse_args(["--fresh-workers"])).executor == "process"

