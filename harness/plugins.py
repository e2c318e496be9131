"""Loading plug-in code by name ('package.module:function'): the one dynamic import of the harness.

Kept apart from harness.bounds.registry so that the code hash (harness.store.codehash) does not see a dynamic import
in every closure that reaches the registry (which would widen those hashes to all of harness/): this module is
neither hashed nor walked there, and what it loads is keyed by its own source instead (harness.run.plan.
plugin_sources hashes the file of every plug-in a cell evaluates, from --bound and from the `plugins` grid key).

Modules are found as `python -m` finds them: on sys.path, and in the current working directory, which the
`attnlip` and `run_all.py` entry points do not put on sys.path themselves. The working directory is searched
only when the installed packages do not have the module, so a local folder never shadows an installed package.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Callable


def _import(mod: str):
    try:
        return importlib.import_module(mod)
    except ModuleNotFoundError as e:
        top = mod.split(".", 1)[0]
        cwd = os.getcwd()
        if e.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)  # as `python -m` would have it, after the installed packages
        importlib.invalidate_caches()
        try:
            return importlib.import_module(mod)
        except ModuleNotFoundError as e2:
            if e2.name == top:
                sys.path.remove(cwd)
                raise ModuleNotFoundError(f"No module named {top!r} on sys.path or in the working directory "
                                          f"{cwd}", name=top) from None
            raise


def load_function(spec_: str) -> Callable:
    """'package.module:function' -> the function (the `--bound` option's syntax)."""
    mod, sep, attr = spec_.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"expected 'module:function', got {spec_!r}")
    obj = _import(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
