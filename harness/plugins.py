"""Loading plug-in code by name ('package.module:function'): the one dynamic import of the harness.

Kept apart from harness.bounds.registry so that the code hash (harness.store.codehash) does not see a dynamic import
in every closure that reaches the registry (which would widen those hashes to all of harness/): this module is
neither hashed nor walked there, and what it loads is keyed by its own source instead (harness.run.plan.
plugin_sources hashes the file of every plug-in a cell evaluates, from --bound and from the `plugins` grid key).
"""
from __future__ import annotations

import importlib
from typing import Callable


def load_function(spec_: str) -> Callable:
    """'package.module:function' -> the function (the `--bound` option's syntax)."""
    mod, sep, attr = spec_.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"expected 'module:function', got {spec_!r}")
    obj = importlib.import_module(mod)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj
