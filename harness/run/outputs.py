"""Outputs of a run, from the cache alone: <root>/<exp>/table.csv + table.parquet, figures/, manifest.json.

<root> is RunConfig.output_root: results/ for the canonical full run, results/quick/ for quick, and
results/custom/<scale>__<what differs>/ for --set, --dtype, --seed or --device runs, so no run ever replaces the
outputs of another scale or of other overrides."""
from __future__ import annotations

import io
import json
import time
import traceback
from pathlib import Path
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Tuple

from ..config import device_kind
from ..store.atomic import atomic_write_bytes, atomic_write_text, pid_alive
from ..store.cells import CellCache, CellRecord, CorruptCell
from .specs import CellStatus

Statuses = Dict[str, CellStatus]  # cell key -> status of the cells this run executed

HEAD = ["experiment", "cell"]
TAIL = ["seed", "device", "dtype", "scale", "cell_key"]


CSV_LIMIT = 5_000_000  # bytes: a larger table.csv is written gzipped (table.csv.gz), so no committed file exceeds it


def write_csv(outdir: Path, text: str) -> Path:
    """table.csv, or table.csv.gz when the text is over CSV_LIMIT bytes (the other name is removed once the new file
    is in place: a kill at any instant leaves one of them)."""
    import gzip

    plain, packed = outdir / "table.csv", outdir / "table.csv.gz"
    data = text.encode()
    if len(data) <= CSV_LIMIT:
        out = atomic_write_bytes(plain, data)
        packed.unlink(missing_ok=True)
        return out
    out = atomic_write_bytes(packed, gzip.compress(data, mtime=0))
    plain.unlink(missing_ok=True)
    return out


STAGING = ".figures-staging-"  # + pid: figures are rendered here, then moved into figures/ one by one


def _summary_text(exp, table) -> str:
    """The experiment's summary of the table ('' when it fails: the README names that failure, figures still draw)."""
    try:
        return exp.summary(table.copy()) or ""
    except Exception:  # noqa: BLE001 - a broken summary must not block the figures
        return ""


def render_figures(exp, table, outdir: Path) -> List[str]:
    """Render exp.figures into a staging folder beside figures/, then move each file into figures/ with os.replace
    and only then remove the figures the new set no longer has: a kill at any instant leaves every committed figure
    either old or new, never missing or truncated. A failure leaves figures/ as it was. Returns the paths relative
    to outdir."""
    import os
    import shutil

    figdir = outdir / "figures"
    for stale in outdir.glob(STAGING + "*"):  # left by a killed run
        pid = stale.name[len(STAGING):]
        if not (pid.isdigit() and pid_alive(int(pid))):
            shutil.rmtree(stale, ignore_errors=True)
    stage = outdir / f"{STAGING}{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        import matplotlib

        matplotlib.use("Agg")
        from .. import plotting
        from ..report import verdict_label

        with plotting.verdict(verdict_label(_summary_text(exp, table))):
            paths = exp.figures(table.copy(), stage) or []
        made = [f for f in sorted(stage.rglob("*")) if f.is_file()]
        figdir.mkdir(exist_ok=True)
        for f in made:
            dest = figdir / f.relative_to(stage)
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.replace(f, dest)
        keep = {figdir / f.relative_to(stage) for f in made}
        for old in list(figdir.glob("*.png")) + list(figdir.glob("*.pdf")):
            if old not in keep:
                old.unlink()
    finally:
        shutil.rmtree(stage, ignore_errors=True)
    out = []
    for x in paths:
        x = Path(x)
        if x.is_absolute() and x.is_relative_to(stage):
            x = figdir / x.relative_to(stage)
        out.append(str(x.relative_to(outdir)) if x.is_absolute() and x.is_relative_to(outdir) else str(x))
    return out


def _record(store: CellCache, t, statuses: Optional[Statuses]) -> Optional[CellRecord]:
    try:
        return store.load(t.experiment, t.key)
    except (FileNotFoundError, CorruptCell):
        st = (statuses or {}).get(t.key)
        return st.record if st else None  # computed, but the cache could not be written (read-only / full disk)


