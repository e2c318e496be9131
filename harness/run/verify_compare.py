"""The comparisons of `--verify` (harness.run.verify): committed rows against recomputed ones within each column's
tolerance, the two committed copies of a table against each other, and what differs between the committed run and
the checkout (code hash, cell keys, library versions)."""
from __future__ import annotations

import dataclasses
import fnmatch
import io
import math
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import CorruptFile
from .outputs import parquet_bytes, to_table

NOT_COMPARED = ("seed", "cell_key")


@dataclasses.dataclass
class ColumnDiff:
    column: str
    tol: float
    n: int = 0
    max_abs: float = 0.0
    max_rel: float = 0.0
    bad: int = 0
    worst: str = ""  # where the largest violation (or difference) is: cell, row, committed vs now
    cells: List[str] = dataclasses.field(default_factory=list)  # cells with a value over the tolerance

    @property
    def ok(self) -> bool:
        return self.bad == 0


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

    for name, read in (("table.parquet", pd.read_parquet), ("table.csv", pd.read_csv),
                       ("table.csv.gz", pd.read_csv)):
        path = folder / name
        if path.is_file():
            try:
                table = read(path)
            except Exception as e:  # noqa: BLE001 - any parser error of a damaged file: one line, no traceback
                raise CorruptFile(f"{path}: not a readable table ({e.__class__.__name__}: {str(e)[:120]}); restore "
                                  "it (git checkout -- PATH) or rewrite it from the cache (python run_all.py "
                                  "--collect)") from None
            if "cell" not in table.columns:
                raise CorruptFile(f"{path}: not a run_all.py table (no 'cell' column)")
            return table
    return None


def roundtrip(rows: List[Dict[str, Any]]):
    """Recomputed rows as the committed table holds them: the same table code and the same parquet types."""
    import io

    import pandas as pd

    return pd.read_parquet(io.BytesIO(parquet_bytes(to_table(rows))))


def _number(v) -> Optional[float]:
    if v is None:
        return math.nan
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _kind(col) -> str:
    """What a column holds: "empty" (only missing values), "number" (numbers and flags, in any dtype: parquet keeps
    a flag column with gaps as objects) or "text"."""
    import pandas as pd

    vals = col.dropna()
    if not len(vals):
        return "empty"
    if pd.api.types.is_numeric_dtype(col) or pd.api.types.is_bool_dtype(col):
        return "number"
    numbers = all(isinstance(v, (bool, int, float)) or pd.api.types.is_number(v) for v in vals.tolist())
    return "number" if numbers else "text"


def _columns(committed, now, mine, whole: bool) -> List[str]:
    """The column sets of the committed and the recomputed table: a committed column the current code does not
    write (when every committed cell was recomputed; else only where the sampled cells' committed rows hold values:
    a column may belong to other cells) and a column the current code writes that the committed table lacks.
    Every column counts, those not compared by value too (`seed`, `cell_key`, a tolerance of None)."""
    out = []
    gone = [str(c) for c in committed.columns if c not in now.columns and (whole or mine[c].notna().any())]
    new = [str(c) for c in now.columns if c not in committed.columns]
    if gone:
        out.append(f"column(s) {', '.join(gone)}: in the committed table, not written by the current code")
    if new:
        out.append(f"column(s) {', '.join(new)}: written by the current code, not in the committed table")
    return out


