"""`run_all.py --verify`: recompute committed cells from an empty cache on the current checkout and compare them
with the committed tables, column by column, within the tolerance each experiment declares.

What is compared: for each selected experiment, the committed <results>/<exp>/table.parquet (table.csv or
table.csv.gz when there is no parquet) at the scale's folder (results/ for full, results/quick/ for quick); a
sample of its cells (all, or the N cheapest by the committed manifest's per-cell wall time) is recomputed into a
temporary cache that is removed afterwards, so nothing cached or trained earlier is reused and nothing under the
results folder is written. A table row belongs to the cell named in its `cell` column; the rows of one cell are
compared in order (run() returns them in a fixed order), every numeric and boolean column the committed table has
except the harness's own (`seed`, `cell_key`).

Tolerance: `Experiment.verify_tol` maps a column name (or a glob over column names) to a tolerance, "default" to the
rest; None leaves a column out (timings). A value passes when |now - committed| <= tol * max(1, |committed|):
relative for values above one, absolute below. NaN equals NaN; a cell missing from the current grid, a changed row
count or a committed column the code no longer writes is a mismatch too.

Committed results may predate the current code: the output says when the committed code hash, cell keys or
library versions differ from the checkout's, and compares anyway (a stale table that still reproduces is
evidence; one that does not is a finding)."""
from __future__ import annotations

import fnmatch
import json
import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .. import registry as _registry
from .executors import execute
from .outputs import load_rows, parquet_bytes, to_table
from .plan import RunConfig, plan
from .worker import make_spec

NOT_COMPARED = ("seed", "cell_key")


@dataclass
class ColumnDiff:
    column: str
    tol: float
    n: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    bad: int = 0
    worst: str = ""  # where the largest violation (or difference) is: cell, row, committed vs now

    @property
    def ok(self) -> bool:
        return self.bad == 0


@dataclass
class ExpVerify:
    name: str
    cells: List[str] = field(default_factory=list)
    columns: List[ColumnDiff] = field(default_factory=list)
    problems: List[str] = field(default_factory=list)  # mismatches that are not a column's numbers
    notes: List[str] = field(default_factory=list)  # staleness, skipped columns
    wall_s: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems and all(c.ok for c in self.columns)


def tolerance(exp, column: str) -> Optional[float]:
    """The tolerance `exp.verify_tol` declares for `column`: exact name, else the first matching glob, else
    "default"; None: not compared."""
    tols = dict(exp.verify_tol or {})
    if column in tols:
        return tols[column]
    for pat, tol in tols.items():
        if pat != "default" and any(ch in pat for ch in "*?[") and fnmatch.fnmatchcase(column, pat):
            return tol
    return tols.get("default", 1e-9)


def read_table(folder: Path):
    """The committed table of an experiment folder (parquet first: it keeps the column types)."""
    import pandas as pd

    if (folder / "table.parquet").is_file():
        return pd.read_parquet(folder / "table.parquet")
    for name in ("table.csv", "table.csv.gz"):
        if (folder / name).is_file():
            return pd.read_csv(folder / name)
    return None


def _roundtrip(rows: List[Dict[str, Any]]):
    """Recomputed rows as the committed table holds them: the same table code and the same parquet types."""
    import io

    import pandas as pd

    return pd.read_parquet(io.BytesIO(parquet_bytes(to_table(rows))))


def sample(manifest: Dict[str, Any], labels: Sequence[str], n: Optional[int]) -> List[str]:
    """Committed cell labels to recompute: every one, or the n cheapest by the manifest's per-cell wall time
    (cells without a recorded time last, manifest order breaking ties)."""
    order = {c["cell"]: i for i, c in enumerate(manifest.get("cells") or [])}
    wall = {c["cell"]: c.get("wall_s") for c in manifest.get("cells") or []}
    ranked = sorted(dict.fromkeys(labels), key=lambda lb: (wall.get(lb) is None, wall.get(lb) or 0.0,
                                                           order.get(lb, len(order))))
    return ranked if n is None else ranked[:n]


