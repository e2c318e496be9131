"""`run_all.py --verify [--stamp]` and `--render` never pass or certify what they did not check: the whole committed
table is compared (column set, column kinds, rows of every cell); a stamp names exactly the commit whose code ran
(no untracked or injected code, the project's own checkout, HEAD and tracked files unchanged until the stamp is
written); a manifest of the wrong shape is one line naming the file and the field; a full disk while stamping is one
line and the old manifest; SIGTERM removes the temporary cache. On the throw-away experiments of
tests/_harness_fakes.py (cells of microseconds)."""
from __future__ import annotations

import errno
import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest

from harness import cli
from harness import run as runner
from harness.run import stamp as S
from harness.run import verify as V
from tests._harness_fakes import registered_fakes

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, strategies as st  # noqa: E402

from tests.test_fuzz import FUZZ, _call  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
NAME = "_fake_squares"
COMMIT = "c0ffee" * 6 + "abcd"
TMP_PREFIX = "attnlip-verify-"  # the temporary cache of a --verify


@pytest.fixture
def fake(tmp_path, monkeypatch):
    fakes = registered_fakes(tmp_path, monkeypatch, "fake_verify_safety")
    mod, _ = next(fakes)
    yield mod
    next(fakes, None)


def _committed(root: Path, names=(NAME,)) -> Path:
    """Committed quick-scale results of the fakes under root; the folder of the first."""
    cfg = runner.RunConfig(results_dir=root, cache_dir=root / "cache", figures=False, progress=False, scale="quick")
    runner.run(list(names), cfg, echo=lambda *a: None)
    return root / "quick" / names[0]


def _verify(root: Path, *extra: str, names=(NAME,)):
    return _call(lambda a: cli.main(a, out=print), ["--verify", "--quick", "--no-progress", "--results-dir",
                                                    str(root), *extra, *names])


def _rewrite(folder: Path, edit) -> None:
    """Both committed copies of the table, edited alike."""
    t = edit(pd.read_parquet(folder / "table.parquet"))
    t.to_parquet(folder / "table.parquet", index=False)
    t.to_csv(folder / "table.csv", index=False)


def _clean_git(monkeypatch, *infos):
    """git_info answers `infos` in turn (the last one from then on); no untracked code."""
    seq = list(infos)
    monkeypatch.setattr(S._manifest, "git_info", lambda: seq.pop(0) if len(seq) > 1 else seq[0])
    monkeypatch.setattr(S, "foreign_code", lambda: [], raising=False)


# ---- the whole table ---------------------------------------------------------------------------------------------
def test_a_column_gone_from_the_committed_table_differs(fake, tmp_path, monkeypatch):
    """Every column counts: those not compared by value (`seed`, `cell_key`, a tolerance of None) too."""
    from harness import catalog

    root = tmp_path / "res"
    folder = _committed(root)
    assert _verify(root)[0] == 0
    _clean_git(monkeypatch, {"commit": COMMIT, "dirty": False})
    monkeypatch.setattr(catalog.get_experiment(NAME), "verify_tol", {"default": 1e-9, "ctx_seed": None})
    for col in ("seed", "cell_key", "ctx_seed"):
        backup = {f: (folder / f).read_bytes() for f in ("table.csv", "table.parquet")}
        _rewrite(folder, lambda t: t.drop(columns=[col]))
        rc, out = _verify(root)
        assert rc == 1 and f"column(s) {col}: written by the current code, not in the committed table" in out, out
        _, out = _call(lambda a: cli.main(a, out=print), ["--verify", "--quick", "--stamp", "--no-progress",
                                                          "--results-dir", str(root), NAME])
        assert "verified" not in json.loads((folder / "manifest.json").read_text())
        for f, data in backup.items():
            (folder / f).write_bytes(data)


