"""The Slurm executor on a real cluster, end to end through `run_all.py --executor submitit --cluster slurm`: a job
array computes an experiment's cells, a job cancelled mid-run is reported and the next run resumes from the cells
finished before the cancel. Skipped (with the reason) unless a Slurm controller answers `sinfo`; `.ci/slurm-up.sh`
starts a single-node cluster (CI runs it before the tests). The error for `sbatch` without a cluster that answers
is tested with fake Slurm commands on PATH, so it runs everywhere."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from harness import cli
from harness.run import executors

REPO = Path(__file__).resolve().parent.parent
EXP = "jasmin_softmax"  # the cheapest experiment: a few ms of compute per cell, so a task costs its start-up
SETS = ["--scale", "test", "--set", "resolution=5,7,9,11"]  # four cells: one Slurm array task each
RUN_TIMEOUT_S = 240


def _slurm_or_skip() -> None:
    try:
        warning = executors.check_slurm(timeout_s=10)
    except executors.ClusterUnavailable as e:
        pytest.skip(f"no Slurm cluster here ({e})")
    if warning:
        pytest.skip(f"the Slurm cluster has no usable node ({warning})")


def _cmd(results: Path) -> list:
    return [sys.executable, str(REPO / "run_all.py"), EXP, *SETS, "--executor", "submitit", "--cluster", "slurm",
            "--jobs", "1", "--timeout-min", "10", "--results-dir", str(results), "--no-figures", "--no-progress"]


def _cells(results: Path) -> dict:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in (results / "cache" / "cells" / EXP).glob("*.json")}


def _table(results: Path) -> pd.DataFrame:
    (path,) = results.glob(f"**/{EXP}/table.csv")
    return pd.read_csv(path)


def _array_job_id(results: Path, deadline: float) -> str:
    """The Slurm job id of the run's array, from submitit's per-task folders (<cache>/submitit/<job>_<task>)."""
    while time.monotonic() < deadline:
        ids = {d.name.split("_")[0] for d in (results / "cache" / "submitit").glob("*_*") if d.is_dir()}
        if ids:
            assert len(ids) == 1, ids
            return ids.pop()
        time.sleep(0.1)
    raise AssertionError("the runner submitted no Slurm job")


def test_slurm_run_cancelled_then_resumed_from_its_cells(tmp_path):
    _slurm_or_skip()
    results = tmp_path / "results"
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(_cmd(results), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    job = None
    try:
        deadline = time.monotonic() + RUN_TIMEOUT_S
        job = _array_job_id(results, deadline)
        while not _cells(results) and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        subprocess.run(["scancel", job], check=True, timeout=30)  # the tasks still pending or running
        out, err = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        if job is not None:
            subprocess.run(["scancel", job], timeout=30)  # nothing of this test stays queued
    before = _cells(results)
    assert 1 <= len(before) < 4, f"the cancel should land between the first and the last cell:\n{out}\n{err}"
    assert proc.returncode == 1, out + err
    lost = 4 - len(before)
    done, failed = map(int, re.search(r"4 cells: (\d) computed, 0 cached, (\d) failed", out).groups())
    assert done + failed == 4 and failed >= 1, out
    assert re.search(rf"Slurm job {job}_\d+ ended CANCELLED without a result", err), err
    assert "run again to compute its cells" in err

    again = subprocess.run(_cmd(results), cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"4 cells: {lost} computed, {len(before)} cached, 0 failed" in again.stdout, again.stdout
    after = _cells(results)
    assert len(after) == 4
    assert {k: after[k] for k in before} == before  # the cells finished before the cancel were not recomputed

    ref = tmp_path / "serial"  # the same cells computed in this process, serially
    assert cli.main([EXP, *SETS, "--executor", "serial", "--results-dir", str(ref), "--no-figures",
                     "--no-progress"], out=lambda *_: None) == 0
    table = _table(results)
    pd.testing.assert_frame_equal(table, _table(ref))
    assert table["g1"].max() == pytest.approx(0.5)  # g_1's maximum 1/2 at (1/2, 1/2), on every odd grid
    assert sorted(table.groupby("resolution").size().index) == [5, 7, 9, 11]


def _fake_slurm(tmp_path: Path, sinfo: str) -> Path:
    """A folder of fake Slurm commands: `sinfo` runs the given shell body; `sbatch` records that it was called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    bodies = {"sinfo": sinfo, "sbatch": f"touch {tmp_path / 'sbatch-called'}; echo 'Submitted batch job 1'",
              "squeue": "exit 0", "scancel": "exit 0"}
    for name, body in bodies.items():
        p = bin_dir / name
        p.write_text(f"#!/bin/sh\n{body}\n")
        p.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize("cluster", [["--cluster", "slurm"], ["--executor", "submitit"]])  # explicit, or sbatch found
def test_sbatch_without_a_cluster_is_a_clear_error_before_submitting(tmp_path, monkeypatch, capsys, cluster):
    bin_dir = _fake_slurm(tmp_path, "echo 'sinfo: error: slurm_load_partitions: Unable to contact slurm "
                                    "controller (connect failure)' >&2; exit 1")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    rc = cli.main([EXP, *SETS, *cluster, "--results-dir", str(tmp_path / "r"), "--no-progress"],
                  out=lambda *_: None)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert "no Slurm cluster answers" in err and "Unable to contact slurm controller" in err
    assert ".ci/slurm-up.sh" in err and "--cluster local" in err  # the fixes
    assert "Traceback" not in err and "FailedJobError" not in err
    assert not (tmp_path / "sbatch-called").exists()


def test_a_controller_that_hangs_counts_as_no_cluster(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{_fake_slurm(tmp_path, 'sleep 30')}{os.pathsep}{os.environ['PATH']}")
    t0 = time.monotonic()
    with pytest.raises(executors.ClusterUnavailable, match=r"got no reply within 1 s"):
        executors.check_slurm(timeout_s=1)
    assert time.monotonic() - t0 < 10


def test_missing_slurm_commands_and_unusable_nodes_are_named(tmp_path, monkeypatch):
    bin_dir = _fake_slurm(tmp_path, "echo 'debug|up|down*|1'")
    monkeypatch.setenv("PATH", str(bin_dir))
    assert "no Slurm node is usable now (debug up down*)" in executors.check_slurm()
    (bin_dir / "squeue").unlink()
    with pytest.raises(executors.ClusterUnavailable, match=r"squeue is not on PATH"):
        executors.check_slurm()


def test_squeue_states_of_array_tasks(tmp_path, monkeypatch):
    bin_dir = _fake_slurm(tmp_path, "exit 0")
    (bin_dir / "squeue").write_text("#!/bin/sh\necho \"$*\" > " + str(tmp_path / "args") +
                                    "\nprintf '7_0|COMPLETED\\n7_1|CANCELLED\\n7_2|RUNNING\\n'\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert executors.slurm_states(["7_0", "7_2"]) == {"7_0": "COMPLETED", "7_1": "CANCELLED", "7_2": "RUNNING"}
    assert "-j 7" in (tmp_path / "args").read_text()  # one query per array, tasks listed one by one (-r)
    (bin_dir / "squeue").write_text("#!/bin/sh\nexit 1\n")
    assert executors.slurm_states(["7_0"]) is None  # no answer: nothing is declared ended