def _number(v) -> Optional[float]:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def compare(exp, committed, now, labels: Sequence[str], out: ExpVerify) -> None:
    """Fill out.columns / out.problems: committed vs recomputed rows of the cells `labels`."""
    import pandas as pd

    cols = [c for c in committed.columns if c not in NOT_COMPARED and
            (pd.api.types.is_numeric_dtype(committed[c]) or pd.api.types.is_bool_dtype(committed[c]))]
    diffs: Dict[str, ColumnDiff] = {}
    for c in cols:
        tol = tolerance(exp, c)
        if tol is None:
            out.notes.append(f"column {c} not compared (verify_tol says None)")
            continue
        if c not in now.columns:  # a problem only where the sampled cells' committed rows hold values
            if committed.loc[committed["cell"].isin(labels), c].notna().any():
                out.problems.append(f"column {c}: in the committed rows, not written by the current code")
            continue
        diffs[c] = ColumnDiff(c, float(tol))
    for label in labels:
        a = committed[committed["cell"] == label].reset_index(drop=True)
        b = now[now["cell"] == label].reset_index(drop=True) if "cell" in now.columns else now.iloc[0:0]
        if len(a) != len(b):
            out.problems.append(f"cell {label}: {len(a)} committed rows, {len(b)} recomputed")
            continue
        for c, d in diffs.items():
            for i, (x, y) in enumerate(zip(a[c].tolist(), b[c].tolist())):
                _compare_value(d, label, i, _number(x), _number(y))
    out.columns = list(diffs.values())


def _compare_value(d: ColumnDiff, label: str, i: int, x: Optional[float], y: Optional[float]) -> None:
    d.n += 1
    if x is None or y is None:  # not a number on one side (a column whose type changed)
        err, rel, bad = math.inf, math.inf, x != y
    elif math.isnan(x) or math.isnan(y):
        err = rel = 0.0 if math.isnan(x) and math.isnan(y) else math.inf
        bad = err > 0
    elif x == y:  # equal infinities too
        return
    else:
        err = abs(x - y)
        rel = err / abs(x) if x else math.inf
        bad = not err <= d.tol * max(1.0, abs(x))
    if bad or (d.bad == 0 and err > d.max_abs):
        d.worst = f"{label} row {i}: committed {x!r}, now {y!r}"
    d.max_abs, d.max_rel = max(d.max_abs, err), max(d.max_rel, rel)
    d.bad += bool(bad)


def staleness(p, manifest: Dict[str, Any], labels: Sequence[str]) -> List[str]:
    """What differs between the committed run and this checkout: code hash, cell keys, library versions."""
    from .. import manifest as _manifest

    notes = []
    if manifest.get("code_hash") and manifest["code_hash"] != p.code:
        notes.append(f"stale: committed with code {manifest['code_hash'][:10]}, the checkout's is {p.code[:10]} "
                     f"(comparing anyway)")
    keys = {c["cell"]: c.get("key") for c in manifest.get("cells") or []}
    now = {t.label: t.key for t in p.tasks}
    same = sum(1 for lb in labels if keys.get(lb) and keys.get(lb) == now.get(lb))
    notes.append(f"{same} of {len(labels)} sampled cell keys equal to the committed ones")
    then, cur = manifest.get("versions") or {}, _manifest.versions()
    drift = [f"{k} {then[k]} -> {cur.get(k)}" for k in sorted(then) if k in cur and then[k] != cur[k]]
    if drift:
        notes.append("library versions differ from the committed run: " + ", ".join(drift))
    threads = sorted({c.get("threads") for c in manifest.get("cells") or [] if c.get("threads")})
    if threads:
        notes.append(f"committed cells computed with torch threads {threads}")
    return notes


