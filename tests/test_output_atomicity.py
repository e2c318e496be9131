"""Committed outputs change only by complete, atomic replacement: a run killed (SIGKILL) at random instants while it
re-renders an experiment's figures leaves every figure either the old file or a complete new one, never missing and
never truncated, and the tables and manifest readable. Runs `run_all.py` in subprocesses on a throw-away
experiment loaded from $ATTNLIP_EXPERIMENTS_PATH."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time

import pandas as pd

from harness.store.codehash import REPO_ROOT

FIGS = '''
import os, time
from harness.catalog import Experiment, experiment

@experiment
class FakeFigures(Experiment):
    name = "_fake_figs"
    grid = {"i": [0, 1]}

    def run(self, cell, ctx):
        return [{"v": float(cell["i"])}]

    def figures(self, table, outdir):
        from harness import plotting
        out = []
        for k in range(3):
            fig, ax = plotting.figure()
            ax.plot(table["i"], table["v"] * (k + 1), "o")
            ax.set_title(os.environ.get("FIG_VERSION", "old") + f" {k}")
            if os.environ.get("FIG_MARK"):  # tells the test which figure is being written now
                with open(os.environ["FIG_MARK"], "a") as fh:
                    fh.write(f"{k}\\n")
            out += plotting.save(fig, outdir, f"fig{k}")
            time.sleep(float(os.environ.get("FIG_SLEEP", "0")))
        return out
'''


def _env(tmp_path, version, sleep=0.0, mark=""):
    mod = tmp_path / "fake_figs.py"
    mod.write_text(FIGS)
    env = {k: v for k, v in os.environ.items() if k != "ATTNLIP_EXPERIMENTS_PATH"}
    env.update(ATTNLIP_EXPERIMENTS_PATH=str(mod), FIG_VERSION=version, FIG_SLEEP=str(sleep), MPLBACKEND="Agg",
               OMP_NUM_THREADS="1", FIG_MARK=str(mark))
    return env


def _cmd(tmp_path, *extra):
    return [sys.executable, "run_all.py", "_fake_figs", "--no-progress", "--results-dir", str(tmp_path / "res"),
            *extra]


def _complete_png(b: bytes) -> bool:
    return b.startswith(b"\x89PNG\r\n\x1a\n") and b.rstrip(b"\x00").endswith(b"IEND\xaeB`\x82")


def _complete_pdf(b: bytes) -> bool:
    return b.startswith(b"%PDF") and b"%%EOF" in b[-64:]


def test_a_killed_rerender_never_loses_or_truncates_a_figure(tmp_path):
    r = subprocess.run(_cmd(tmp_path), cwd=REPO_ROOT, env=_env(tmp_path, "old"), capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = tmp_path / "res" / "_fake_figs"
    names = [f"fig{k}.{ext}" for k in range(3) for ext in ("png", "pdf")]
    old = {n: (out / "figures" / n).read_bytes() for n in names}
    assert all(old.values())
    rng = random.Random(0)
    new_seen = 0
    for i in range(6):  # re-render from the cache (the cells are cached), killed while it writes figure k
        mark = tmp_path / f"mark{i}"
        p = subprocess.Popen(_cmd(tmp_path, "--collect"), cwd=REPO_ROOT,
                             env=_env(tmp_path, "new", sleep=0.2, mark=mark),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        k, t0 = rng.randint(1, 3), time.time()
        while time.time() - t0 < 120 and p.poll() is None and \
                len(mark.read_text().split() if mark.exists() else []) < k:
            time.sleep(0.005)
        time.sleep(rng.uniform(0.0, 0.3))
        p.send_signal(signal.SIGKILL)
        p.wait()
        for n in names:
            f = out / "figures" / n
            assert f.is_file(), f"{n} missing after a kill"
            b = f.read_bytes()
            assert b == old[n] or (_complete_png(b) if n.endswith("png") else _complete_pdf(b)), f"{n} truncated"
            new_seen += b != old[n]
        json.loads((out / "manifest.json").read_text())
        assert len(pd.read_csv(out / "table.csv")) == len(pd.read_parquet(out / "table.parquet")) == 2
    r = subprocess.run(_cmd(tmp_path, "--collect"), cwd=REPO_ROOT, env=_env(tmp_path, "new"), capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert all((out / "figures" / n).read_bytes() != old[n] for n in names if n.endswith("png"))
    assert not list(out.glob(".figures-staging-*"))  # a killed run's staging folder is cleaned by the next


def test_a_figure_that_fails_leaves_the_old_figures(tmp_path):
    env = _env(tmp_path, "old")
    assert subprocess.run(_cmd(tmp_path), cwd=REPO_ROOT, env=env, capture_output=True, timeout=300).returncode == 0
    out = tmp_path / "res" / "_fake_figs" / "figures"
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    (tmp_path / "fake_figs.py").write_text(FIGS.replace('ax.set_title(', 'ax.set_title(1 / 0 if k == 1 else '))
    env = dict(env, ATTNLIP_EXPERIMENTS_PATH=str(tmp_path / "fake_figs.py"))
    r = subprocess.run(_cmd(tmp_path, "--collect"), cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 1 and "ZeroDivisionError" in r.stdout + r.stderr
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