def test_column_kinds_copies_and_rows_of_unsampled_cells(fake, tmp_path):
    root = tmp_path / "res"
    folder = _committed(root)
    backup = {f: (folder / f).read_bytes() for f in ("table.csv", "table.parquet")}

    def restore():
        for f, data in backup.items():
            (folder / f).write_bytes(data)

    _rewrite(folder, lambda t: t.assign(value=t["value"].map(repr)))  # numbers written as text
    rc, out = _verify(root)
    assert rc == 1 and "column value: committed as texts, recomputed as numbers" in out, out
    restore()
    pd.read_parquet(folder / "table.parquet").drop(columns=["k"]).to_csv(folder / "table.csv", index=False)
    rc, out = _verify(root)
    assert rc == 1 and "table.csv and table.parquet hold different tables: column(s) k only in table.parquet" in out
    restore()
    man = json.loads((folder / "manifest.json").read_text())
    labels = [c["cell"] for c in man["cells"]]
    sampled = V.sample(man, labels, 1, seed=NAME)
    other = next(lb for lb in labels if lb not in sampled)  # a cell --verify-sample 1 does not recompute
    _rewrite(folder, lambda t: pd.concat([t, t[t["cell"] == other].iloc[:1]], ignore_index=True))
    rc, out = _verify(root, "--verify-sample", "1")
    assert rc == 1 and f"cell {other}: 3 row(s) in the committed table, its manifest records 2" in out, out
    restore()
    assert _verify(root, "--verify-sample", "1")[0] == 0


# ---- what the stamp names ---------------------------------------------------------------------------------------
def test_stamp_refuses_code_outside_the_commit(fake, tmp_path, monkeypatch):
    """ATTNLIP_EXPERIMENTS_PATH (or an untracked module) could replace a committed experiment: refused before
    anything is computed, in one line naming it."""
    root = tmp_path / "res"
    folder = _committed(root)
    before = (folder / "manifest.json").read_bytes()
    monkeypatch.setattr(S._manifest, "git_info", lambda: {"commit": COMMIT, "dirty": False})
    monkeypatch.setenv("ATTNLIP_EXPERIMENTS_PATH", str(tmp_path / "elsewhere.py"))
    monkeypatch.setattr(V, "execute", lambda *a, **k: pytest.fail("computed before refusing"))
    rc, out = _verify(root, "--stamp")
    assert rc == 2 and "ATTNLIP_EXPERIMENTS_PATH=" in out and "Traceback" not in out, out
    assert len(out.strip().splitlines()) == 1 and (folder / "manifest.json").read_bytes() == before


@pytest.mark.skipif(subprocess.run(["git", "--version"], capture_output=True).returncode != 0, reason="needs git")
def test_foreign_code_and_a_copy_inside_another_repository(tmp_path, monkeypatch):
    def git(cwd, *a):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false", *a],
                       cwd=cwd, check=True, capture_output=True)

    proj = tmp_path / "proj"
    for f in ("run_all.py", "harness/__init__.py", "experiments/__init__.py", "experiments/fam/exp.py",
              ".gitignore"):
        (proj / f).parent.mkdir(parents=True, exist_ok=True)
        (proj / f).write_text("__pycache__/\nresults/\n" if f == ".gitignore" else "")
    git(proj, "init", "-q")
    git(proj, "add", "-A")
    git(proj, "commit", "-qm", "init")
    monkeypatch.delenv("ATTNLIP_EXPERIMENTS_PATH", raising=False)
    monkeypatch.setenv("PYTHONPATH", str(proj))
    assert S.foreign_code(proj) == []
    shadow = ["experiments/fam/exp2.py", "harness/__pycache__/x.cpython-311.pyc", "harness/util.py", "torch.py",
              "mypkg/__init__.py", "results/cache/cell.py", "notes.txt", "docs/a.py"]
    for f in shadow:
        (proj / f).parent.mkdir(parents=True, exist_ok=True)
        (proj / f).write_text("")
    assert sorted(S.foreign_code(proj)) == ["experiments/fam/exp2.py", "harness/util.py", "mypkg", "torch.py"]
    for f in shadow:
        (proj / f).unlink()
    nested = proj / "experiments" / "nested"  # a repository of its own inside the checkout: git lists its folder
    (nested / "x.py").parent.mkdir()
    (nested / "x.py").write_text("")
    git(nested, "init", "-q")
    git(proj, "update-index", "--skip-worktree", "experiments/fam/exp.py")  # git status then hides its edits
    (proj / "experiments/fam/exp.py").write_text("print('edited')\n")
    found = S.foreign_code(proj)
    assert "experiments/nested/" in found and any(f.startswith("experiments/fam/exp.py (skip-worktree") for f in found)
    git(proj, "update-index", "--no-skip-worktree", "experiments/fam/exp.py")
    git(proj, "checkout", "--", "experiments/fam/exp.py")
    shutil.rmtree(nested)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(proj), str(tmp_path / "lib")]))
    assert f"PYTHONPATH entry {tmp_path / 'lib'}" in S.foreign_code(proj)
    from harness.manifest import git_info

    assert git_info(proj)["commit"]
    outer = tmp_path / "outer"  # a copy of the project (no .git) inside another repository: no commit of its own
    (outer / "copy" / "harness").mkdir(parents=True)
    (outer / "copy" / "run_all.py").write_text("")
    git(outer, "init", "-q")
    git(outer, "add", "-A")
    git(outer, "commit", "-qm", "outer")
    assert git_info(outer)["commit"] and git_info(outer / "copy") == {"commit": None, "dirty": None}


