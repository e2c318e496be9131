"""`run_all.py --verify --stamp`: record in a reproduced experiment's manifest that this checkout's code reproduces
its committed numbers.

The stamp is the manifest's `verified` entry: the commit that verified, the compute hash of the experiment at that
commit, when, on what machine, which cells were recomputed, the tolerances they met, and the sha256 of each
committed copy of the table (a later edit of a copy then differs). Nothing else in the manifest changes: its cell
keys and code hash still say what originally computed the numbers; the stamp says what reproduces them now.

The commit must name exactly the code that ran (`clean_commit`, before anything is computed and again before the
first stamp is written): the project's folder is the top level of its own git checkout (not a copy inside another
repository), no tracked file outside results/ differs from HEAD, HEAD is the commit the run started from, and no code
that commit does not hold can load (`foreign_code`)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Sequence

from .. import manifest as _manifest
from ..store.atomic import sha256
from ..store.codehash import REPO_ROOT
from .outputs import write_manifest

CODE_ROOTS = ("harness", "experiments")  # the packages the runner and its workers import from the checkout
CODE_VARIABLES = ("ATTNLIP_EXPERIMENTS_PATH", "PYTHONPATH")  # variables that add modules to those of the checkout


def foreign_code(root: Path = REPO_ROOT) -> List[str]:
    """What could run that the checkout's commit does not hold: untracked files (git-ignored ones too) that Python
    imports - a module, package, compiled extension or nested repository under harness/ or experiments/, or at the
    top of the project (run_all.py's folder is on sys.path: such a file shadows any module of its name) - a set
    ATTNLIP_EXPERIMENTS_PATH (experiment modules from elsewhere) or a PYTHONPATH entry other than the project - and
    tracked files git was told not to compare (skip-worktree, assume-unchanged), whose edits git status hides."""
    import importlib.machinery

    suffixes = tuple(importlib.machinery.all_suffixes())
    root = Path(root).resolve()
    listed = subprocess.run(["git", "ls-files", "--others", "-z", "--", *CODE_ROOTS], cwd=root, capture_output=True,
                            text=True, timeout=20).stdout.split("\0")
    found = [f for f in listed if (f.endswith(suffixes) or f.endswith("/")) and "__pycache__" not in Path(f).parts]
    flags = subprocess.run(["git", "ls-files", "-v", "-z", "--", ".", ":(exclude)results"], cwd=root,
                           capture_output=True, text=True, timeout=20).stdout.split("\0")
    found += [f"{e[2:]} (skip-worktree or assume-unchanged: git does not compare it with the commit)"
              for e in flags if len(e) > 2 and (e[0] == "S" or e[0].islower())]
    tracked = {f.split("/")[0] for f in subprocess.run(["git", "ls-files", "-z"], cwd=root, capture_output=True,
                                                       text=True, timeout=20).stdout.split("\0") if f}
    for p in sorted(root.iterdir()):
        name = p.name.split(".")[0]
        if p.name in tracked or not name.isidentifier():
            continue
        if (p.is_file() and p.name.endswith(suffixes)) or any((p / f"__init__{s}").is_file() for s in suffixes):
            found.append(p.name)
    if os.environ.get("ATTNLIP_EXPERIMENTS_PATH"):
        found.append(f"ATTNLIP_EXPERIMENTS_PATH={os.environ['ATTNLIP_EXPERIMENTS_PATH']}")
    extra = [e for e in os.environ.get("PYTHONPATH", "").split(os.pathsep) if e and Path(e).resolve() != root]
    found += [f"PYTHONPATH entry {e}" for e in extra]
    return found


def clean_commit() -> str:
    """The checkout's commit, or ValueError (one line) when the code that runs is not exactly that commit: not the
    project's own git checkout (or git missing), tracked files outside results/ changed, or code outside the
    commit that could load (foreign_code)."""
    info = _manifest.git_info()
    if not info.get("commit"):
        raise ValueError(f"--stamp records the commit that verified, and {REPO_ROOT} is not the top level of a git "
                         "checkout of the project (or git is missing): run --verify without --stamp")
    if info.get("dirty"):
        raise ValueError("--stamp records the commit that verified, but tracked files outside results/ differ from "
                         f"commit {info['commit'][:12]}: commit or stash them first (git status), so that the stamp "
                         "names the code that ran")
    try:
        foreign = foreign_code()
    except (OSError, subprocess.SubprocessError) as e:
        raise ValueError(f"--stamp cannot list the checkout's untracked files ({e.__class__.__name__}: {e})") from None
    if foreign:
        more = f" and {len(foreign) - 6} more" if len(foreign) > 6 else ""
        raise ValueError(f"--stamp records the commit that verified, but code that commit does not hold could run: "
                         f"{', '.join(foreign[:6])}{more}: commit or remove the files and unset the variables "
                         f"({', '.join(CODE_VARIABLES)}), so that the stamp names the code that ran")
    return str(info["commit"])


def stamp(folder: Path, r: Any, commit: str) -> Dict[str, Any]:
    """Write the `verified` entry of folder/manifest.json for the verdict `r` (harness.run.verify.ExpVerify),
    replacing the file atomically (an OSError leaves the old manifest as it was)."""
    from . import discovery as _discovery

    path = folder / "manifest.json"
    man = _manifest.read(path) if path.is_file() else {}
    exp = _discovery.get_experiment(r.name)
    tables = {f.name: sha256(f.read_bytes()) for f in sorted(folder.glob("table.*")) if f.is_file()}
    man["verified"] = {
        "commit": commit, "code_hash": r.code, "at": _manifest.now_utc(), "scale": r.scale,
        "command": "run_all.py --verify --stamp", "result": r.status,
        "cells": list(r.verified), "n_committed_cells": r.n_committed,
        "tolerance": dict(exp.verify_tol or {"default": 1e-9}),
        "max_abs_diff": {c.column: c.max_abs for c in r.columns if c.max_abs},
        "device": r.device, "device_name": _manifest.device_name(r.device), "versions": _manifest.versions(),
        "tables": tables,
    }
    write_manifest(path, man)
    return man["verified"]


def stamp_all(done: Sequence[Any], root: Path, commit: str, echo=print) -> int:
    """Stamp the manifests of the reproduced verdicts `done` under the results folder `root` and rewrite the READMEs
    that show them; the exit status: 0, 2 when the checkout is no longer the commit the run started from (HEAD
    moved, files changed: nothing stamped), 1 when a write failed (disk full: one line; the manifest being written
    keeps its old content)."""
    from .. import report as _report
    from ..errors import CorruptFile
    from .plan import RunConfig

    if not done:
        echo("stamped nothing: no experiment reproduced")
        return 0
    try:
        now = clean_commit()
        if now != commit:
            raise ValueError(f"HEAD moved from {commit[:12]} to {now[:12]} while --verify ran, so the stamp would not "
                             "name the code that ran: nothing stamped; verify again")
    except ValueError as e:
        print(f"run_all.py: error: {e}", file=sys.stderr)
        return 2
    where, n = root, 0
    try:
        for r in done:
            where = RunConfig(scale=r.scale, results_dir=root).output_root / r.name
            stamp(where, r, commit)
            n += 1
        for scale in sorted({r.scale for r in done}):  # the READMEs show each stamp
            where = RunConfig(scale=scale, results_dir=root).output_root
            _report.write_readme(where, canonical=root if where == RunConfig(scale="full", results_dir=root)
                                 .output_root else None)
    except (OSError, CorruptFile) as e:
        why = os.strerror(e.errno) if isinstance(e, OSError) and e.errno else str(e)
        print(f"run_all.py: error: writing the verification stamp under {where} failed ({why}); {n} of {len(done)} "
              "manifest(s) stamped, the others as they were", file=sys.stderr)
        return 1
    echo(f"stamped {n} manifest(s) with commit {commit[:12]}")
    return 0
