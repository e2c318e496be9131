"""Why a cell is computed again: its key's fields against those the last run's manifest recorded for the same cell.

    reasons(tasks, code, manifest) -> {label: why}   for the cells that are not cached, e.g.
        "data changed: alice (sha256 ab12cd34.. -> 9f8e7d6c..)", "compute code changed", "model changed: ... -> ..."

The manifest (`<output folder>/<experiment>/manifest.json`, written by harness.run.outputs) holds per cell its key,
its data and model sources and the content hashes of its data; a cell the manifest does not name is new."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from ..store.keys import library_versions


def read_manifest(folder: Path) -> Optional[Dict[str, Any]]:
    """The manifest.json in `folder` as a dict, None when absent or unreadable (then no reason is given)."""
    try:
        man = json.loads((Path(folder) / "manifest.json").read_text())
    except (OSError, ValueError):
        return None
    return man if isinstance(man, dict) else None


def _short(v: Optional[str]) -> str:
    return f"{v[:8]}.." if v else "none"


def _data(then: Dict[str, Any], now: Dict[str, Any]) -> list:
    old, new = then.get("data_identity") or {}, now.get("data_identity") or {}
    out = []
    for name in sorted(set(old) | set(new)):
        if old.get(name) == new.get(name):
            continue
        if name in old:
            out.append(f"data changed: {name} (sha256 {_short(old.get(name))} -> {_short(new.get(name))})")
        else:  # a manifest entry without the dataset's hash
            out.append(f"data {name} keyed by its content (sha256 {_short(new.get(name))}; the last run's record "
                       f"has no hash of it)")
    return out


def why(then: Dict[str, Any], now: Dict[str, Any], code: str, manifest: Dict[str, Any]) -> str:
    """Why the cell `now` (key, sources, data_identity) has another key than the manifest's entry `then` ("" when
    it has the same)."""
    if then.get("key") == now.get("key"):
        return ""  # the same cell, computed elsewhere (a fresh clone, an emptied cache): nothing changed
    out = _data(then, now)
    for field, what in (("data_source", "data source"), ("model_source", "model")):
        if then.get(field) != now.get(field):
            out.append(f"{what} changed: {then.get(field)} -> {now.get(field)}")
    if manifest.get("code_hash") and manifest["code_hash"] != code:
        out.append("compute code changed")
    was = manifest.get("versions") or {}
    drift = [f"{k} {was[k]} -> {v}" for k, v in library_versions().items() if k in was and was[k] != v]
    if drift:
        out.append("library versions changed: " + ", ".join(drift))
    return "; ".join(out) or "key changed"


def reasons(tasks: Sequence[Any], code: str, manifest: Optional[Dict[str, Any]]) -> Dict[str, str]:
    """label -> why, for each task (harness.run.plan.CellTask) that is missing from the cache and that the manifest
    names (a corrupt cell's note says why it is recomputed)."""
    if not manifest:
        return {}
    then = {c.get("cell"): c for c in manifest.get("cells") or [] if isinstance(c, dict)}
    out = {}
    for t in tasks:
        if t.state == "missing" and t.label in then:
            now = {"key": t.key, "data_source": t.data_source, "model_source": t.model_source,
                   "data_identity": t.data_identity}
            out[t.label] = why(then[t.label], now, code, manifest)
    return {k: v for k, v in out.items() if v}
