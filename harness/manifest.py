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


def read(path: Path) -> Dict[str, Any]:
    """A results folder's manifest.json, checked for the shape every reader relies on (a JSON object whose `cells`
    is a list of objects with a `cell` label); CorruptFile with one line naming the file and the fix otherwise.
    A damaged committed file is a finding, never a traceback."""
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
    for k in ("experiment", "scale", "description"):
        if k in man and not isinstance(man[k], (str, type(None))):
            raise CorruptFile(f"{path}: its {k!r} is a {type(man[k]).__name__}, not text; {fix}")
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
    """Commit hash and whether tracked files outside results/ differ from it (None outside a git checkout).

    results/ is left out: a collect rewrites committed outputs there while it writes one manifest after another,
    which made every manifest after the first say "dirty" although the code was the commit's. The check covers
    root and below (the repository root by default)."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20)

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
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