@pytest.mark.parametrize("later", [{"commit": "beef" * 10, "dirty": False}, {"commit": COMMIT, "dirty": True}])
def test_stamp_refuses_when_the_checkout_changed_during_the_run(fake, tmp_path, monkeypatch, later):
    root = tmp_path / "res"
    folder = _committed(root)
    before = (folder / "manifest.json").read_bytes()
    _clean_git(monkeypatch, {"commit": COMMIT, "dirty": False}, later)
    rc, out = _verify(root, "--stamp")
    assert rc == 2 and "Traceback" not in out and "stamped 1" not in out, out
    assert ("HEAD moved from c0ffeec0ffee to beefbeefbeef" if not later["dirty"] else "commit or stash") in out
    assert (folder / "manifest.json").read_bytes() == before


def test_a_full_disk_while_stamping_is_one_line_and_the_old_manifest(fake, tmp_path, monkeypatch):
    from harness.store import atomic

    root = tmp_path / "res"
    folder = _committed(root)
    before = (folder / "manifest.json").read_bytes()
    _clean_git(monkeypatch, {"commit": COMMIT, "dirty": False})

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full)  # the atomic write fails after writing its temp file
    rc, out = _verify(root, "--stamp")
    assert rc == 1 and "Traceback" not in out, out
    line = next(x for x in out.splitlines() if "error:" in x)
    assert "No space left on device" in line and "0 of 1 manifest(s) stamped" in line, out
    assert (folder / "manifest.json").read_bytes() == before
    assert [p.name for p in folder.iterdir() if ".tmp." in p.name] == []
    monkeypatch.undo()


def test_a_clean_stamp_still_stamps(fake, tmp_path, monkeypatch):
    root = tmp_path / "res"
    folder = _committed(root)
    _clean_git(monkeypatch, {"commit": COMMIT, "dirty": False})
    rc, out = _verify(root, "--stamp")
    assert rc == 0 and "stamped 1 manifest(s) with commit c0ffeec0ffee" in out, out
    assert json.loads((folder / "manifest.json").read_text())["verified"]["commit"] == COMMIT


# ---- manifests of the wrong shape ------------------------------------------------------------------------------
@pytest.mark.parametrize("field,value,named", [
    ("verified", 5, "'verified' is a number, not an object"), ("code_hash", [], "'code_hash' is a list, not text"),
    ("lock", "x", "'lock' is text, not an object"), ("versions", 1.5, "'versions' is a number, not an object"),
    ("cells", [{"cell": "a", "wall_s": "slow"}], "'cells[0].wall_s' is text, not a number"),
    ("verified", {"tables": []}, "'verified.tables' is a list, not an object"),
    ("figures_ref", ["x", None], "'figures_ref[1]' is null, not text")])
def test_a_manifest_of_the_wrong_shape_is_named_and_the_others_go_on(fake, tmp_path, field, value, named):
    root = tmp_path / "res"
    folder = _committed(root, (NAME, "_fake_slow"))
    man = json.loads((folder / "manifest.json").read_text())
    man[field] = value
    (folder / "manifest.json").write_text(json.dumps(man))
    for mode in ("--verify", "--render"):
        rc, out = _call(lambda a: cli.main(a, out=print), [mode, "--quick", "--no-progress", "--results-dir",
                                                           str(root), NAME, "_fake_slow"])
        assert rc == 1 and "Traceback" not in out, (mode, out)
        assert f"{folder / 'manifest.json'}: its {named}" in out, (mode, out)
        assert ("== _fake_slow (quick): reproduced" if mode == "--verify" else "_fake_slow: 0 figure") in out, out


GARBAGE = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True), st.text(max_size=4),
                    st.lists(st.one_of(st.integers(), st.text(max_size=2), st.none()), max_size=2),
                    st.dictionaries(st.text(max_size=3), st.one_of(st.integers(), st.text(max_size=2)), max_size=2))


