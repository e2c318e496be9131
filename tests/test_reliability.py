"""Reliability of the runner and stores: no orphan workers, concurrent runners split the work,
unwritable caches and damaged cells are reported with their real cause, never crash a run or --collect."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness import cli
from harness import run as runner
from harness.store import cells
from tests._harness_fakes import registered_fakes

REPO = Path(__file__).resolve().parent.parent
psutil = pytest.importorskip("psutil")


@pytest.fixture
def fake(tmp_path, monkeypatch):
    yield from registered_fakes(tmp_path, monkeypatch, "fake_rel")


def _env(mod, **kw):
    return dict(os.environ, ATTNLIP_EXPERIMENTS_PATH=str(mod), PYTHONWARNINGS="ignore", **kw)


def test_workers_exit_when_the_runner_is_killed(fake, tmp_path):
    mod, _ = fake
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, str(REPO / "run_all.py"), "_fake_slow", "--executor", "process",
                             "-j", "2", "--results-dir", str(results), "--no-figures", "--no-progress"],
                            env=_env(mod, ATTNLIP_TEST_SLEEP="1.5"), cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    runner_proc = psutil.Process(proc.pid)
    deadline = time.time() + 60
    workers = []
    while time.time() < deadline and len(workers) < 2:
        workers = [c for c in runner_proc.children(recursive=True) if "resource_tracker" not in " ".join(c.cmdline())]
        time.sleep(0.1)
    assert workers, "no worker processes started"
    os.kill(proc.pid, signal.SIGKILL)  # only the runner, as `kill -9 <pid>` would
    proc.wait()
    gone, alive = psutil.wait_procs(workers, timeout=15)
    for p in alive:
        p.kill()
    assert not alive, f"{len(alive)} orphan worker(s) still running after their runner died"


def test_two_concurrent_runners_split_the_work(fake, tmp_path):
    mod, counter = fake
    results = tmp_path / "results"
    cmd = [sys.executable, str(REPO / "run_all.py"), "_fake_slow", "--results-dir", str(results), "--no-figures",
           "--no-progress"]
    env = _env(mod, ATTNLIP_TEST_SLEEP="0.4")
    a = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    b = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out_a, out_b = a.communicate(timeout=120)[0], b.communicate(timeout=120)[0]
    assert a.returncode == 0 and b.returncode == 0, out_a + out_b
    computed = counter.read_text().splitlines()
    assert len(computed) == 8 and len(set(computed)) == 8, f"cells computed twice: {sorted(computed)}"
    t = pd.read_csv(results / "_fake_slow" / "table.csv")
    assert sorted(t["i2"]) == [2 * i for i in range(8)]
    assert not list((results / "cache" / "claims").rglob("*.claim"))  # every claim released


def test_unwritable_cache_reports_and_keeps_rows(fake, tmp_path, monkeypatch):
    """Root ignores file permissions, so a read-only/full cache is simulated at the write call."""
    cfg = runner.RunConfig(results_dir=tmp_path / "r", progress=False, figures=False)
    (r,) = runner.run(["_fake_squares"], cfg, echo=lambda *a: None)
    assert r.computed == 6
    files = sorted((tmp_path / "r" / "cache" / "cells" / "_fake_squares").glob("*.json"))
    files[0].write_text(files[0].read_text()[:-10])  # a damaged cell in a cache we cannot write to

    def refuse(self, record):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(cells.CellCache, "save", refuse)
    monkeypatch.setattr(cells.CellCache, "remove", lambda self, e, k: False)
    lines = []
    (r,) = runner.run(["_fake_squares"], cfg, echo=lines.append)
    assert (r.corrupt, r.computed, r.cached, r.failed, r.uncached) == (1, 1, 5, 0, 1)
    assert any("read-only" in l for l in lines) and any("NOT CACHED" in l for l in lines)
    assert len(pd.read_csv(tmp_path / "r" / "_fake_squares" / "table.csv")) == 12  # the rows are kept
    # --collect over the damaged cell: reported as missing, never a raw OSError
    rc = cli.main(["_fake_squares", "--collect", "--results-dir", str(tmp_path / "r")], out=lines.append)
    assert rc == 1 and any("1 missing" in l for l in lines)


def test_a_full_cache_disk_is_one_line_and_the_run_goes_on(fake, tmp_path, monkeypatch):
    """ENOSPC at the cell write and at the claim: every cell is still computed and its rows kept, the result line
    says "cache disk full: N MB free at PATH", and no claim is left to stall a later run."""
    import errno

    from harness.store import claims

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cells.CellCache, "save", full)
    monkeypatch.setattr(claims, "_create", full)
    cfg = runner.RunConfig(results_dir=tmp_path / "r", progress=False, figures=False, jobs=1)
    lines = []
    (r,) = runner.run(["_fake_squares"], cfg, echo=lines.append)
    assert (r.computed, r.uncached, r.failed) == (6, 6, 0)
    assert any("6 NOT CACHED (cache disk full: " in l and " MB free at " in l for l in lines), lines
    assert len(pd.read_csv(tmp_path / "r" / "_fake_squares" / "table.csv")) == 12
    assert not list((tmp_path / "r" / "cache").rglob("*.claim"))


def test_full_disk_while_writing_outputs_names_the_cause(fake, tmp_path, monkeypatch):
    from harness.run import outputs

    def full(path, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs, "atomic_write_bytes", full)
    cfg = runner.RunConfig(results_dir=tmp_path / "r", progress=False, figures=False)
    (r,) = runner.run(["_fake_squares"], cfg, echo=lambda *a: None)
    assert r.figure_error and "No space left on device" in r.figure_error and "writing outputs" in r.figure_error
    assert r.computed == 6  # the cells are cached; a rerun after freeing space only rewrites the outputs


def _cells_cached(results: Path) -> list:
    return sorted((results / "cache" / "cells" / "_fake_slow").glob("*.json"))


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_ctrl_c_ends_a_run_in_one_line(fake, tmp_path, jobs):
    """Ctrl-C (SIGINT to the runner's process group, as a terminal sends it) once a cell is cached: one line, exit
    130, the cached cells whole, no temp file or claim left, no worker left, no traceback from runner or pool."""
    mod, _ = fake
    results = tmp_path / "results"
    proc = subprocess.Popen([sys.executable, str(REPO / "run_all.py"), "_fake_slow", "-j", jobs, "--results-dir",
                             str(results), "--no-figures", "--no-progress"], env=_env(mod, ATTNLIP_TEST_SLEEP="0.7"),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    deadline = time.time() + 90
    while time.time() < deadline and not _cells_cached(results) and proc.poll() is None:
        time.sleep(0.05)
    workers = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, (proc.returncode, out, err)
    assert "Traceback" not in err + out and "KeyboardInterrupt" not in err + out, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("run_all.py: interrupted; ") and "rerun to continue" in lines[0]
    kept = _cells_cached(results)
    assert 1 <= len(kept) < 8 and f"{len(kept)} cell(s) kept" in lines[0], (lines, kept)
    for f in kept:
        cells.load_cell(f)  # whole: parses, checksum matches
    assert not [p for p in results.rglob("*") if ".tmp." in p.name or p.suffix == ".claim"]
    gone, alive = psutil.wait_procs(workers, timeout=15)
    assert not alive, f"{len(alive)} worker(s) still running"


def test_ctrl_c_during_collect_is_one_line(fake, tmp_path, capsys, monkeypatch):
    from harness.run import runner as R

    results = str(tmp_path / "results")
    assert cli.main(["_fake_squares", "--results-dir", results, "--no-progress", "--no-figures"],
                    out=lambda *a: None) == 0

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(R, "write_outputs", interrupted)
    capsys.readouterr()
    try:
        rc = cli.main(["_fake_squares", "--collect", "--results-dir", results, "--no-progress"], out=lambda *a: None)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C during --collect escaped as a KeyboardInterrupt (a traceback)")
    err = capsys.readouterr().err
    assert rc == 130 and err.startswith("run_all.py: interrupted; ") and len(err.strip().splitlines()) == 1, err
