"""Plug-in bounds given as 'package.module:function' import from the working directory, as `python -m` finds
modules, also through entry points that do not put the working directory on sys.path (the `attnlip` script)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.plugins import load_function

BOUND = '''import torch


def my_bound(X, w, causal=False):
    """A loose but sound per-head upper bound."""
    return torch.full((*X.shape[:-2], w.h), 1e6, dtype=X.dtype)
'''


def _package(root: Path, name: str) -> None:
    (root / name).mkdir(parents=True)
    (root / name / "__init__.py").write_text("")
    (root / name / "bounds.py").write_text(BOUND)


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """A working directory holding the package `mypkg_cwd`, not on sys.path (as under the `attnlip` script)."""
    work = tmp_path / "work"
    _package(work, "mypkg_cwd")
    monkeypatch.chdir(work)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(work))])
    yield work
    for m in [m for m in sys.modules if m.split(".")[0] == "mypkg_cwd"]:
        del sys.modules[m]


def test_plugin_module_is_found_in_the_working_directory(workdir):
    fn = load_function("mypkg_cwd.bounds:my_bound")
    assert fn.__name__ == "my_bound" and Path(sys.modules["mypkg_cwd"].__file__).parent == workdir / "mypkg_cwd"


def test_missing_plugin_module_names_where_it_was_looked_for(workdir):
    with pytest.raises(ModuleNotFoundError, match="working directory") as e:
        load_function("no_such_pkg_xyz.bounds:f")
    assert str(workdir) in str(e.value) and str(workdir) not in sys.path
    with pytest.raises(ModuleNotFoundError, match="mypkg_cwd.nope"):  # the package exists, its module does not
        load_function("mypkg_cwd.nope:f")


def test_installed_packages_win_over_the_working_directory(workdir):
    _package(workdir, "json")  # a local folder named like a standard module must not shadow it
    fn = load_function("json:dumps")  # loaded as a plug-in: guarded, the original reachable as __wrapped__
    assert fn.__wrapped__({"a": 1}) == '{"a": 1}' and fn.__wrapped__ is __import__("json").dumps


def test_attnlip_analyze_bound_from_the_working_directory(tmp_path):
    """The user's command: `attnlip analyze ... --bound mypkg.bounds:my_bound` with mypkg/ in the cwd."""
    work, bin_ = tmp_path / "work", tmp_path / "bin"
    _package(work, "mypkg")
    bin_.mkdir()
    launcher = bin_ / "attnlip"  # a script like the installed console script: its own folder is sys.path[0]
    launcher.write_text("import sys\nfrom harness.entry import main\nsys.exit(main())\n")
    env = dict(os.environ, OMP_NUM_THREADS="1", MPLBACKEND="Agg")
    env.pop("PYTHONPATH", None)
    r = subprocess.run([sys.executable, str(launcher), "analyze", "--model", "tiny-bert", "--text",
                        "The cat sat on the mat.", "--bound", "mypkg.bounds:my_bound", "--eps", "0", "--no-progress"],
                       cwd=work, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "my_bound" in r.stdout