def compare(exp, committed, now, labels: Sequence[str], out) -> None:
    """Fill out.columns / out.problems: committed vs recomputed rows of the cells `labels`, the whole table: the
    same columns (_columns), each column of the same kind (number / text, over the whole committed table), the
    same rows per cell, numeric and boolean values within their tolerance (out.columns) and equal text values.
    Columns whose tolerance is None (timings) and the harness's own `seed` / `cell_key` are not compared by value."""
    diffs: Dict[str, ColumnDiff] = {}
    labels = [str(x) for x in labels]
    cells = committed["cell"].astype(str)
    mine = committed[cells.isin(labels)]
    theirs = now[now["cell"].astype(str).isin(labels)] if "cell" in now.columns else now.iloc[0:0]
    texts: List[str] = []
    out.problems += _columns(committed, now, mine, set(cells) <= set(labels))
    for c in committed.columns:
        if c not in now.columns:
            continue
        was, now_kind = _kind(committed[c]), _kind(theirs[c])
        kinds = {was, now_kind} - {"empty"}
        if len(kinds) > 1:
            out.problems.append(f"column {c}: committed as {was}s, recomputed as {now_kind}s")
            continue
        if c in NOT_COMPARED:
            continue
        tol = tolerance(exp, c)
        if tol is None:
            out.notes.append(f"column {c} not compared (verify_tol says None)")
        elif kinds == {"text"}:
            texts.append(c)
        else:  # numbers, or missing values on both sides
            diffs[c] = ColumnDiff(c, float(tol))
    for label in labels:
        a = committed[cells == label].reset_index(drop=True)
        b = now[now["cell"].astype(str) == label].reset_index(drop=True) if "cell" in now.columns else now.iloc[0:0]
        if len(a) != len(b):
            out.problems.append(f"cell {label}: {len(a)} committed rows, {len(b)} recomputed")
            continue
        for c, d in diffs.items():
            for i, (x, y) in enumerate(zip(a[c].tolist(), b[c].tolist())):
                _compare_value(d, label, i, _number(x), _number(y))
        for c in list(texts):
            bad = next((i for i, (x, y) in enumerate(zip(a[c].tolist(), b[c].tolist())) if not _same(x, y)), None)
            if bad is not None:
                out.problems.append(f"column {c}: cell {label} row {bad}: committed {a[c].iloc[bad]!r}, now "
                                    f"{b[c].iloc[bad]!r}")
                texts.remove(c)  # one line per column
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
    if bad and label not in d.cells:
        d.cells.append(label)


def _same(x, y) -> bool:
    """Equal values of one table cell in the two copies (NaN equals NaN and a missing value; numbers exactly:
    the CSV is written with Python's shortest round-trip repr)."""
    fx, fy = _number(x), _number(y)
    if fx is not None and fy is not None:
        return fx == fy or (math.isnan(fx) and math.isnan(fy))
    missing = (lambda v: v is None or v == "" or (isinstance(v, float) and math.isnan(v)))  # CSV reads "" as NaN
    return (missing(x) and missing(y)) or str(x) == str(y)


def copies(folder: Path, committed, manifest: Dict[str, Any]) -> List[str]:
    """Differences between the committed copies of a table: table.csv (or .csv.gz) against table.parquet, every row
    and column; and each copy against the sha256 a stamped manifest recorded for it (an edit after the stamp)."""
    import pandas as pd

    from ..store.atomic import sha256

    out: List[str] = []
    stamped = ((manifest.get("verified") or {}).get("tables") or {})
    for name, digest in stamped.items():
        f = folder / name
        if f.is_file() and sha256(f.read_bytes()) != digest:
            out.append(f"{name} changed since the manifest's verification stamp (sha256 differs)")
    csv = next((folder / n for n in ("table.csv", "table.csv.gz") if (folder / n).is_file()), None)
    if csv is None or not (folder / "table.parquet").is_file():
        return out
    try:
        other = pd.read_csv(csv, low_memory=False)
    except Exception as e:  # noqa: BLE001 - a damaged copy is a finding
        return out + [f"{csv.name} is not a readable table ({e.__class__.__name__}: {str(e)[:120]})"]
    gone = [str(c) for c in committed.columns if c not in other.columns]
    extra = [str(c) for c in other.columns if c not in committed.columns]
    what = [f"column(s) {', '.join(gone)} only in table.parquet"] if gone else []
    what += [f"column(s) {', '.join(extra)} only in {csv.name}"] if extra else []
    what += ["the same columns in another order"] if not what and list(other.columns) != list(committed.columns) else []
    what += [f"{len(other)} rows against {len(committed)}"] if len(other) != len(committed) else []
    if what:
        return out + [f"{csv.name} and table.parquet hold different tables: {'; '.join(what)}"]
    for c in committed.columns:
        for i, (x, y) in enumerate(zip(committed[c].tolist(), other[c].tolist())):
            if not _same(x, y):
                out.append(f"{csv.name} differs from table.parquet: cell {committed['cell'].iloc[i]} row {i} "
                           f"column {c}: csv {y!r}, parquet {x!r}")
                break
    return out


