"""A new experiment is one file: the module that docs/architecture.md gives as the recipe, written into a copy of
the package (nothing else edited), is listed, planned at every scale including the paper's, selected by the
paper scale's default selection and the tests' catalog-derived lists, and computes at test scale."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = r'''
import json, sys
from pathlib import Path
from harness import catalog, cli

name = sys.argv[1]
lines = []
out = {"list_rc": cli.main(["--list", "--results-dir", "res"], out=lines.append)}
out["listed"] = any(line.split()[:1] == [name] for line in lines)
lines.clear()
out["paper_rc"] = cli.main(["--dry-run", "--scale", "paper", "--results-dir", "res"], out=lines.append)
out["paper_selected"] = any(line.startswith(f"{name} (paper): ") for line in lines)
out["range_rc"] = cli.main([name, "--set", "n=1", "--dry-run", "--results-dir", "res"], out=lines.append)
out["run_rc"] = cli.main([name, "--scale", "test", "--results-dir", "res", "--no-progress"], out=lines.append)
folder = Path("res") / "test" / name
out["table"] = (folder / "table.csv").is_file()
out["figures"] = sorted(p.name for p in (folder / "figures").glob("*.png")) if (folder / "figures").is_dir() \
    else sorted(p.name for p in folder.glob("*.png"))
from tests import test_paper_scale, test_castin_experiments
out["paper_exps"] = name in test_paper_scale.paper_exps()
out["castin_list"] = name in test_castin_experiments.CASTIN
print(json.dumps(out))
'''


def recipe() -> tuple:
    """(path inside the repository, source) of the recipe module in docs/architecture.md."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text.split("## A new experiment: one file", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    first, _, rest = code.partition("\n")
    assert first.startswith("# experiments/"), first
    return first[2:].strip(), rest


def test_recipe_experiment_needs_no_other_file(tmp_path):
    rel, source = recipe()
    for d in ("harness", "experiments", "tests"):
        shutil.copytree(ROOT / d, tmp_path / d, ignore=shutil.ignore_patterns("__pycache__", "test_golden"))
    assert not (tmp_path / rel).exists()
    (tmp_path / rel).write_text(source)
    name = re.search(r'name = "([a-z0-9_]+)"', source).group(1)
    env = {k: v for k, v in __import__("os").environ.items() if k not in ("ATTNLIP_EXPERIMENTS_PATH", "PYTHONPATH")}
    done = subprocess.run([sys.executable, "-c", SCRIPT, name], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["list_rc"] == 0 and got["listed"], got
    assert got["paper_rc"] == 0 and got["paper_selected"] and got["paper_exps"], got
    assert got["range_rc"] == 2, got  # its own declared range refuses n=1 before any cell
    assert got["run_rc"] == 0 and got["table"] and got["figures"], got
    assert not got["castin_list"]  # a jasmin module: only its own family's list holds it
