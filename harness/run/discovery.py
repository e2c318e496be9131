"""Experiment discovery: import every module of the `experiments` package (and the files or folders named by
$ATTNLIP_EXPERIMENTS_PATH) so their experiments register in harness.catalog; then list or get them. It lives beside
the runner, above the experiments it imports: the catalog below is the registry they import, and imports none of
them. A module that fails to import is recorded (import_errors) and warned, never fatal for the others."""
from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List

from .. import catalog as _catalog
from ..catalog import Experiment

_LOADED = False
_IMPORT_ERRORS: Dict[str, str] = {}


def load_module_file(path) -> Any:
    """Import a Python file as a module (named after its stem, prefixed) so its experiments register.

    Re-executes it when the file content changed since the last load (its experiments re-register)."""
    import hashlib

    path = Path(path).resolve()
    modname = f"_attnlip_ext_{path.stem}"
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    mod = sys.modules.get(modname)
    if mod is not None and Path(getattr(mod, "__file__", "")).resolve() == path and \
            getattr(mod, "__attnlip_digest__", None) == digest:
        return mod
    spec = importlib.util.spec_from_file_location(modname, path)
    if spec is None or spec.loader is None:
        raise ValueError(f"cannot import experiment module file {path}")
    mod = importlib.util.module_from_spec(spec)
    mod.__attnlip_digest__ = digest
    sys.modules[modname] = mod
    try:
        spec.loader.exec_module(mod)
    except BaseException:
        sys.modules.pop(modname, None)
        raise
    return mod


def _extra_paths() -> List[Path]:
    out: List[Path] = []
    for part in filter(None, os.environ.get("ATTNLIP_EXPERIMENTS_PATH", "").split(os.pathsep)):
        p = Path(part)
        if p.is_dir():
            out += sorted(f for f in p.glob("*.py") if not f.name.startswith("_"))
        elif p.is_file():
            out.append(p)
        else:
            raise ValueError(f"ATTNLIP_EXPERIMENTS_PATH entry {p} does not exist: name experiment module files or "
                             f"folders of them (separated by {os.pathsep!r}), or unset it")
    return out


def experiment_modules() -> List[str]:
    """The modules of the `experiments` package that may declare experiments: every module of every family
    package (experiments/<family>/*.py) and the package's own top-level modules, except `figures` packages
    (presentation: they read result tables only) and names starting with '_'."""
    import experiments

    out = []
    for m in pkgutil.walk_packages(experiments.__path__, "experiments."):
        parts = m.name.split(".")[1:]
        if m.ispkg or "figures" in parts or any(p.startswith("_") for p in parts):
            continue
        out.append(m.name)
    return sorted(out)


def load_all() -> None:
    """Import every module of the `experiments` package (and $ATTNLIP_EXPERIMENTS_PATH) so experiments register."""
    global _LOADED
    if _LOADED:
        return
    for name in experiment_modules():
        _guarded(name, lambda: importlib.import_module(name))
    for f in _extra_paths():
        _guarded(str(f), lambda: load_module_file(f))
    _LOADED = True


def _guarded(what: str, load: Callable[[], Any]) -> None:
    """Import one experiment module; a broken one is recorded (import_errors()) and warned, not fatal."""
    import traceback
    import warnings

    try:
        load()
    except Exception as e:  # noqa: BLE001 - one broken module must not hide the others
        _IMPORT_ERRORS[what] = "".join(traceback.format_exception(e))
        warnings.warn(f"experiment module {what} failed to import: {e.__class__.__name__}: {e}")


def import_errors() -> Dict[str, str]:
    """{module: traceback} of experiment modules that failed to import in load_all()."""
    load_all()
    return dict(_IMPORT_ERRORS)


def list_experiments(pattern: str = "*") -> List[str]:
    """Names of the experiments matching a glob pattern, sorted, after importing every experiment module."""
    load_all()
    return _catalog.list_experiments(pattern)


def get_experiment(name: str) -> Experiment:
    """The experiment `name` (importing the experiment modules when it is not registered yet); a KeyError naming
    close names otherwise."""
    if name not in _catalog._REGISTRY:
        load_all()
    return _catalog.get_experiment(name)