def verify(names: Sequence[str], cfg: RunConfig, n: Optional[int] = None, echo=print,
           results_root: Optional[Path] = None) -> List[ExpVerify]:
    """Recompute (in a temporary cache) and compare the committed cells of `names` at cfg.scale."""
    root = RunConfig(scale=cfg.scale, results_dir=results_root or cfg.results_dir).output_root
    out: List[ExpVerify] = []
    with tempfile.TemporaryDirectory(prefix="attnlip-verify-") as tmp:
        run_cfg = RunConfig(scale=cfg.scale, results_dir=Path(tmp), cache_dir=Path(tmp) / "cache",
                            executor=cfg.executor, jobs=cfg.jobs, threads=cfg.threads, progress=cfg.progress,
                            figures=False, fresh_workers=cfg.fresh_workers, device=cfg.device)
        for name in names:
            out.append(_verify_one(name, root / name, run_cfg, n, echo))
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _verify_one(name: str, folder: Path, run_cfg: RunConfig, n: Optional[int], echo) -> ExpVerify:
    t0 = time.perf_counter()
    r = ExpVerify(name)
    committed = read_table(folder)
    if committed is None:
        r.notes.append(f"no committed table in {folder}: nothing to verify")
        return r
    man_path = folder / "manifest.json"
    manifest = json.loads(man_path.read_text()) if man_path.is_file() else {}
    exp = _registry.get_experiment(name)
    p = plan(name, run_cfg, verify=False)
    r.cells = sample(manifest, committed["cell"].astype(str).tolist(), n)
    r.notes += staleness(p, manifest, r.cells)
    tasks = {t.label: t for t in p.tasks}
    gone = [lb for lb in r.cells if lb not in tasks]
    r.problems += [f"cell {lb}: committed, but not a cell of the current {run_cfg.scale} grid" for lb in gone]
    todo = [tasks[lb] for lb in r.cells if lb in tasks]
    specs = [make_spec(exp, t, run_cfg, progress=False) for t in todo]
    echo(f"{name}: recomputing {len(specs)} of {committed['cell'].nunique()} committed cells ...")
    statuses = {s["key"]: s for s in execute(specs, run_cfg, desc=name)}
    for t in todo:
        st = statuses.get(t.key) or {}
        if st.get("status") != "ok":
            r.problems.append(f"cell {t.label}: {st.get('status', 'not run')}: {st.get('error', '')}".rstrip(": "))
    ok_labels = [t.label for t in todo if (statuses.get(t.key) or {}).get("status") == "ok"]
    if ok_labels:
        sub = type(p)(p.exp, p.code, [t for t in todo if t.label in ok_labels], p.reads_scale)
        now = _roundtrip(load_rows(sub, run_cfg, statuses))
        compare(exp, committed, now, ok_labels, r)
    r.wall_s = time.perf_counter() - t0
    return r


def _g(x: float) -> str:
    return "inf" if x == math.inf else f"{x:.3g}"


def format_report(results: Sequence[ExpVerify], all_columns: bool = False) -> str:
    """Per experiment: notes, problems, and the diff table (columns that differ at all, every failing one;
    all_columns: every compared column)."""
    lines: List[str] = []
    for r in results:
        status = "OK" if r.ok else "MISMATCH"
        lines.append(f"== {r.name}: {status} ({len(r.cells)} cell(s), {r.wall_s:.1f}s)")
        lines += [f"   note: {x}" for x in r.notes]
        lines += [f"   MISMATCH: {x}" for x in r.problems]
        shown = [c for c in r.columns if all_columns or not c.ok or c.max_abs > 0]
        if shown:
            rows = [("column", "values", "max abs diff", "max rel diff", "tolerance", "ok")]
            rows += [(c.column, str(c.n), _g(c.max_abs), _g(c.max_rel), f"{c.tol:g}", "yes" if c.ok else
                      f"NO ({c.bad} over)") for c in shown]
            w = [max(len(x[i]) for x in rows) for i in range(6)]
            lines += ["   " + "  ".join(v.ljust(w[i]) for i, v in enumerate(x)).rstrip() for x in rows]
            lines += [f"   worst {c.column}: {c.worst}" for c in shown if not c.ok]
        same = len(r.columns) - len(shown)
        if same:
            lines.append(f"   {same} other column(s) identical")
    bad = [r.name for r in results if not r.ok]
    lines.append(f"verify: {len(results) - len(bad)} of {len(results)} experiment(s) reproduce the committed "
                 f"tables" + (f"; MISMATCH in {', '.join(bad)}" if bad else ""))
    return "\n".join(lines)


def main(names: Sequence[str], cfg: RunConfig, n: Optional[int] = None, echo=print,
         results_root: Optional[Path] = None) -> int:
    """CLI body of --verify: 0 when every sampled cell reproduces, 1 on any mismatch, 2 on a usage error."""
    import sys

    extra = [f"--set {k}" for k in cfg.overrides] + [f"--bound {b}" for b in cfg.bounds]
    extra += [f"--dtype {cfg.dtype}"] if cfg.dtype != "float64" else []
    extra += [f"--seed {cfg.seed}"] if cfg.seed != 0 else []
    if extra or (n is not None and n < 1):
        why = (f"{', '.join(extra)} selects a run whose tables are not committed; --verify compares the committed "
               f"canonical tables (results/<exp>/, results/quick/<exp>/): drop {', '.join(extra)}") if extra else \
            f"--verify-sample must be >= 1, got {n}"
        print(f"run_all.py: error: {why}", file=sys.stderr)
        return 2
    results = verify(names, cfg, n, echo=echo, results_root=results_root)
    echo(format_report(results))
    return 0 if all(r.ok for r in results) else 1
