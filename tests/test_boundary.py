"""The compute boundary (harness.boundary): keys hash the code that computes and nothing else.

Editing the worker, the store, the claims or the thread policy keeps every cell key; editing a kernel, a bound or
one experiment's run() re-keys exactly the experiments whose compute closure holds it. The edits are made on a copy
of the package in a temporary folder, in a fresh interpreter, so this checkout is never touched."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import boundary
from harness.store import codehash

ROOT = codehash.REPO_ROOT


def _modules():
    """{dotted name: file} of every module under harness/ and experiments/."""
    roots = {"harness": ROOT / "harness", "experiments": ROOT / "experiments"}
    out = {}
    for top, root in roots.items():
        for f in sorted(root.rglob("*.py")):
            name = codehash._module_name(f, roots)
            if name:
                out[name] = f
    return out


def test_every_declared_entry_names_a_module():
    mods = _modules()
    import fnmatch

    for pat in boundary.INFRASTRUCTURE:
        assert any(fnmatch.fnmatchcase(m, pat) for m in mods), f"INFRASTRUCTURE entry {pat!r} matches no module"
    for m in list(boundary.ALWAYS) + list(boundary.IMPORTABLE):
        assert m in mods, m
    assert not any(boundary.is_infrastructure(m) for m in boundary.ALWAYS)
    assert all(boundary.is_infrastructure(m) for m in boundary.IMPORTABLE)
    # what the runner is made of is infrastructure; what produces numbers is not
    for m in ("harness.run.worker", "harness.run.executors", "harness.store.claims", "harness.store.cells",
              "harness.config", "harness.process", "harness.cli", "harness.plotting", "harness.manifest"):
        assert boundary.is_infrastructure(m), m
    for m in ("harness.kernels.krylov", "harness.bounds.lofast", "harness.models.train", "harness.data.text",
              "harness.context", "experiments.castin.common", "experiments.castin.sqrt_n"):
        assert not boundary.is_infrastructure(m), m


def _imports(f: Path, name: str):
    """Modules a compute module imports: the whole file, or for an experiment module the compute part of each
    class (its figures()/summary() may import presentation helpers: they are not hashed)."""
    source = f.read_text()
    tree = ast.parse(source)
    classes = [c.name for c in tree.body if isinstance(c, ast.ClassDef)]
    nodes = [tree] if not (name.startswith("experiments.") and classes) else \
        [n for c in classes for n in codehash.compute_part(source, c)[0]]
    mods, _ = codehash.imported_modules(nodes, name, f.name == "__init__.py")
    return mods


def test_compute_code_imports_infrastructure_only_where_declared():
    """A compute module importing infrastructure would hide that code from its key; only the declared IMPORTABLE
    modules (names, base classes, the artifact cache) may be imported."""
    mods = _modules()
    bad = []
    for name, f in mods.items():
        if boundary.is_infrastructure(name):
            continue
        for m in _imports(f, name):
            if m in mods and boundary.is_infrastructure(m) and m not in boundary.IMPORTABLE \
                    and m not in ("harness", "experiments"):
                bad.append(f"{name} imports {m}")
    assert not bad, "compute code imports undeclared infrastructure:\n" + "\n".join(bad)


SCRIPT = r'''
import json, sys
from pathlib import Path
from harness import catalog
from harness.run import discovery
from harness.store import codehash

assert Path(codehash.__file__).resolve().is_relative_to(Path.cwd().resolve()), codehash.__file__
discovery.load_all()
names = catalog.list_experiments()

def hashes():
    return {n: codehash.experiment_code(catalog.get_experiment(n))["hash"] for n in names}

def files():
    return {n: [str(p.relative_to(codehash.REPO_ROOT)) for p in
                codehash.experiment_code(catalog.get_experiment(n))["files"]] for n in names}

def edit(rel, old=None, new=None):
    p = Path(rel)
    s = p.read_text()
    if old is None:
        s += "\n\ndef _an_edit_that_computes_nothing_here():\n    return 0\n"
    else:
        assert old in s, (rel, old)
        s = s.replace(old, new, 1)
    p.write_text(s)

out = {"base": hashes(), "files": files()}
for rel in ("harness/run/worker.py", "harness/store/cells.py", "harness/store/claims.py", "harness/config.py",
            "harness/process.py", "harness/catalog.py", "harness/run/executors.py", "harness/plotting.py"):
    edit(rel)
out["infra"] = hashes()
edit("harness/kernels/softmax.py")
out["softmax"] = hashes()
edit("experiments/jasmin/softmax.py", "    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:\n",
     "    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:\n        cell = dict(cell)\n")
out["run"] = hashes()
print(json.dumps(out))
'''


@pytest.fixture(scope="module")
def edited(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("boundary")
    for d in ("harness", "experiments"):
        shutil.copytree(ROOT / d, tmp / d, ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "ATTNLIP_EXPERIMENTS_PATH"}
    env["PYTHONPATH"] = str(tmp)
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp, env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_infrastructure_edits_keep_every_key(edited):
    assert edited["base"] and edited["infra"] == edited["base"]


def test_a_kernel_edit_rekeys_exactly_its_importers(edited):
    importers = {n for n, fs in edited["files"].items() if "harness/kernels/softmax.py" in fs}
    changed = {n for n in edited["base"] if edited["softmax"][n] != edited["infra"][n]}
    assert importers and changed == importers
    assert len(importers) < len(edited["base"])  # not everything: castin's radius experiments, e.g., stay


def test_editing_one_run_rekeys_only_that_experiment(edited):
    changed = {n for n in edited["base"] if edited["run"][n] != edited["softmax"][n]}
    assert changed == {"jasmin_softmax"}
