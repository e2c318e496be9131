"""`run_all.py --verify --stamp`: record in a reproduced experiment's manifest that this checkout's code reproduces
its committed numbers.

The stamp is the manifest's `verified` entry: the commit that verified (the checkout must have no uncommitted
changes outside results/, so the commit names the code that ran), the compute hash of the experiment at that
commit, when, on what machine, which cells were recomputed, the tolerances they met, and the sha256 of each
committed copy of the table (a later edit of a copy then differs). Nothing else in the manifest changes: its cell
keys and code hash still say what originally computed the numbers; the stamp says what reproduces them now."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

from .. import manifest as _manifest
from ..store.atomic import sha256
from .outputs import write_manifest


def clean_commit() -> str:
    """The checkout's commit, or ValueError when the code is not exactly a commit (uncommitted changes outside
    results/, or no git checkout)."""
    info = _manifest.git_info()
    if not info.get("commit"):
        raise ValueError("--stamp records the commit that verified, and this is not a git checkout (or git is "
                         "missing): run --verify without --stamp")
    if info.get("dirty"):
        raise ValueError("--stamp records the commit that verified, but tracked files outside results/ differ from "
                         f"commit {info['commit'][:12]}: commit or stash them first (git status), so that the stamp "
                         "names the code that ran")
    return str(info["commit"])


def stamp(folder: Path, r: Any, commit: str) -> Dict[str, Any]:
    """Write the `verified` entry of folder/manifest.json for the verdict `r` (harness.run.verify.ExpVerify)."""
    from .. import catalog as _catalog

    path = folder / "manifest.json"
    man = json.loads(path.read_text()) if path.is_file() else {}
    exp = _catalog.get_experiment(r.name)
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
