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

import functools
import importlib
import os
import sys
from typing import Callable

from harness.errors import PluginError


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
    return guarded(obj, spec_) if callable(obj) else obj


def guarded(fn: Callable, spec_: str) -> Callable:
    """`fn` as a plug-in is called: whatever it raises, and a result that cannot be bound values (text, bytes,
    nothing), becomes a PluginError naming the plug-in, so a user's bug is one line and never a traceback of
    ours. The signature and declared attributes (bound_name, scope, ...) stay those of `fn`."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        try:
            out = fn(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - the plug-in's own error, reported as its own
            raise PluginError(f"plug-in {spec_} raised {e.__class__.__name__}: {str(e)[:300]}") from e
        if out is None or isinstance(out, (str, bytes, dict, set)):
            raise PluginError(f"plug-in {spec_} returned {type(out).__name__}, not bound values (a tensor or array "
                              "of per-head or per-layer numbers)")
        return out

    return call