def load_rows(p, cfg, statuses: Optional[Statuses] = None) -> List[Dict[str, Any]]:
    """Tidy rows of every cached (or just computed) cell in the plan, with the harness columns added."""
    store = CellCache(cfg.cache_dir)
    rows: List[Dict[str, Any]] = []
    for t in p.tasks:
        rec = _record(store, t, statuses)
        if rec is None:
            continue
        for r in rec["rows"]:
            row = {"experiment": t.experiment, "cell": t.label}
            row.update({k: v for k, v in t.cell.items() if k not in r})
            row.update(r)
            if t.used:  # what stood in for the paper's data / model (harness.run.substitutes)
                row["data_used"] = t.used
            row.update(seed=cfg.seed, device=device_kind(rec.get("device", cfg.device)),
                       dtype=rec.get("dtype", cfg.dtype), scale=cfg.scale, cell_key=t.key[:12])
            rows.append(row)
    return rows


def to_table(rows: List[Dict[str, Any]]):
    """DataFrame with harness columns first/last and params/values in first-seen order; list-valued cells
    (e.g. a list of eps) are written as JSON text."""
    import pandas as pd

    order: List[str] = []
    for r in rows:
        order += [k for k in r if k not in order]
    cols = HEAD + [c for c in order if c not in HEAD + TAIL] + TAIL
    df = pd.DataFrame(rows, columns=cols)
    for c in df.columns:
        if df[c].dtype == object and any(isinstance(v, (list, dict)) for v in df[c]):
            df[c] = df[c].map(lambda v: json.dumps(v) if isinstance(v, (list, dict)) else v)
    return df


def parquet_bytes(df) -> bytes:
    """Parquet of the table; object columns mixing types are written as strings."""
    df = df.copy()
    for c in df.columns:
        if df[c].dtype == object:
            kinds = {type(v) for v in df[c] if v is not None and not (isinstance(v, float) and v != v)}
            if len(kinds) > 1 or (kinds and not kinds <= {str, bool}):
                df[c] = df[c].map(lambda v: None if v is None or (isinstance(v, float) and v != v) else
                                  (v if isinstance(v, str) else json.dumps(v)))
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return buf.getvalue()


@dataclass(frozen=True)
class OutputReport:
    """What write_outputs did for one experiment: `table` is the written table (None when nothing was written:
    `skipped` says why, `kept` names the folder whose complete outputs an incomplete set did not replace)."""

    experiment: str
    outdir: str = ""
    rows: int = 0
    figures: Tuple[str, ...] = ()
    figure_error: Optional[str] = None
    absent: Tuple[str, ...] = ()
    skipped: Optional[str] = None
    kept: Optional[str] = None
    table: Any = None
    reproduced: Optional[str] = None  # the result there reproduced within the verify tolerances: kept, and how close
    replaced: Optional[str] = None  # the result there differed and was rewritten: what differed, by how much

    @property
    def written(self) -> bool:
        return self.table is not None


