"""Run provenance for results/<exp>/manifest.json: versions, git commit, device, host, peak memory."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import resource
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any, Dict, Optional

from .errors import CorruptFile
from .store.codehash import REPO_ROOT


_TEXT, _NUMBER, _WHOLE, _FLAG = "text", "a number", "a whole number", "true or false"  # as messages name them
_TYPES = {_TEXT: (str,), _NUMBER: (int, float), _WHOLE: (int,), _FLAG: (bool,)}
# The fields readers use (verify, render, the README, the runner): a dict is an object with those fields, a list
# [shape] a list of such values, a tuple (shape,) an object mapping any name to such values. Every field may be
# absent or null; other fields are not read, so not checked.
_VERIFIED = {"commit": _TEXT, "code_hash": _TEXT, "at": _TEXT, "scale": _TEXT, "result": _TEXT, "cells": [_TEXT],
             "n_committed_cells": _WHOLE, "tables": (_TEXT,), "tolerance": (_NUMBER,), "max_abs_diff": (_NUMBER,),
             "device": _TEXT, "device_name": _TEXT, "versions": (_TEXT,), "command": _TEXT}
SHAPE = {
    "experiment": _TEXT, "scale": _TEXT, "description": _TEXT, "code_hash": _TEXT, "created": _TEXT,
    "device": _TEXT, "device_name": _TEXT, "dtype": _TEXT, "seed": _WHOLE, "n_cells": _WHOLE, "n_rows": _WHOLE,
    "total_cell_wall_s": _NUMBER, "max_cell_peak_rss_mb": _NUMBER, "complete": _FLAG, "figures": [_TEXT],
    "figures_ref": [_TEXT], "versions": (_TEXT,), "git": {"commit": _TEXT, "dirty": _FLAG},
    "lock": {"file": _TEXT, "sha256": _TEXT, "drift": ({"lock": _TEXT, "installed": _TEXT},)},
    "cells": [{"cell": _TEXT, "key": _TEXT, "status": _TEXT, "n_rows": _WHOLE, "wall_s": _NUMBER,
               "threads": _WHOLE}],
    "verified": _VERIFIED,
}


def shape_error(value: Any, shape: Any = None, where: str = "") -> Optional[str]:
    """Where `value` (a manifest, by default) departs from `shape` (SHAPE): "its 'cells[2].wall_s' is text, not a
    number"; None when it does not."""
    shape = SHAPE if shape is None else shape
    if value is None and where and not where.endswith("]"):  # an absent value; a list holds values
        return None
    kind = "an object" if isinstance(shape, (dict, tuple)) else "a list" if isinstance(shape, list) else shape
    ok = (isinstance(value, dict) if isinstance(shape, (dict, tuple)) else isinstance(value, list)
          if isinstance(shape, list) else isinstance(value, _TYPES[shape]) and
          (shape == _FLAG or not isinstance(value, bool)))
    if not ok:
        return f"its {where or 'content'!r} is {_json_kind(value)}, not {kind}"
    if isinstance(shape, dict):
        items = ((f"{where}.{k}" if where else k, value[k], sub) for k, sub in shape.items() if k in value)
    elif isinstance(shape, tuple):
        items = ((f"{where}.{k}", v, shape[0]) for k, v in value.items())
    elif isinstance(shape, list):
        items = ((f"{where}[{i}]", v, shape[0]) for i, v in enumerate(value))
    else:
        return None
    return next((e for w, v, sub in items for e in [shape_error(v, sub, w)] if e), None)


def _json_kind(v: Any) -> str:
    names = {bool: "true/false", int: "a number", float: "a number", str: "text", list: "a list", dict: "an object"}
    return "null" if v is None else names.get(type(v), f"a {type(v).__name__}")


