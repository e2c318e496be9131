"""The compute boundary: which code a cell's numbers depend on, declared once.

A cell's key (harness.store.keys) hashes its *compute closure*: the compute part of the experiment's module and
the modules under harness/ and experiments/ it imports, transitively (kernels, bounds, models, training, data
parsing, analysis), plus the modules in ALWAYS. Everything listed in INFRASTRUCTURE is left out of every key and
not walked: the runner, executors, worker, store and claims, CLI, manifests, progress, thread and allocator policy,
plotting and reports. An edit there cannot change a number, so it must not throw a computed cell away.

What infrastructure could change about a number is a declared key field instead: seed, dtype, device kind, the
resolved model and data sources and the content hash of the data files, the versions of the numeric libraries,
the plug-in sources (harness.store.keys).
The RNG reset before a cell and the deterministic thread blocks of training are compute code (harness.context, in
ALWAYS), although the worker is the one calling them.

Anything not listed here is compute: a new module is hashed until someone decides otherwise, so a key never covers
less than what ran. tests/test_boundary.py checks the declaration: every entry names a module that exists, compute
code imports infrastructure only through IMPORTABLE (names, base classes, the artifact cache: nothing that computes
a cell's numbers), and editing infrastructure keeps every key while editing a kernel re-keys exactly the
experiments that import it.
"""
from __future__ import annotations

import fnmatch
from typing import Dict, Tuple

FAMILIES = "castin jasmin lofast leaderboard".split()  # the packages under experiments/

# Module names (fnmatch patterns over dotted names). "pkg.*" covers a package's submodules, "pkg" its __init__.
INFRASTRUCTURE: Tuple[str, ...] = (
    "harness",                          # the package __init__ (its version string)
    "experiments",                      # the experiments package __init__
    "harness.boundary",                 # this declaration
    "harness.catalog",                 # experiment discovery and the Experiment base class (declarations)
    "harness.grid",                     # grid expansion: the cell parameters are key fields themselves
    "harness.config",                   # scales, dtype names, device resolution, the thread policy
    "harness.process",                  # allocator policy of the entry points
    "harness.network", "harness.venv_check",                  # whether downloads are attempted (resolved sources are key fields)
    "harness.errors",                   # exception classes (a failed cell is never cached)
    "harness.plugins",                  # loads plug-in bounds by name; each plug-in is keyed by its own source
    "harness.cli", "harness.entry", "harness.lockfile",
    "harness.manifest", "harness.plotting", "harness.report", "harness.progress",
    "harness.run", "harness.run.*",     # planner, executors, worker, outputs, verification, preflight
    "harness.store", "harness.store.*",  # keys, code hashes, cells, claims, artifacts, atomic writes
    "harness.analyze.cli", "harness.analyze.report",
    "harness.certify.cli", "harness.certify.report",
    "harness.data.cli",
    "harness.data.identity",            # content hashes of the data files a cell reads: a key field of their own
    "experiments.*.figures", "experiments.*.figures.*",  # presentation: figures read result tables only
    "experiments.figures", "experiments.figures.*",
    *(f"experiments.{family}" for family in FAMILIES),  # the family packages' __init__ (docstrings)
)

# Hashed into every cell's key, whatever the experiment imports.
ALWAYS: Tuple[str, ...] = ("harness.context",)

# The infrastructure that compute code may import, and why that cannot hide a dependency of a number.
IMPORTABLE: Dict[str, str] = {
    "harness.catalog": "Experiment / experiment / Substitute declarations; Context is re-exported from "
                        "harness.context (hashed)",
    "harness.errors": "exception classes",
    "harness.store.artifacts": "the trained-model cache; an artifact's own key hashes the code that builds it",
    "harness.plugins": "loading a plug-in bound by name; each plug-in is keyed by its own source",
    **{f"experiments.{family}": "the family package's __init__ (its docstring only)" for family in FAMILIES},
}


def is_infrastructure(module: str) -> bool:
    """True when the dotted module name is declared infrastructure (never part of a cell's key)."""
    return any(fnmatch.fnmatchcase(module, pat) for pat in INFRASTRUCTURE)
