"""`pip install .` into a fresh virtual environment gives `import attnlip`, and the README's `import attnlip`
snippet runs through the installed package (not this checkout). Offline: the new environment sees this one's
libraries through a .pth file and builds with its setuptools (--no-build-isolation --no-index --no-deps)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

CHECK = r'''
import re, sys
from pathlib import Path
import attnlip

here, venv = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve()
for mod in ("attnlip", "harness", "experiments"):
    f = Path(__import__(mod).__file__).resolve()
    assert f.is_relative_to(venv), f"{mod} is not the installed package: {f}"
text = (here / "README.md").read_text()
section = text.split("## `import attnlip`", 1)[1]
code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
assert "import attnlip" in code
exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
print("README snippet ran through", Path(attnlip.__file__).parent)
'''


@pytest.mark.slow
def test_pip_install_gives_import_attnlip_and_the_readme_runs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("attnlip", "harness", "experiments"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    purelib = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    libraries = sysconfig.get_paths()["purelib"]  # this environment's torch, transformers, setuptools, pip
    Path(purelib, "zz_libraries.pth").write_text(f"import site; site.addsitedir({libraries!r})\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ATTNLIP_EXPERIMENTS_PATH")}
    done = subprocess.run([str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q",
                           str(src)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    installed = sorted(p.name for p in Path(purelib).iterdir() if not p.name.endswith((".pth", ".dist-info")))
    assert {"attnlip", "harness", "experiments"} <= set(installed), installed
    run = subprocess.run([str(py), "-c", CHECK, str(ROOT), str(venv)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.search(r"README snippet ran through .*site-packages/attnlip", run.stdout), run.stdout
