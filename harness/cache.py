"""Content-addressed cell cache and artifact store (benchopt-style, keyed on code too).

Cell key = sha256 of the canonical JSON of {experiment, cell (order-independent), seed, dtype, scale,
device kind, code hash}. The code hash covers the experiment's module file (or its `VERSION` string when
set, so cosmetic edits keep the cache), the core harness files (`CORE`) and every module of `harness/` and
`experiments/` (private helpers such as experiments/_common.py) that the experiment imports, transitively
(static `ast` closure, function-level imports included); if anything in that closure imports dynamically,
all of `harness/**/*.py` and experiments/_*.py are hashed instead. Presentation-only modules
(`PRESENTATION`: cli, plotting, report, manifest) never change numbers and are left out.

A cell file is JSON holding the rows plus a sha256 checksum of its own canonical content; it is written to a
temporary file in the same directory and `os.replace`d, so readers never see a partial file. Failed cells
are never written. `load_cell` raises `CorruptCell` for a truncated/edited/mismatched file.

Artifacts (trained models, shared across cells/experiments): `artifact_path(kind, cfg)`,
`save_artifact(kind, cfg, obj)`, `load_artifact(kind, cfg)`, `cached_artifact(kind, cfg, build)`.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import socket
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

FORMAT = 1
HARNESS_ROOT = Path(__file__).resolve().parent
REPO_ROOT = HARNESS_ROOT.parent
# Modules that only format, plot or dispatch: editing them never changes a cell's numbers.
PRESENTATION = {"cli.py", "plotting.py", "report.py", "manifest.py"}
TMP_MARK = ".tmp."


class CorruptCell(Exception):
    """A cache file that cannot be trusted (truncated, edited, wrong key/format)."""


# ----------------------------------------------------------------------------------------- canonical JSON
def _jsonable(o: Any) -> Any:
    """Fallback for json.dumps: numpy/torch scalars and small arrays (via .tolist()), Paths, sets."""
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if isinstance(o, (set, frozenset)):
        return sorted(o)
    raise TypeError(f"not JSON-serializable: {type(o).__name__} {o!r}"[:200])


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no whitespace, NaN/inf allowed (round-trips through json.loads)."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_jsonable, allow_nan=True)


def sha256(text: Union[str, bytes]) -> str:
    return hashlib.sha256(text.encode() if isinstance(text, str) else text).hexdigest()


# ----------------------------------------------------------------------------------------- code hash
CORE = ("registry.py", "runner.py", "cache.py", "grid.py")  # always hashed: they shape keys and rows


def harness_files() -> List[Path]:
    """All harness sources whose edits may change numbers (harness/**/*.py but presentation modules)."""
    files = sorted(HARNESS_ROOT.rglob("*.py"))
    return [f for f in files if not (f.parent == HARNESS_ROOT and f.name in PRESENTATION)]


def experiment_files(exp) -> List[Path]:
    """The experiment's own module file (empty list if it has none, e.g. defined interactively)."""
    mod_file = Path(getattr(exp.module, "__file__", "") or "")
    return [mod_file.resolve()] if mod_file.is_file() else []


def experiments_root() -> Path:
    import experiments

    return Path(experiments.__file__).resolve().parent


def _module_file(mod: str, roots: Mapping[str, Path]) -> Optional[Path]:
    top, *rest = mod.split(".")
    if top not in roots:
        return None
    base = Path(roots[top]).joinpath(*rest)
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _module_name(path: Path, roots: Mapping[str, Path]) -> Optional[str]:
    for top, root in roots.items():
        root = Path(root).resolve()
        if path.resolve().is_relative_to(root):
            rel = path.resolve().relative_to(root).with_suffix("")
            parts = [top, *rel.parts]
            return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return None


def import_closure(start: Iterable[Path], roots: Mapping[str, Path], leaves: Iterable[Path] = ()) -> Optional[List[Path]]:
    """Files of every module under `roots` ({top package: dir}) imported, transitively, by the `start` files.

    Static (ast): module-level and function-level imports, relative imports, `from pkg import submodule`,
    and parent packages' __init__.py. Returns None when a file in the closure imports dynamically
    (importlib.import_module / __import__), so the caller falls back to hashing everything.
    """
    import ast

    todo = [Path(f).resolve() for f in start]
    leaves = {Path(f).resolve() for f in leaves}
    seen: Dict[Path, None] = {}
    while todo:
        f = todo.pop()
        if f in seen or not f.is_file():
            continue
        seen[f] = None
        if f in leaves:  # included, not walked (the harness core loads experiments dynamically by design)
            continue
        tree = ast.parse(f.read_text(), filename=str(f))
        me = _module_name(f, roots) or ""
        is_pkg = f.name == "__init__.py"
        mods: List[str] = []
        for node in ast.walk(tree):
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
                    return None
        for m in mods:
            parts = m.split(".")
            for i in range(1, len(parts) + 1):  # parent packages run their __init__ on import
                mf = _module_file(".".join(parts[:i]), roots)
                if mf is not None and mf.resolve() not in seen:
                    todo.append(mf.resolve())
    return sorted(seen)


