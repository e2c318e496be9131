"""The repository's layout: modules import only down the layers and never in a cycle, docs/architecture.md names
every module, no source file grows past its cap, and experiments/ is family packages of short modules."""
from __future__ import annotations

import ast
import re
from pathlib import Path

from harness import catalog
from harness.run import discovery
from harness.store import codehash

REPO = Path(__file__).resolve().parent.parent


LAYERS = [  # (prefix, level): a module may import only from its own level or below
    ("harness.errors", 0), ("harness.config", 0), ("harness.grid", 0), ("harness.store", 0),
    ("harness.plotting", 0),  # matplotlib helpers on tables: presentation code at any level may use them
    ("harness.kernels", 1), ("harness.bounds", 2), ("harness.data", 3), ("harness.models", 3),
    ("harness.catalog", 3.5),  # the declaration API experiments build on (Experiment, Context, @experiment)
    ("harness.analyze", 4), ("harness.certify", 4), ("experiments", 4), ("harness.manifest", 5), ("harness.report", 5),
    ("harness.run", 6), ("harness.cli", 7), ("harness.entry", 8), ("harness", 0),
]
ALLOWED = {("harness.data", "harness.data")}  # discovery of experiments is harness.run.discovery: no exception
FORBIDDEN = {("harness.data", "harness.models")}  # same level, but data never depends on models


def _level(mod: str) -> tuple:
    for prefix, lvl in LAYERS:
        if mod == prefix or mod.startswith(prefix + "."):
            return prefix, lvl
    return mod, None


def _sources():
    for root in ("harness", "experiments"):
        for f in sorted((REPO / root).rglob("*.py")):
            yield f, ".".join(f.relative_to(REPO).with_suffix("").parts).replace(".__init__", "")


def test_imports_only_go_down_the_layers():
    bad = []
    for f, me in _sources():
        pkg = me if f.name == "__init__.py" else me.rsplit(".", 1)[0]
        mods, _ = codehash.imported_modules([ast.parse(f.read_text())], me, f.name == "__init__.py")
        del pkg
        src_prefix, src_lvl = _level(me)
        for m in set(mods):
            if not (m.startswith("harness") or m.startswith("experiments")):
                continue
            dst_prefix, dst_lvl = _level(m)
            if dst_lvl is None or src_lvl is None or (src_prefix, dst_prefix) in ALLOWED:
                continue
            if dst_lvl > src_lvl or (src_prefix, dst_prefix) in FORBIDDEN:
                bad.append(f"{me} -> {m}")
    assert not bad, "imports that run up the layers:\n" + "\n".join(sorted(set(bad)))


CYCLE_ROOTS = ("harness", "experiments")
CYCLE_ALLOWED: set = set()  # none: the registry (harness.catalog) imports no experiment


def _import_graph(roots=CYCLE_ROOTS) -> dict:
    """{module: set of modules it imports} over the source files under `roots`, imports anywhere in a file
    (function-level ones too) resolved to the module they name: `from p import x` is p.x when p.x is a module,
    else p; a name outside `roots` is dropped. Edges in CYCLE_ALLOWED (by prefix) are left out."""
    files = {".".join(f.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__"): f
             for root in roots for f in sorted((REPO / root).rglob("*.py"))}

    known = lambda name: name if not name or name in files else known(name.rpartition(".")[0])  # "" if outside
    graph = {}
    for me, f in files.items():
        pkg = me.split(".") if f.name == "__init__.py" else me.split(".")[:-1]
        names = []
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(pkg[: len(pkg) - node.level + 1] + ([node.module] if node.module else []))
                names += [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
        graph[me] = {m for m in map(known, names) if m and m != me and not any(
            me.startswith(a) and m.startswith(b) for a, b in CYCLE_ALLOWED)}
    return graph


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    index, low, stack, out = {}, {}, [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check can fail
    graph = _import_graph()
    assert {"harness.analyze.state", "harness.analyze.modern"} <= graph["harness.analyze.core"]  # siblings found
    cycles = _cycles(graph)
    assert not cycles, "import cycles (modules that import each other, directly or through others):\n" + \
        "\n".join(" <-> ".join(c) for c in cycles)


def test_architecture_doc_names_every_module():
    """docs/architecture.md's module list names every module of harness/ (backticked file names, globs allowed)
    and every module of experiments/ by its path there (`castin/common.py`, `castin/figures/*.py`)."""
    import fnmatch

    named = set(re.findall(r"`([\w*/]+\.py)`", (REPO / "docs" / "architecture.md").read_text()))
    files = [(f, f.name) for f in (REPO / "harness").rglob("*.py") if f.name != "__init__.py"]
    files += [(f, str(f.relative_to(REPO / "experiments"))) for f in (REPO / "experiments").rglob("*.py")
              if f.name != "__init__.py"]
    missing = sorted(str(f.relative_to(REPO)) for f, n in files if not any(fnmatch.fnmatch(n, p) for p in named))
    assert not missing, "modules missing from docs/architecture.md (one line each):\n" + "\n".join(missing)


def test_no_source_file_over_400_lines():
    """The product's modules, the tests and the benchmarks alike."""
    big = [f"{f.relative_to(REPO)}: {n}" for f, _ in _sources()
           if (n := len(f.read_text().splitlines())) > 400]
    big += [f"{f.relative_to(REPO)}: {n}" for folder in ("tests", "benchmarks")
            for f in sorted((REPO / folder).glob("*.py")) if (n := len(f.read_text().splitlines())) > 400]
    assert not big, big


def test_experiments_are_families_of_short_modules():
    """experiments/ holds family packages of modules under 300 lines, with no '_'-prefixed shard."""
    files = [f for f in (REPO / "experiments").rglob("*.py") if f.name != "__init__.py"]
    shards = [str(f.relative_to(REPO)) for f in files if f.name.startswith("_")]
    long = [f"{f.relative_to(REPO)}: {n}" for f in files if (n := len(f.read_text().splitlines())) > 300]
    flat = [str(f.relative_to(REPO)) for f in files if f.parent == REPO / "experiments"]
    assert not shards and not long and not flat, (shards, long, flat)
    assert set(discovery.experiment_modules()) >= {"experiments.castin.sqrt_n", "experiments.lofast.text"}
    assert not [m for m in discovery.experiment_modules() if ".figures" in m]