def read(path: Path) -> Dict[str, Any]:
    """A results folder's manifest.json, checked for the shape every reader relies on (SHAPE: a JSON object whose
    `cells` is a list of objects with a `cell` label, every field a reader uses of its type); CorruptFile with one
    line naming the file, the field and the fix otherwise. A damaged committed file is a finding, never a
    traceback."""
    import json

    path = Path(path)
    fix = "restore it (git checkout -- PATH) or rewrite it from the cache (python run_all.py --collect)"
    try:
        man = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise CorruptFile(f"{path}: not a readable manifest ({e.__class__.__name__}: {str(e)[:120]}); {fix}") from None
    cells = man.get("cells", []) if isinstance(man, dict) else None
    if not isinstance(man, dict) or not isinstance(cells, list) or not all(
            isinstance(c, dict) and isinstance(c.get("cell"), str) for c in cells):
        raise CorruptFile(f"{path}: not a run_all.py manifest (a JSON object with a list of cells); {fix}")
    wrong = shape_error(man)
    if wrong:
        raise CorruptFile(f"{path}: {wrong[:200]}; {fix}")
    return man


def versions() -> Dict[str, Optional[str]]:
    """Installed versions of the packages results depend on (None if absent); no heavy imports."""
    out: Dict[str, Optional[str]] = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "numpy", "scipy", "datasets", "tokenizers", "safetensors", "scikit-learn",
                "pandas", "matplotlib", "submitit", "attnlip"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def git_info(root: Path = REPO_ROOT) -> Dict[str, Any]:
    """Commit hash and whether tracked files outside results/ differ from it (None unless `root`, the project's
    folder by default, is the top level of a git checkout: a copy of the project inside another repository has no
    commit of its own, and the other repository's would name code that did not run).

    results/ is left out: a collect rewrites committed outputs there while it writes one manifest after another,
    which made every manifest after the first say "dirty" although the code was the commit's."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20)

    try:
        top, head = git("rev-parse", "--show-toplevel"), git("rev-parse", "HEAD")
        if top.returncode != 0 or head.returncode != 0 or Path(top.stdout.strip()).resolve() != Path(root).resolve():
            return {"commit": None, "dirty": None}
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
        return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


from .config import resolve_device  # noqa: E402,F401 - defined once in config


def device_name(device: str) -> str:
    """Human-readable name of the device (GPU model or CPU model)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} logical cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} logical cores)"


def peak_rss_mb() -> Dict[str, float]:
    """High-water resident memory (MiB) of this process and of its waited-for children (Linux ru_maxrss is KiB)."""
    scale = 1 / 1024 if sys.platform != "darwin" else 1 / 1024 / 1024
    return {
        "self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale,
        "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * scale,
    }


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def lock_info() -> Dict[str, Any]:
    """The lock the environment was installed from (requirements.lock, by sha256) and every key library whose
    installed version differs from it (empty when the run used exactly the locked versions)."""
    from . import lockfile as _lockfile

    path = _lockfile.LOCK
    try:
        drift = {p: {"lock": want, "installed": have} for p, want, have in _lockfile.drift(path)}
    except (OSError, ValueError):
        drift = None
    return {"file": path.name, "sha256": _lockfile.lock_sha256(path), "drift": drift}


def environment(device: str) -> Dict[str, Any]:
    """Everything about the machine/software a manifest records."""
    return {
        "versions": versions(),
        "lock": lock_info(),
        "git": git_info(),
        "device": device,
        "device_name": device_name(device),
        "platform": platform.platform(),
        "host": platform.node(),
        "numerics": numerics(),
        "argv": sys.argv,
    }


def numerics() -> Dict[str, Any]:
    """The CPU code paths torch computed with: ATen's dispatch level and the pinning variables in effect
    (config.portable_numerics)."""
    from .config import PORTABLE_ISA

    out: Dict[str, Any] = {k: os.environ.get(k) for k in PORTABLE_ISA}
    try:
        import torch

        out["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    except (ImportError, AttributeError):
        out["torch_cpu_capability"] = None
    return out
