"""What a cell's numbers depend on, as a hash of source code.

An experiment's code hash = (1) the *compute part* of its module: the AST (comments, docstrings and formatting
ignored) of the experiment class without its presentation methods and declarative attributes (as the class
declares them: harness.catalog.Experiment.PRESENTATION / DECLARATIONS; cell parameters are in the key
themselves), plus every module-level
definition the compute part reaches by name, transitively; and (2) the files of every module under harness/ and
experiments/ that the compute part imports, transitively (static `ast` closure), plus harness.boundary.ALWAYS.
Modules that harness.boundary declares infrastructure (runner, worker, store, CLI, thread policy, plotting, ...)
are neither hashed nor walked: editing them keeps every key. So editing `run()` or anything it calls invalidates
the cells, and editing the runner, a figure or the summary text does not. A dynamic import anywhere in the closure
hashes every compute module instead (never less than what ran).

`modules_hash(modules)` gives the same kind of hash for the closure of arbitrary modules (trained-model
artifacts are keyed with it).
"""
from __future__ import annotations

import ast
import inspect
import textwrap
from pathlib import Path
from types import ModuleType
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from ..boundary import ALWAYS, is_infrastructure
from .atomic import canonical_json, sha256

HARNESS_ROOT = Path(__file__).resolve().parents[1]
REPO_ROOT = HARNESS_ROOT.parent
PRESENTATION_METHODS = frozenset({"figures", "summary"})  # the default of classes that declare none


def _roots() -> Dict[str, Path]:
    roots = {"harness": HARNESS_ROOT}
    exp_root = REPO_ROOT / "experiments"
    if exp_root.is_dir():
        roots["experiments"] = exp_root
    return roots


# ----------------------------------------------------------------------------------------- import closure
def _module_file(mod: str, roots: Mapping[str, Path]) -> Optional[Path]:
    top, *rest = mod.split(".")
    if top not in roots:
        return None
    base = Path(roots[top]).joinpath(*rest)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand.resolve()
    return None