def write_outputs(p, cfg, statuses: Optional[Statuses] = None, started: Optional[float] = None,
                  overrides: Optional[Dict[str, Any]] = None, judge=None) -> OutputReport:
    """Write <output_root>/<exp>/ from the cache; returns the OutputReport. judge(exp, outdir, parquet bytes,
    figures) -> (why kept, what differed) (the runner passes verify_compare.against_existing): when every cell is
    there and it says the result already in outdir reproduces, nothing is written."""
    from .. import manifest as _manifest

    exp, name = p.exp, p.exp.name
    outdir = Path(cfg.output_root) / name
    rows = load_rows(p, cfg, statuses)
    store = CellCache(cfg.cache_dir)
    cells = _cell_entries(p, store, statuses)
    absent = [c["cell"] for c in cells if c["status"] != "ok"]
    report = OutputReport(name, str(outdir), len(rows), absent=tuple(absent))
    if not rows:
        return replace(report, skipped="no cached cells")
    if absent:
        lost = would_lose(outdir, cells)
        if lost is not None:
            return replace(report, kept=str(outdir), skipped=lost)
    table = to_table(rows)
    packed = parquet_bytes(table)
    if not absent and judge is not None:
        same, differs = judge(exp, outdir, packed, cfg.figures)
        if same:
            return replace(report, reproduced=same)
        report = replace(report, replaced=differs)
    outdir.mkdir(parents=True, exist_ok=True)
    write_csv(outdir, table.to_csv(index=False))
    atomic_write_bytes(outdir / "table.parquet", packed)
    figures, figure_error = [], None
    if cfg.figures:
        try:
            figures = render_figures(exp, table, outdir)
        except OSError as e:  # disk full / unwritable: the real cause, not a figure bug
            figure_error = f"writing figures failed: {e.__class__.__name__}: {e}"
        except Exception as e:  # noqa: BLE001 - reported, run continues
            figure_error = f"{e.__class__.__name__}: {e}\n{traceback.format_exc()}"
    walls = [c.get("wall_s", 0) or 0 for c in cells]
    rss = [c.get("peak_rss_mb", 0) or 0 for c in cells]
    ran = sorted({(c.get("dtype"), c.get("device"), c.get("threads")) for c in cells if c["status"] == "ok"},
                 key=str)
    man = {
        "experiment": name,
        "figures_ref": list(exp.figures_ref),
        "description": (exp.description or (type(exp).__doc__ or "")).strip().split("\n")[0],
        "code_hash": p.code, "key_includes_scale": p.reads_scale,
        "scale": cfg.scale, "seed": cfg.seed, "dtype": cfg.dtype, "variant": cfg.variant or "canonical",
        "ran_as": [{"dtype": d, "device": dev, "threads": th} for d, dev, th in ran],
        "grid": exp.grid_for(cfg.scale), "overrides": overrides or {},
        "created": _manifest.now_utc(),
        **_manifest.environment(cfg.device),
        "complete": all(c["status"] == "ok" for c in cells),
        "n_cells": len(cells), "n_rows": len(rows),
        "total_cell_wall_s": round(sum(walls), 3),
        "max_cell_peak_rss_mb": round(max(rss), 1) if rss else None,
        "run_wall_s": round(time.perf_counter() - started, 3) if started else None,
        "runner_peak_rss_mb": {k: round(v, 1) for k, v in _manifest.peak_rss_mb().items()},
        "figures": figures,
        "cells": cells,
    }
    write_manifest(outdir / "manifest.json", man)
    return replace(report, figures=tuple(figures), figure_error=figure_error, table=table)


def write_manifest(path: Path, man: Dict[str, Any]) -> Path:
    """manifest.json as every writer formats it (one key per line, indent 1), replaced atomically."""
    return atomic_write_text(path, json.dumps(man, indent=1, default=str) + "\n")


def _cell_entries(p, store: CellCache, statuses: Optional[Statuses]) -> List[Dict[str, Any]]:
    """The manifest's per-cell entries: parameters, key, status, and the worker's metadata for computed cells."""
    cells = []
    for t in p.tasks:
        entry = {"cell": t.label, "key": t.key, "params": t.cell, "model_source": t.model_source,
                 "data_source": t.data_source, "data_identity": t.data_identity, "data_used": t.used}
        rec = _record(store, t, statuses)
        if rec is not None:
            entry.update(status="ok", n_rows=len(rec["rows"]), dtype=rec.get("dtype"), device=rec.get("device"))
            entry.update({k: v for k, v in rec.get("meta", {}).items() if k not in entry})
        else:
            st = (statuses or {}).get(t.key)
            entry.update(status=st.status if st else "missing", error=st.error if st else None)
        cells.append(entry)
    return cells


def would_lose(outdir: Path, cells: List[Dict[str, Any]]) -> Optional[str]:
    """Why an incomplete result must not replace what `outdir` holds, or None when it may.

    A complete result there (committed or from an earlier run) is never replaced by an incomplete one: tables,
    figures and manifest would lose the rows of the absent cells. An incomplete one there is replaced only by a
    result holding every cell it holds. An unreadable manifest counts as a result to keep."""
    man_path = outdir / "manifest.json"
    if not man_path.is_file():
        return None
    try:
        old = json.loads(man_path.read_text())
        old_ok = {c["cell"] for c in old.get("cells", []) if c.get("status") == "ok"}
        complete = bool(old.get("complete", False))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return f"{man_path} is unreadable, so the result there is kept as it is"
    new_ok = {c["cell"] for c in cells if c["status"] == "ok"}
    if complete:
        return f"{outdir} holds a complete result ({len(old_ok)} cells); an incomplete one never replaces it"
    lost = sorted(old_ok - new_ok)
    if lost:
        more = ", ..." if len(lost) > 3 else ""
        return f"{outdir} holds {len(lost)} cell(s) this result lacks ({', '.join(lost[:3])}{more})"
    return None
