"""Cell files: `<root>/cells/<experiment>/<key>.json`, JSON with a checksum of their own canonical content.

A checksum proves a file unchanged, not sensible: a crafted file can carry a valid one. So a cell is also checked
for structure before its rows are used (`record_problem`: tidy rows, the parameters of the cell it is filed under)
and against the other cells of its experiment (`column_conflicts`: text where the others hold numbers). A cell that
fails is corrupt: named, removed and recomputed, never rendered."""
from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, TypedDict, Union

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
    why = meta_problem(rec.get("meta", {}))
    if why:
        raise CorruptCell(f"{path}: {why}")
    return rec


# What the worker records of each computed cell (harness.run.worker), and the type each value must have: manifests
# sum the times and take the largest memory, so a crafted string or NaN there would break or poison them.
_META_TYPES = {"wall_s": float, "peak_rss_mb": float, "threads": int, "pid": int, "computed_at": str}


def meta_problem(meta: Any) -> Optional[str]:
    """Why `meta` is not worker metadata, or None: a dict of plain JSON values whose known fields have their type
    (times and memory finite non-negative numbers, thread count and pid integers, the timestamp a string)."""
    if not isinstance(meta, dict) or not _plain(meta):
        return f"its worker metadata is a {type(meta).__name__}, not a dict of plain values"
    for k, want in _META_TYPES.items():
        v = meta.get(k)
        if v is None:
            continue
        if want is float:
            ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v >= 0
        else:
            ok = isinstance(v, want) and not isinstance(v, bool)
        if not ok:
            return f"its worker metadata {k!r} is {v!r}, not a {'finite non-negative number' if want is float else want.__name__}"
    return None


def _plain(v: Any) -> bool:
    """A JSON scalar, or a list / dict of them (a list of eps values, a per-head dict)."""
    if v is None or isinstance(v, (str, int, float, bool)):
        return True
    if isinstance(v, list):
        return all(_plain(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _plain(x) for k, x in v.items())
    return False


def rows_problem(rows: Any) -> Optional[str]:
    """Why `rows` are not tidy rows, or None: a non-empty list of dicts with string keys and plain JSON values."""
    if not isinstance(rows, list):
        return f"rows are a {type(rows).__name__}, not a list"
    if not rows:
        return "no rows (every cell yields at least one)"
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            return f"row {i} is a {type(r).__name__}, not a dict"
        if not r:
            return f"row {i} has no columns"
        for k, v in r.items():
            if not isinstance(k, str) or not _plain(v):
                return f"row {i}: {k!r} holds a {type(v).__name__}"
    return None


def record_problem(rec: Dict[str, Any], cell: Dict[str, Any]) -> Optional[str]:
    """Why a checksummed record cannot be the result of `cell`, or None: its parameters differ from the cell's (the
    key is derived from them, so they can differ only in a crafted file), or its rows are not tidy rows."""
    if canonical_json(rec.get("cell")) != canonical_json(json.loads(canonical_json(cell))):
        return f"its parameters {rec.get('cell')!r} are not those of the cell it is filed under ({cell!r})"
    return rows_problem(rec.get("rows"))


def _kind(v: Any) -> Optional[str]:
    if v is None:
        return None  # a missing value may sit beside anything (null_conflicts checks it against the table)
    if isinstance(v, bool):
        return "flag"
    if isinstance(v, (int, float)):
        return "number"
    return "text" if isinstance(v, str) else "container"


def column_conflicts(records: Sequence[Dict[str, Any]]) -> Dict[int, str]:
    """index -> why, for the records (of one experiment) whose values in a column of numbers are of another kind
    (text, a flag, a list/dict) than most records', or numbers where most hold another kind: a string where a
    number belongs, or the reverse. Columns without numbers are left alone (a parameter may be "auto" in one cell
    and false in another)."""
    kinds: Dict[str, Dict[int, frozenset]] = {}
    for i, rec in enumerate(records):
        per: Dict[str, set] = {}
        for r in rec.get("rows") or ():
            if isinstance(r, dict):
                for k, v in r.items():
                    kind = _kind(v)
                    if kind:
                        per.setdefault(k, set()).add(kind)
        for k, ks in per.items():
            kinds.setdefault(k, {})[i] = frozenset(ks)
    out: Dict[int, str] = {}
    rows_of = [[r for r in rec.get("rows") or () if isinstance(r, dict)] for rec in records]
    for i, rows in enumerate(rows_of):  # a column every row of every other cell has, missing from a row here
        others = [set(r) for j, rs in enumerate(rows_of) if j != i for r in rs]
        usual = set.intersection(*others) if others else set()
        lacking = sorted(k for r in rows for k in usual - set(r))
        if lacking:
            out[i] = f"a row lacks column {lacking[0]!r}, which every row of the other cells has"
    for col, per in kinds.items():
        seen = {k for ks in per.values() for k in ks}
        if len(seen) < 2 or "number" not in seen:
            continue
        counts: Dict[frozenset, int] = {}
        for ks in per.values():
            counts[ks] = counts.get(ks, 0) + 1
        usual = max(counts, key=lambda ks: (counts[ks], ks == frozenset({"number"})))
        for i, ks in per.items():
            if ks != usual:
                out.setdefault(i, f"column {col!r} holds {'/'.join(sorted(ks))} where the other cells hold "
                                  f"{'/'.join(sorted(usual))}")
    return out


def null_conflicts(records: Sequence[Dict[str, Any]], always_set: Sequence[str]) -> Dict[int, str]:
    """index -> why, for the records with no value (None, NaN) in a column that the experiment's committed table
    fills in every row (`always_set`): a number removed from a file that still carries a valid checksum. A code
    change that makes such a value legitimately empty costs one recomputation, until its table is written."""
    cols = set(always_set)
    out: Dict[int, str] = {}
    for i, rec in enumerate(records):
        for r in rec.get("rows") or ():
            if not isinstance(r, dict):
                continue
            empty = [k for k in cols & set(r) if r[k] is None or (isinstance(r[k], float) and r[k] != r[k])]
            if empty:
                out[i] = f"column {empty[0]!r} is empty where the committed table never is"
                break
    return out


def remove_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        Path(path).unlink()
