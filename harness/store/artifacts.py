"""Artifacts shared across cells and experiments (trained models): tensors and plain data only.

An artifact is `{"format", "kind", "cfg" (its key data), "meta", "obj"}` written with torch.save and read back with
`torch.load(weights_only=True)`: tensors, dicts, lists, tuples, str, int, float, bool and None load; anything
else (a class, a function, a planted `__reduce__`) is refused by torch's restricted unpickler, never executed.
The sidecar `.json` holds the sha256 of the file (detects truncation, not forgery; safety comes from the loader).
A refused, truncated or mismatched file is reported once, removed and rebuilt.

The key (file name) is the sha256 of `key_data` plus, with `code=[modules]`, the code hash of those modules'
import closure (store.codehash.modules_hash) and the numeric library versions: editing the code that builds an
artifact builds a new one; no hand-bumped version strings.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from .atomic import atomic_write_bytes, atomic_write_text, canonical_json, sha256
from .cells import CorruptCell, FORMAT


def default_cache_dir() -> Path:
    """$ATTNLIP_CACHE, else <repo>/results/cache."""
    from .codehash import REPO_ROOT

    env = os.environ.get("ATTNLIP_CACHE")
    return Path(env) if env else REPO_ROOT / "results" / "cache"


def _root(root) -> Path:
    if root is None:
        return default_cache_dir() / "artifacts"
    if hasattr(root, "artifacts"):  # a registry.Context
        return Path(root.artifacts)
    return Path(root)


def full_key(key_data: Mapping[str, Any], code: Optional[Sequence] = None) -> dict:
    """key_data plus the code hash of `code` modules and the library versions (what the key covers)."""
    out = dict(key_data)
    if code:
        from .codehash import modules_hash
        from .keys import library_versions

        out["__code__"] = modules_hash(list(code))
        out["__versions__"] = library_versions()
    return json.loads(canonical_json(out))


def artifact_path(kind: str, key_data: Mapping[str, Any], root=None, code: Optional[Sequence] = None,
                  suffix: str = ".pt") -> Path:
    """<root>/<kind>/<sha256(full key_data)[:20]>.pt (root: a folder, a registry.Context, or None for the default)."""
    if not kind or "/" in kind or kind.startswith("."):
        raise ValueError(f"artifact kind must be a plain non-empty name, got {kind!r}")
    return _root(root) / kind / f"{sha256(canonical_json(full_key(key_data, code)))[:20]}{suffix}"


def save_artifact(kind: str, key_data: Mapping[str, Any], obj: Any, root=None, meta: Optional[dict] = None,
                  code: Optional[Sequence] = None) -> Path:
    """Write {obj, key_data, meta} atomically; obj must be tensors and plain data (checked by loading it back)."""
    import torch

    path = artifact_path(kind, key_data, root, code)
    blob = {"format": FORMAT, "kind": kind, "cfg": full_key(key_data, code), "meta": dict(meta or {}), "obj": obj}
    buf = io.BytesIO()
    torch.save(blob, buf)
    data = buf.getvalue()
    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - refuse to store what could not be loaded safely
        raise TypeError(f"artifact {kind!r}: only tensors and plain data (dict/list/str/int/float/bool/None) can "
                        f"be stored safely; got something else ({e.__class__.__name__}: {str(e)[:200]})") from None
    atomic_write_bytes(path, data)
    atomic_write_text(path.with_suffix(".json"), canonical_json(
        {"kind": kind, "cfg": blob["cfg"], "meta": blob["meta"], "sha256": sha256(data)}))
    return path


def _remove(path: Path) -> None:
    for p in (path, path.with_suffix(".json")):
        with contextlib.suppress(OSError):
            p.unlink()


def load_artifact(kind: str, key_data: Mapping[str, Any], root=None, map_location="cpu", with_meta: bool = False,
                  code: Optional[Sequence] = None):
    """The saved obj for (kind, key_data), or None if absent. A damaged, mismatched or unsafe file (one that would
    need code to load) is never executed: it is reported (warning naming the cause), removed, and None returned
    so the caller rebuilds it."""
    import torch

    path = artifact_path(kind, key_data, root, code)
    if not path.is_file():
        return None
    want = full_key(key_data, code)
    try:
        data = path.read_bytes()
        try:
            side = json.loads(path.with_suffix(".json").read_text())
        except (OSError, ValueError):
            raise CorruptCell("its .json sidecar is missing or damaged") from None
        if side.get("sha256") != sha256(data):
            raise CorruptCell("checksum mismatch (truncated or edited)")
        try:
            blob = torch.load(io.BytesIO(data), map_location=map_location, weights_only=True)
        except Exception as e:  # noqa: BLE001 - torch's restricted unpickler refused it
            raise CorruptCell(f"refused by the safe loader (it would need code to load: "
                              f"{e.__class__.__name__}: {str(e).splitlines()[0][:200]})") from None
        if not isinstance(blob, dict) or blob.get("cfg") != want or blob.get("kind") != kind:
            raise CorruptCell("key data / kind mismatch")
    except CorruptCell as e:
        warnings.warn(f"artifact {path} unusable: {e}; removing it so it is rebuilt")
        _remove(path)
        return None
    return (blob["obj"], blob["meta"]) if with_meta else blob["obj"]


@contextlib.contextmanager
def locked(path: Path):
    """An exclusive lock (flock) on `<path>.lock`: parallel workers or runners build one artifact once."""
    import fcntl

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def cached_artifact(kind: str, key_data: Mapping[str, Any], build: Callable[[], Any], root=None, meta=None,
                    map_location="cpu", code: Optional[Sequence] = None):
    """load_artifact, else build() and save it; a file lock keeps parallel workers/runners from building twice.

    meta may be a callable (obj -> dict) evaluated after build()."""
    path = artifact_path(kind, key_data, root, code)
    with locked(path):
        obj = load_artifact(kind, key_data, root, map_location=map_location, code=code)
        if obj is None:
            obj = build()
            m = meta(obj) if callable(meta) else meta
            save_artifact(kind, key_data, obj, root, meta=m, code=code)
    return obj