@FUZZ
@given(path=st.sampled_from(["verified", "verified.tables", "verified.cells", "verified.code_hash", "code_hash",
                             "cells", "cells.0", "cells.0.wall_s", "cells.0.key", "cells.0.n_rows", "versions",
                             "versions.torch", "lock", "lock.drift", "lock.drift.torch", "git", "git.commit",
                             "complete", "figures", "figures_ref", "experiment", "n_cells", "seed", "scale"]),
       value=GARBAGE, mode=st.sampled_from(["--verify", "--render"]))
def test_fuzzed_manifest_fields(fake, tmp_path_factory, path, value, mode):
    """Any value at any field a reader uses: an exit status and a message, never a traceback."""
    root = tmp_path_factory.mktemp("fz")
    folder = _committed(root)
    man = json.loads((folder / "manifest.json").read_text())
    man.setdefault("verified", {"tables": {}, "cells": []})
    man.setdefault("lock", {}).setdefault("drift", {"torch": {"lock": "1", "installed": "2"}})
    *parents, last = path.split(".")
    node = man
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    node[int(last) if isinstance(node, list) else last] = value
    (folder / "manifest.json").write_text(json.dumps(man))
    rc, out = _call(lambda a: cli.main(a, out=print), [mode, "--quick", "--no-progress", "--results-dir", str(root),
                                                       NAME])
    assert rc in (0, 1, 2) and "Traceback" not in out, (path, value, mode, out)


# ---- interrupted --verify ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_during_verify_removes_its_temporary_cache(fake, tmp_path, sig):
    root = tmp_path / "res"
    _committed(root)
    tmp, counter = tmp_path / "tmp", tmp_path / "counter.txt"
    tmp.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp / f"{TMP_PREFIX}{dead.pid}-left").mkdir()  # left by a --verify killed with SIGKILL
    counter.write_text("")
    env = dict(os.environ, ATTNLIP_EXPERIMENTS_PATH=str(fake), ATTNLIP_TEST_SLEEP="60", TMPDIR=str(tmp),
               ATTNLIP_TEST_COUNTER=str(counter), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.Popen([sys.executable, str(REPO / "run_all.py"), "--verify", "--quick", "--no-progress",
                          "--results-dir", str(root), NAME], cwd=REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    try:
        t0 = time.monotonic()
        while not counter.read_text() and p.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.1)  # until a cell runs (sleeping 60 s) in the temporary cache
        assert p.poll() is None and list(tmp.glob(TMP_PREFIX + "*"))
        p.send_signal(sig)
        out, _ = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 128 + sig and "Traceback" not in out, out
    assert f"--verify interrupted ({sig.name}); its temporary cache was removed" in out
    assert list(tmp.glob(TMP_PREFIX + "*")) == []  # its own, and the one a killed run left


def test_ctrl_c_in_process_removes_the_temporary_cache(fake, tmp_path, monkeypatch):
    root = tmp_path / "res"
    _committed(root)
    made = []

    def interrupted(specs, cfg, desc=""):
        made.append(Path(cfg.cache_dir).parent)
        raise KeyboardInterrupt

    monkeypatch.setattr(V, "execute", interrupted)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    try:
        rc, out = _verify(root)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C reached the caller as a traceback")
    assert rc == 130 and "--verify interrupted" in out and "Traceback" not in out, out
    assert made and not made[0].exists() and made[0].parent == tmp_path


def test_a_missing_experiments_path_entry_is_one_line(tmp_path):
    env = dict(os.environ, ATTNLIP_EXPERIMENTS_PATH=str(tmp_path / "absent.py"), PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, str(REPO / "run_all.py"), "--list", "castin_gamma"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"ATTNLIP_EXPERIMENTS_PATH entry {tmp_path / 'absent.py'} does not exist" in p.stderr


def test_verify_with_nothing_committed_cannot_pass(fake, tmp_path, capsys):
    """A mistyped --results-dir holds no committed table: nothing was verified, which is not a pass (exit 3)."""
    rc, out = _verify(tmp_path / "empty")
    assert rc == 3 and "nothing was verified" in out, out


def test_a_full_disk_while_render_writes_the_readme_is_one_line(fake, tmp_path, monkeypatch):
    from harness import report

    root = tmp_path / "res"
    _committed(root)

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(report, "write_readme", full)
    rc, out = _call(lambda a: cli.main(a, out=print), ["--render", "--quick", "--no-progress", "--results-dir",
                                                       str(root), NAME])
    assert rc == 1 and "Traceback" not in out and "README.md failed (OSError: No space left on device)" in out, out