_FILE_HASH: Dict[Path, tuple] = {}


def _file_digest(path: Path) -> str:
    st = path.stat()
    sig = (st.st_mtime_ns, st.st_size)
    hit = _FILE_HASH.get(path)
    if hit and hit[0] == sig:
        return hit[1]
    d = sha256(path.read_bytes())
    _FILE_HASH[path] = (sig, d)
    return d


def files_hash(files: Iterable[Path], root: Optional[Path] = None) -> str:
    """sha256 over (relative name, content digest) of the files, order-independent."""
    parts = []
    for f in files:
        f = Path(f).resolve()
        name = str(f.relative_to(root)) if root and f.is_relative_to(root) else f.name
        parts.append((name, _file_digest(f)))
    return sha256(canonical_json(sorted(parts)))


def code_deps(exp) -> List[Path]:
    """Files besides the experiment module its numbers can depend on: harness CORE plus the static import
    closure of the module within harness/ and experiments/ (private helpers like experiments/_common.py).
    If anything in the closure imports dynamically: all of harness/ and every experiments/_*.py."""
    roots = {"harness": HARNESS_ROOT, "experiments": experiments_root()}
    core = [(HARNESS_ROOT / c).resolve() for c in CORE]
    own = experiment_files(exp)
    closure = import_closure(own, roots, leaves=core)
    if closure is None:
        deps = set(harness_files()) | set(experiments_root().glob("_*.py"))
        deps = {p.resolve() for p in deps}
    else:
        deps = set(closure) | {p for p in core if p.is_file()}
    deps -= set(own)
    deps = {p for p in deps if not (p.parent == HARNESS_ROOT.resolve() and p.name in PRESENTATION)}
    deps.discard((experiments_root() / "__init__.py").resolve())
    return sorted(deps)


def code_hash(exp) -> str:
    """Code part of a cell key: the experiment module (or its VERSION) + the files it imports (code_deps)."""
    files = experiment_files(exp)
    version = getattr(exp, "VERSION", None)
    if version:
        exp_part = {"version": str(version), "class": type(exp).__qualname__}
    else:
        exp_part = {"module": files_hash(files, REPO_ROOT)}
    return sha256(canonical_json({"experiment": exp_part, "deps": files_hash(code_deps(exp), REPO_ROOT)}))


def device_kind(device: str) -> str:
    """'cuda:1' -> 'cuda': results depend on the kind of device, not on which one."""
    return str(device).split(":")[0]


def cell_key(experiment: str, cell: Mapping[str, Any], seed: int, dtype: str, scale: str, device: str,
             code: str) -> str:
    """sha256 of the canonical JSON of everything a cell's rows depend on."""
    return sha256(canonical_json({
        "experiment": experiment, "cell": dict(cell), "seed": int(seed), "dtype": str(dtype),
        "scale": str(scale), "device": device_kind(device), "code": code, "format": FORMAT,
    }))