def _module_name(path: Path, roots: Mapping[str, Path]) -> Optional[str]:
    for top, root in roots.items():
        root = Path(root).resolve()
        if path.resolve().is_relative_to(root):
            rel = path.resolve().relative_to(root).with_suffix("")
            parts = [top, *rel.parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return None


def imported_modules(nodes: Iterable[ast.AST], me: str = "", is_pkg: bool = False) -> Tuple[List[str], bool]:
    """Module names imported anywhere inside `nodes` (and whether a dynamic import occurs)."""
    mods: List[str] = []
    dynamic = False
    for top in nodes:
        for node in ast.walk(top):
            if isinstance(node, ast.Import):
                mods += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    pkg = me.split(".") if is_pkg else me.split(".")[:-1]
                    pkg = pkg[: len(pkg) - (node.level - 1)] if node.level > 1 else pkg
                    base = ".".join(pkg + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                mods.append(base)
                mods += [f"{base}.{a.name}" for a in node.names]  # maybe submodules
            elif isinstance(node, ast.Call):
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else fn.id if isinstance(fn, ast.Name) else ""
                if name in ("import_module", "__import__"):
                    dynamic = True
    return mods, dynamic


def module_closure(start: Iterable[str], roots: Optional[Mapping[str, Path]] = None,
                   skip: Callable[[str], bool] = is_infrastructure) -> Optional[List[Path]]:
    """Files of the modules under `roots` that the `start` module names import, transitively (parents'
    __init__.py included; modules for which `skip` is true, by default the declared infrastructure, neither hashed
    nor walked). None when a dynamic import occurs."""
    roots = dict(roots or _roots())
    seen: Dict[Path, None] = {}
    looked: Set[str] = set()  # names already resolved in this walk (most modules import the same few)
    todo = list(start)
    while todo:
        m = todo.pop()
        parts = m.split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            if name in looked:
                continue
            looked.add(name)
            if skip(name):
                continue
            f = _module_file(name, roots)
            if f is None or f in seen:
                continue
            seen[f] = None
            mods, dynamic = _file_imports(f, _module_name(f, roots) or "")
            if dynamic:
                return None
            todo += mods
    return sorted(seen)


_IMPORTS: Dict[Tuple[Path, str], Tuple[Tuple[int, int], List[str], bool]] = {}


def _file_imports(f: Path, me: str) -> Tuple[List[str], bool]:
    """imported_modules of one file, parsed once per process while its size and mtime stay the same (planning
    every experiment walks the same modules again and again)."""
    st = f.stat()
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _IMPORTS.get((f, me))
    if hit is not None and hit[0] == stamp:
        return list(hit[1]), hit[2]
    tree = ast.parse(f.read_text(), filename=str(f))
    mods, dynamic = imported_modules([tree], me, f.name == "__init__.py")
    _IMPORTS[(f, me)] = (stamp, mods, dynamic)
    return list(mods), dynamic


def files_hash(files: Iterable[Path], root: Path = REPO_ROOT) -> str:
    """sha256 over (relative name, content digest) of the files, order-independent."""
    parts = []
    for f in files:
        f = Path(f).resolve()
        name = str(f.relative_to(root)) if f.is_relative_to(root) else f.name
        parts.append((name, sha256(f.read_bytes())))
    return sha256(canonical_json(sorted(parts)))


def compute_files() -> List[Path]:
    """Every compute module's file (harness/ and experiments/ minus the declared infrastructure): what a code hash
    covers when a dynamic import makes the static closure unknowable."""
    roots = _roots()
    files = sorted(HARNESS_ROOT.rglob("*.py")) + sorted((REPO_ROOT / "experiments").rglob("*.py"))
    return [f.resolve() for f in files if not is_infrastructure(_module_name(f, roots) or "")]


def closure_hash(start: Sequence[str]) -> Tuple[str, List[Path]]:
    """Hash of the compute files the modules `start` (and harness.boundary.ALWAYS) import, every compute file on a
    dynamic import, and those files."""
    files = module_closure(list(start) + list(ALWAYS))
    if files is None:
        files = compute_files()
    return files_hash(files), files


def modules_hash(modules: Sequence) -> str:
    """Code hash of modules (objects or names) and their closure: key artifacts built by that code."""
    names = [m.__name__ if isinstance(m, ModuleType) else getattr(m, "__module__", None) or str(m)
             for m in modules]
    return closure_hash(names)[0]


def repo_module_hash(name: str) -> Optional[str]:
    """Closure hash of a module of this repository (harness.*, experiments.*) by dotted name; None when the name is
    not a module file here (then the caller keys it some other way, e.g. by the sha256 of its source)."""
    if name.split(".")[0] not in ("harness", "experiments") or _module_file(name, _roots()) is None:
        return None
    return closure_hash([name])[0]


# ----------------------------------------------------------------------------------------- compute part
def _strip_docstring(body: List[ast.stmt]) -> List[ast.stmt]:
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[1:]
    return body


def _clean(node: ast.AST) -> ast.AST:
    """Docstrings removed everywhere (they never change numbers)."""
    for n in ast.walk(node):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            n.body = _strip_docstring(n.body) or [ast.Pass()]
    return node


def _names(node: ast.AST) -> Tuple[Set[str], Set[str]]:
    """(bare names read, attribute names read on `self`) inside node."""
    names, attrs = set(), set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            names.add(n.id)
        elif isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
            attrs.add(n.attr)
    return names, attrs


def _defines(stmt: ast.stmt) -> Set[str]:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {stmt.name}
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in stmt.names}
    out: Set[str] = set()
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [getattr(stmt, "target", None)]
    for t in targets:
        if t is not None:
            out |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return out


def compute_part(source: str, class_name: str, declared: Iterable[str] = (),
                 presentation: Iterable[str] = PRESENTATION_METHODS) -> Tuple[List[ast.AST], bool]:
    """The AST nodes of a module that compute an experiment's cells, and whether they read `ctx.scale`; `declared`
    and `presentation` name the class members that are not compute (Experiment.DECLARATIONS / PRESENTATION)."""
    presentation = frozenset(presentation)
    tree = ast.parse(textwrap.dedent(source))
    top = tree.body
    cls = next((s for s in top if isinstance(s, ast.ClassDef) and s.name == class_name), None)
    if cls is None:  # not found statically: the whole module counts
        return [_clean(tree)], True
    members = {}
    for s in cls.body:
        for name in _defines(s):
            members[name] = s
    entry = [n for n in ("run", "compute", "model_source") if n in members]
    todo = entry or [n for n in members if n not in presentation | frozenset(declared)]
    keep_members: Dict[str, ast.stmt] = {}
    names: Set[str] = set()
    while todo:
        n = todo.pop()
        if n in keep_members or n not in members:
            continue
        keep_members[n] = members[n]
        nm, at = _names(members[n])
        names |= nm
        todo += [a for a in at | nm if a in members and a not in presentation]
    defs: Dict[str, ast.stmt] = {}
    for s in top:
        if s is cls:
            continue
        for name in _defines(s):
            defs.setdefault(name, s)
    keep_top: Dict[int, ast.stmt] = {}
    todo = list(names) + [n for b in cls.bases for n in _names(b)[0]]  # base classes, `module.Base` included
    seen: Set[str] = set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        s = defs.get(n)
        if s is None or id(s) in keep_top:
            continue
        keep_top[id(s)] = s
        todo += list(_names(s)[0])
    ordered = [s for s in top if id(s) in keep_top]
    nodes: List[ast.AST] = [_clean(s) for s in ordered] + [_clean(keep_members[k]) for k in sorted(keep_members)]
    reads_scale = any(isinstance(n, ast.Attribute) and n.attr == "scale" for x in nodes for n in ast.walk(x))
    return nodes, reads_scale


def experiment_code(exp) -> Dict[str, object]:
    """{"hash", "files", "reads_scale"} for a registered experiment (see the module docstring)."""
    cls = type(exp)
    mod = inspect.getmodule(cls)
    mod_name = getattr(mod, "__name__", "")
    try:
        source = inspect.getsource(mod)
    except (OSError, TypeError):  # defined interactively: its class source, else its name only
        try:
            source = inspect.getsource(cls)
        except (OSError, TypeError):
            source = f"class {cls.__name__}: pass"
    nodes, reads_scale = compute_part(source, cls.__name__, getattr(cls, "DECLARATIONS", ()),
                                      getattr(cls, "PRESENTATION", PRESENTATION_METHODS))
    me = mod_name
    is_pkg = bool(mod is not None and getattr(mod, "__file__", "").endswith("__init__.py"))
    mods, dynamic = imported_modules(nodes, me, is_pkg)
    if dynamic:
        files = compute_files()
        deps_hash = files_hash(files)
    else:
        deps_hash, files = closure_hash([m for m in mods if m != me])
    own = sha256("\n".join(ast.dump(n) for n in nodes))
    return {"hash": sha256(canonical_json({"compute": own, "deps": deps_hash})), "files": files,
            "reads_scale": reads_scale}