def rows(committed, manifest: Dict[str, Any], grid: Sequence[str], scale: str, show: int = 3) -> List[str]:
    """The rows of the whole committed table, sampled or not, against the current grid and the manifest: every
    committed cell a cell of the grid; a complete result holding every cell of the grid; each cell's row count the
    one its manifest entry records (n_rows), and no cell its manifest does not list as computed."""
    counts, grid = committed["cell"].astype(str).value_counts().to_dict(), list(dict.fromkeys(grid))
    on_grid = set(grid)
    listed = {c["cell"]: c for c in manifest.get("cells") or []}
    found = [f"cell {lb}: committed, but not a cell of the current {scale} grid" for lb in counts if lb not in on_grid]
    if manifest.get("complete"):
        found += [f"cell {lb}: a cell of the current {scale} grid, not in the committed table (its manifest says "
                  f"the result is complete)" for lb in grid if lb not in counts]
    for lb, entry in listed.items():
        n = entry.get("n_rows")
        if entry.get("status") == "ok" and isinstance(n, int) and counts.get(lb, 0) != n:
            found.append(f"cell {lb}: {counts.get(lb, 0)} row(s) in the committed table, its manifest records {n}")
    if listed:
        found += [f"cell {lb}: in the committed table, not a computed cell of its manifest" for lb in counts
                  if listed.get(lb, {}).get("status") != "ok"]
    return found[:show] + ([f"... and {len(found) - show} more such row difference(s)"] if len(found) > show else [])


def staleness(p, manifest: Dict[str, Any], labels: Sequence[str]) -> List[str]:
    """What differs between the committed run (or its last verification) and this checkout: compute hash, cell
    keys, library versions."""
    from .. import manifest as _manifest

    notes = []
    stamp = manifest.get("verified") or {}
    if stamp.get("code_hash") == p.code:
        notes.append(f"this compute code verified at commit {str(stamp.get('commit'))[:12]} ({stamp.get('at')})")
    if manifest.get("code_hash") and manifest["code_hash"] != p.code:
        notes.append(f"committed with compute code {manifest['code_hash'][:10]}, the checkout's is {p.code[:10]} "
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


@dataclasses.dataclass
class TableDiff:
    """compare()'s findings for one table against another: column differences, other problems, notes."""
    columns: List[ColumnDiff] = dataclasses.field(default_factory=list)
    problems: List[str] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems and all(c.ok for c in self.columns)


def against_existing(exp, outdir: Path, packed: bytes, figures: bool) -> Tuple[Optional[str], Optional[str]]:
    """Whether a complete new table reproduces the complete result in `outdir` (committed or from an earlier run)
    within the experiment's verify tolerances (harness.run.verify_compare.compare: every cell, every column, both
    copies of the table agreeing, its figures present). Returns (why it is kept, None) when it does: the files
    there stay byte for byte as they are, so a rerun on a machine that reproduces leaves a clean checkout; else
    (None, what differed) for the run to say, or (None, None) when there is nothing to compare with."""
    import pandas as pd

    from ..manifest import read as read_manifest

    man_path = outdir / "manifest.json"
    if not man_path.is_file():
        return None, None
    try:
        manifest = read_manifest(man_path)
        old = read_table(outdir)
    except (CorruptFile, OSError, ValueError) as e:
        return None, f"the result there was unreadable ({str(e)[:160]})"
    if old is None or not isinstance(manifest, dict) or not manifest.get("complete"):
        return None, None
    now = pd.read_parquet(io.BytesIO(packed))
    r = TableDiff()
    labels = list(dict.fromkeys(now["cell"].astype(str)))
    gone = sorted(set(old["cell"].astype(str)) - set(labels))
    r.problems += [f"cell {lb}: in the table there, not a cell of this run" for lb in gone[:3]]
    r.problems += copies(outdir, old, manifest)
    compare(exp, old, now, labels, r)
    if figures:
        lost = [f for f in manifest.get("figures") or [] if not (outdir / str(f)).is_file()]
        r.problems += [f"figure {f} missing there" for f in lost[:3]]
    if not r.ok:
        worst = [c for c in r.columns if not c.ok]
        what = [f"{c.column} by up to {c.max_rel:.3g} relative ({c.bad} value(s) over {c.tol:g})" for c in worst]
        return None, "; ".join(what + r.problems[:3]) or "differs"
    closest = max((c.max_rel for c in r.columns if c.max_abs > 0 and c.max_rel != float("inf")), default=0.0)
    largest = max((c.max_abs for c in r.columns), default=0.0)
    return (f"reproduced ({len(labels)} cells, {len(r.columns)} columns within their verify tolerance; largest "
            f"difference {largest:.2g} absolute, {closest:.2g} relative); committed results kept"), None