# ----------------------------------------------------------------------------------------- atomic files
def atomic_write_bytes(path: Union[str, Path], data: bytes) -> Path:
    """Write `data` to `path` via a same-directory temp file + fsync + os.replace (never a partial file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}{TMP_MARK}{socket.gethostname()}.{os.getpid()}.")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: Union[str, Path], text: str) -> Path:
    return atomic_write_bytes(path, text.encode())


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean_stale_tmp(root: Union[str, Path]) -> List[Path]:
    """Remove temp files left under `root` by killed writers on this host (their pid is gone)."""
    root = Path(root)
    removed = []
    if not root.exists():
        return removed
    host = socket.gethostname()
    for f in root.rglob(f".*{TMP_MARK}*"):
        tail = f.name.split(TMP_MARK, 1)[1]  # host.pid.random
        try:
            h, pid = tail.rsplit(".", 2)[0], int(tail.rsplit(".", 2)[1])
        except (IndexError, ValueError):
            continue
        if h == host and not _pid_alive(pid):
            with contextlib.suppress(OSError):
                f.unlink()
                removed.append(f)
    return removed


# ----------------------------------------------------------------------------------------- cell files
class CellCache:
    """Cell files under `<root>/cells/<experiment>/<key>.json`."""

    def __init__(self, root: Union[str, Path]):
        self.root = Path(root)

    def path(self, experiment: str, key: str) -> Path:
        return self.root / "cells" / experiment / f"{key}.json"

    def exists(self, experiment: str, key: str) -> bool:
        return self.path(experiment, key).is_file()

    def save(self, record: Dict[str, Any]) -> Path:
        """Write a cell record {experiment, key, cell, rows, meta, ...} atomically with its checksum."""
        body = {k: v for k, v in record.items() if k != "checksum"}
        body["format"] = FORMAT
        body["checksum"] = sha256(canonical_json(body))
        return atomic_write_text(self.path(record["experiment"], record["key"]), canonical_json(body))

    def load(self, experiment: str, key: str) -> Dict[str, Any]:
        """The record of a cached cell; FileNotFoundError if absent, CorruptCell if it cannot be trusted."""
        return load_cell(self.path(experiment, key), key)

    def keys(self, experiment: str) -> List[str]:
        d = self.root / "cells" / experiment
        return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []

    def remove(self, experiment: str, key: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path(experiment, key).unlink()


def load_cell(path: Union[str, Path], key: Optional[str] = None) -> Dict[str, Any]:
    """Read and verify a cell file: parse, format, key and checksum (CorruptCell on any mismatch)."""
    path = Path(path)
    raw = path.read_bytes()  # FileNotFoundError propagates
    try:
        rec = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptCell(f"{path}: not valid JSON ({e.__class__.__name__}: {e}); truncated write?") from None
    if not isinstance(rec, dict) or rec.get("format") != FORMAT:
        raise CorruptCell(f"{path}: unknown format {rec.get('format') if isinstance(rec, dict) else type(rec)}")
    want = rec.get("checksum")
    body = {k: v for k, v in rec.items() if k != "checksum"}
    if want != sha256(canonical_json(body)):
        raise CorruptCell(f"{path}: checksum mismatch (file edited or damaged)")
    if key is not None and rec.get("key") != key:
        raise CorruptCell(f"{path}: holds key {rec.get('key')!r}, expected {key!r}")
    if not isinstance(rec.get("rows"), list):
        raise CorruptCell(f"{path}: no rows list")
    return rec


# ----------------------------------------------------------------------------------------- artifacts
def default_cache_dir() -> Path:
    """$ATTNLIP_CACHE, else <repo>/results/cache."""
    env = os.environ.get("ATTNLIP_CACHE")
    return Path(env) if env else REPO_ROOT / "results" / "cache"


def _artifact_root(root) -> Path:
    if root is None:
        return default_cache_dir() / "artifacts"
    if hasattr(root, "artifacts"):  # a registry.Context
        return Path(root.artifacts)
    return Path(root)


def artifact_path(kind: str, cfg: Mapping[str, Any], root=None, suffix: str = ".pt") -> Path:
    """Where the artifact of `kind` built from `cfg` lives: <root>/<kind>/<sha256(cfg)[:20]>.pt.

    root: a directory, a registry.Context (uses ctx.artifacts) or None ($ATTNLIP_CACHE or results/cache)/artifacts.
    Put everything the artifact depends on (and a version string) into cfg.
    """
    if not kind or "/" in kind or kind.startswith("."):
        raise ValueError(f"artifact kind must be a plain non-empty name, got {kind!r}")
    return _artifact_root(root) / kind / f"{sha256(canonical_json(dict(cfg)))[:20]}{suffix}"


def save_artifact(kind: str, cfg: Mapping[str, Any], obj: Any, root=None, meta: Optional[dict] = None) -> Path:
    """torch.save {obj, cfg, meta} atomically (temp file + os.replace) to artifact_path(kind, cfg); returns the path."""
    import io

    import torch

    path = artifact_path(kind, cfg, root)
    buf = io.BytesIO()
    torch.save({"format": FORMAT, "kind": kind, "cfg": dict(cfg), "meta": dict(meta or {}), "obj": obj}, buf)
    data = buf.getvalue()
    atomic_write_bytes(path, data)
    atomic_write_text(path.with_suffix(".json"), canonical_json(
        {"kind": kind, "cfg": dict(cfg), "meta": dict(meta or {}), "sha256": sha256(data)}))
    return path


def load_artifact(kind: str, cfg: Mapping[str, Any], root=None, map_location="cpu", with_meta: bool = False):
    """The saved obj for (kind, cfg), or None if absent; a damaged/mismatched file is removed and None returned."""
    import warnings

    import torch

    path = artifact_path(kind, cfg, root)
    if not path.is_file():
        return None
    try:
        side = json.loads(path.with_suffix(".json").read_text())
        if side.get("sha256") != sha256(path.read_bytes()):
            raise CorruptCell("checksum mismatch")
        blob = torch.load(path, map_location=map_location, weights_only=False)
        if blob.get("cfg") != json.loads(canonical_json(dict(cfg))) or blob.get("kind") != kind:
            raise CorruptCell("cfg/kind mismatch")
    except Exception as e:  # noqa: BLE001 - any damage means rebuild
        warnings.warn(f"artifact {path} unusable ({e}); removing it so it is rebuilt")
        for p in (path, path.with_suffix(".json")):
            with contextlib.suppress(OSError):
                p.unlink()
        return None
    return (blob["obj"], blob["meta"]) if with_meta else blob["obj"]


@contextlib.contextmanager
def _locked(path: Path):
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_artifact(kind: str, cfg: Mapping[str, Any], build: Callable[[], Any], root=None, meta=None,
                    map_location="cpu"):
    """load_artifact, else build() and save it; a file lock keeps parallel workers from building it twice."""
    path = artifact_path(kind, cfg, root)
    with _locked(path):
        obj = load_artifact(kind, cfg, root, map_location=map_location)
        if obj is None:
            obj = build()
            save_artifact(kind, cfg, obj, root, meta=meta)
    return obj
