"""requirements.lock: the exact environment `make install` builds, its hash for the manifests, and drift checks.

The lock pins every package of the project's environment with `==` (pip freeze of a venv built from
pyproject.toml's ranges; the editable attnlip itself is left out). `make install` installs it with
`pip install --no-deps -r requirements.lock`: exactly these versions, nothing resolved on top (torchattacks and
rxnfp declare requirements the project never imports: torchvision, old scipy/scikit-learn pins). pyproject.toml
keeps its ranges for library users.

No hashes: pip's --require-hashes is all-or-nothing, and torch's CPU wheel (torch==2.13.0+cpu) comes from a local
wheel folder (pip's find-links) here and from PyTorch's own index elsewhere, not from PyPI, so one hash list
would not match every place the lock is installed. The pins are exact; the file's sha256 names the environment in
every manifest.

`python -m harness.lockfile --write` regenerates the lock from the running venv after checking that it satisfies
pyproject.toml; `--check` compares the venv with the lock (exit 1 on any difference). `make lock` runs --write."""
from __future__ import annotations

import argparse
import hashlib
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from .store.codehash import REPO_ROOT

LOCK = REPO_ROOT / "requirements.lock"
# Libraries whose version changes the numbers (or the loading of models and data): drift in these is warned about.
KEY_PACKAGES = ("torch", "transformers", "numpy", "scipy", "datasets", "tokenizers", "safetensors",
                "huggingface-hub", "scikit-learn", "pandas")
HEADER = """# Exact environment of AttnLip: `make install` installs it with `pip install --no-deps -r requirements.lock`.
# Regenerate with `make lock` (pip freeze of the venv, checked against pyproject.toml's ranges; see
# harness/lockfile.py). torch's +cpu wheel comes from pip's find-links here; elsewhere add
# --extra-index-url https://download.pytorch.org/whl/cpu. No hashes: see harness/lockfile.py.
"""


def norm(name: str) -> str:
    """PEP 503 normalized package name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Optional[Path] = None) -> Dict[str, str]:
    """{normalized name: pinned version} of a lock file; ValueError naming the line for anything but name==version."""
    path = Path(path or LOCK)
    out: Dict[str, str] = {}
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if not m:
            raise ValueError(f"{path}:{i}: expected 'name==version', got {line!r}")
        out[norm(m.group(1))] = m.group(2)
    return out


def lock_sha256(path: Optional[Path] = None) -> Optional[str]:
    try:
        return hashlib.sha256(Path(path or LOCK).read_bytes()).hexdigest()
    except OSError:
        return None


def installed(names: Sequence[str]) -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {}
    for n in names:
        try:
            out[norm(n)] = metadata.version(n)
        except metadata.PackageNotFoundError:
            out[norm(n)] = None
    return out


def drift(path: Optional[Path] = None,
          packages: Sequence[str] = KEY_PACKAGES) -> List[Tuple[str, str, Optional[str]]]:
    """(package, locked, installed) for each key package whose installed version differs from the lock."""
    locked = read_lock(path)
    have = installed([p for p in packages if norm(p) in locked])
    return [(p, locked[p], v) for p, v in have.items() if v != locked[p]]


def drift_warning(path: Optional[Path] = None) -> str:
    """A warning naming every key package that differs from the lock ('' when none, or when there is no lock)."""
    path = Path(path or LOCK)
    if not path.is_file():
        return ""
    try:
        bad = drift(path)
    except (OSError, ValueError) as e:
        return f"warning: cannot read {path}: {e}"
    if not bad:
        return ""
    items = ", ".join(f"{p} {v or 'not installed'} (lock {want})" for p, want, v in bad)
    return (f"warning: installed versions differ from {Path(path).name}: {items}. Cell keys include the torch, "
            f"transformers, numpy and scipy versions, so cells made with the locked versions (the committed "
            f"results) are recomputed rather than reused, and their numbers may differ. `make install` installs "
            f"the lock.")


def freeze(python: str = sys.executable) -> List[str]:
    """`pip freeze --all` of the venv, without editable installs (attnlip itself) and without wheel."""
    txt = subprocess.run([python, "-m", "pip", "freeze", "--all", "--exclude-editable"], check=True,
                         capture_output=True, text=True).stdout
    keep = []
    for line in txt.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "-e ")) or "==" not in line or norm(line.split("==")[0]) == "wheel":
            continue
        keep.append(line)
    return sorted(keep, key=lambda x: norm(x.split("==")[0]))


def unmet(lines: Sequence[str], pyproject: Path = REPO_ROOT / "pyproject.toml") -> List[str]:
    """pyproject.toml requirements (dependencies and the dev extra) the frozen versions do not satisfy."""
    import tomllib

    from packaging.requirements import Requirement

    proj = tomllib.loads(pyproject.read_text())["project"]
    reqs = list(proj.get("dependencies", [])) + list(proj.get("optional-dependencies", {}).get("dev", []))
    pins = {norm(x.split("==")[0]): x.split("==")[1] for x in lines}
    bad = []
    for r in map(Requirement, reqs):
        v = pins.get(norm(r.name))
        if v is None or not r.specifier.contains(v, prereleases=True):
            bad.append(f"{r} (frozen: {v or 'absent'})")
    return bad


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.lockfile", description=__doc__.split("\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help="regenerate the lock from this venv (pip freeze)")
    g.add_argument("--check", action="store_true", help="compare this venv with the lock; exit 1 on a difference")
    ap.add_argument("--lock", type=Path, default=None, help="default: requirements.lock at the repository root")
    args = ap.parse_args(argv)
    args.lock = args.lock or LOCK
    lines = freeze()
    if args.write:
        bad = unmet(lines)
        if bad:
            print("lockfile: the venv does not satisfy pyproject.toml, so it is not locked: " + "; ".join(bad)
                  + ". Fix: reinstall the venv from pyproject.toml, then run `make lock` again", file=sys.stderr)
            return 1
        args.lock.write_text(HEADER + "\n".join(lines) + "\n")
        print(f"wrote {args.lock} ({len(lines)} packages, sha256 {lock_sha256(args.lock)[:12]})")
        return 0
    try:
        locked = read_lock(args.lock)
    except (OSError, ValueError) as e:
        print(f"lockfile: cannot read {args.lock}: {e}", file=sys.stderr)
        return 1
    have = {norm(x.split("==")[0]): x.split("==")[1] for x in lines}
    diffs = [f"{n}: lock {locked.get(n, 'absent')}, installed {have.get(n, 'absent')}"
             for n in sorted(set(locked) | set(have)) if locked.get(n) != have.get(n)]
    if diffs:
        print(f"lockfile: this venv differs from {args.lock.name}:\n  " + "\n  ".join(diffs), file=sys.stderr)
        return 1
    print(f"lockfile: this venv matches {args.lock.name} ({len(locked)} packages)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
