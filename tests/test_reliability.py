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
