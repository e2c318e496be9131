"""Cell files: `<root>/cells/<experiment>/<key>.json`, JSON with a checksum of their own canonical content."""
from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Dict, List, Optional, TypedDict, Union

from ..errors import CorruptFile
from .atomic import atomic_write_text, canonical_json, sha256

FORMAT = 2


class _RecordHead(TypedDict):
    experiment: str
    key: str
    cell: Dict[str, Any]
    rows: List[Dict[str, Any]]  # tidy rows, as run() returned them


class CellRecord(_RecordHead, total=False):
    """A cell file's content: the cell, its rows, what they were computed in and the worker's metadata."""

    seed: int
    dtype: str
    scale: str
    device: str
    model_source: Optional[str]
    data_source: Optional[str]
    meta: Dict[str, Any]  # wall_s, peak_rss_mb, threads, pid, computed_at
    format: int  # written by save()
    checksum: str  # sha256 of the canonical JSON of the rest, written by save()


class CorruptCell(CorruptFile):
    """A cache file that cannot be trusted (truncated, edited, mismatched key/format, unreadable)."""


class CellCache:
    """Cell files under `<root>/cells/<experiment>/<key>.json`."""

    def __init__(self, root: Union[str, Path]):
        self.root = Path(root)

    def path(self, experiment: str, key: str) -> Path:
        return self.root / "cells" / experiment / f"{key}.json"

    def exists(self, experiment: str, key: str) -> bool:
        return self.path(experiment, key).is_file()

    def save(self, record: CellRecord) -> Path:
        """Write a cell record {experiment, key, cell, rows, meta, ...} atomically with its checksum."""
        body = {k: v for k, v in record.items() if k != "checksum"}
        body["format"] = FORMAT
        body["checksum"] = sha256(canonical_json(body))
        return atomic_write_text(self.path(record["experiment"], record["key"]), canonical_json(body))

    def load(self, experiment: str, key: str) -> CellRecord:
        """The record of a cached cell; FileNotFoundError if absent, CorruptCell if it cannot be trusted."""
        return load_cell(self.path(experiment, key), key)

    def keys(self, experiment: str) -> List[str]:
        d = self.root / "cells" / experiment
        return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []

    def remove(self, experiment: str, key: str) -> bool:
        """Delete a cell file; False when it cannot be removed (read-only cache): the caller then recomputes
        without caching instead of crashing."""
        try:
            self.path(experiment, key).unlink()
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True


def load_cell(path: Union[str, Path], key: Optional[str] = None) -> CellRecord:
    """Read and verify a cell file: parse, format, key and checksum (CorruptCell on any mismatch)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise
    except OSError as e:  # unreadable (permissions, I/O error): untrusted, reported with the real cause
        raise CorruptCell(f"{path}: cannot be read ({e.__class__.__name__}: {e})") from None
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


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        Path(path).unlink()
