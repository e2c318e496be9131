"""`run_all.py --verify`: recompute committed cells from an empty cache on the current checkout and compare them
with the committed tables, column by column, within the tolerance each experiment declares. It is the gate after a
compute change: what reproduces keeps its committed results (`--stamp` records the verifying commit in their
manifests, harness.run.stamp); only what differs is regenerated.

What is recomputed: at quick scale every committed cell, at full scale a sample (`sample`: the N cheapest cells by
the committed manifest's per-cell wall time and N others drawn with a seed from the experiment's name; N is
`--verify-sample`, 2 by default, `all` for every cell). `--verify` without a scale verifies both committed scales;
`--quick` or `--scale S` one. The sampled cells of every experiment run in one batch (one pool for `-j N`) in a
temporary cache that is removed afterwards: nothing cached or trained earlier is reused, nothing under the results
folder is written (except the manifests `--stamp` amends).

What is compared: the whole committed table, in both committed copies. table.csv (what readers open) must hold
exactly the columns and values of table.parquet in every row (`copies`); the table's rows must be those of the
current grid, with each cell's row count as its manifest records it (`rows`); the recomputed rows of the sampled
cells are compared with table.parquet (`compare`): the same set of columns (every column, those not compared by
value too), each column of the same kind (numbers or text), the same rows per cell (a row belongs to the cell named
in its `cell` column; the rows of one cell are compared in order), and every value but the harness's own (`seed`,
`cell_key`). A stamped manifest also records the tables' sha256: a table edited after its stamp differs.

Tolerance: `Experiment.verify_tol` maps a column name (or a glob over column names) to a tolerance, "default" to the
rest; None leaves a column out (timings). A value passes when |now - committed| <= tol * max(1, |committed|):
relative for values above one, absolute below. NaN equals NaN.

Verdict per experiment and scale: *reproduced*; *differs* (the columns, the largest difference, the cells; a cell
that fails is a difference); *cannot verify* (a dataset or model a sampled cell needs is missing here: each item
named once with the command that gets it); *not committed* (no table at that scale: nothing to check). Exit status:
0 when everything checked reproduced, 1 when anything differs, 3 when nothing differs but something could not be
verified (or nothing was committed to check), 2 on a usage error, 128 + the signal's number when SIGTERM, SIGINT
(Ctrl-C) or SIGHUP ends the run (its temporary cache removed, nothing stamped)."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import secrets
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from . import discovery as _discovery
from ..errors import CorruptFile
from ..manifest import read as read_manifest
from .executors import execute
from .outputs import load_rows
from .plan import RunConfig, plan
from .verify_compare import (ColumnDiff, compare, copies, read_table, roundtrip, rows, staleness,  # noqa: F401
                             tolerance, _compare_value)
from .specs import CellStatus
from .worker import make_spec

DEFAULT_SAMPLE = 2  # full scale: the 2 cheapest cells and 2 drawn at random, per experiment
REPRODUCED, DIFFERS, CANNOT, ABSENT = "reproduced", "differs", "cannot verify", "not committed"


@dataclasses.dataclass
class ExpVerify:
    name: str
    scale: str = "quick"
    cells: List[str] = dataclasses.field(default_factory=list)  # sampled cells
    verified: List[str] = dataclasses.field(default_factory=list)  # sampled cells recomputed and compared
    columns: List[ColumnDiff] = dataclasses.field(default_factory=list)
    problems: List[str] = dataclasses.field(default_factory=list)  # differences that are not a column's numbers
    missing: List[Dict[str, Any]] = dataclasses.field(default_factory=list)  # {"m": item, "cells": [labels]}
    notes: List[str] = dataclasses.field(default_factory=list)  # staleness, skipped columns
    committed: bool = True
    wall_s: float = 0.0
    code: str = ""  # the checkout's compute hash of the experiment
    n_committed: int = 0  # cells in the committed table
    device: str = "cpu"

    @property
    def status(self) -> str:
        if not self.committed:
            return ABSENT
        if self.problems or not all(c.ok for c in self.columns):
            return DIFFERS
        return CANNOT if self.missing else REPRODUCED

    @property
    def ok(self) -> bool:
        return self.status in (REPRODUCED, ABSENT)


def sample(manifest: Dict[str, Any], labels: Sequence[str], n: Optional[int], seed: str = "") -> List[str]:
    """Committed cell labels to recompute: every one (n None), else the n cheapest by the manifest's per-cell wall
    time (cells without a recorded time last, manifest order breaking ties) and n of the others drawn at random
    with `seed` (the experiment's name: the same cells on every machine)."""
    order = {c["cell"]: i for i, c in enumerate(manifest.get("cells") or [])}
    wall = {c["cell"]: c.get("wall_s") for c in manifest.get("cells") or []}
    ranked = sorted(dict.fromkeys(labels), key=lambda lb: (wall.get(lb) is None, wall.get(lb) or 0.0,
                                                           order.get(lb, len(order))))
    if n is None:
        return ranked
    rest = ranked[n:]
    return ranked[:n] + sorted(random.Random(seed).sample(rest, min(n, len(rest))), key=ranked.index)


@dataclasses.dataclass
class _Job:
    """One experiment at one scale: its verdict so far, and the work still to compare."""
    r: ExpVerify
    exp: Any = None
    plan: Any = None
    committed: Any = None
    folder: Optional[Path] = None
    todo: List[Any] = dataclasses.field(default_factory=list)  # planned tasks to recompute


def _prepare(name: str, folder: Path, run_cfg: RunConfig, n: Optional[int]) -> _Job:
    r = ExpVerify(name, scale=run_cfg.scale, device=run_cfg.device)
    job = _Job(r, folder=folder)
    try:
        committed = read_table(folder)
        man_path = folder / "manifest.json"
        manifest = read_manifest(man_path) if man_path.is_file() else {}
    except CorruptFile as e:  # a damaged committed file: the experiment does not reproduce, and why
        r.problems.append(str(e))
        return job
    if committed is None:
        r.committed = False
        r.notes.append(f"no committed table in {folder}")
        return job
    job.exp, job.committed = _discovery.get_experiment(name), committed
    job.plan = p = plan(name, run_cfg, verify=False)
    r.code, r.n_committed = p.code, int(committed["cell"].nunique())
    r.cells = sample(manifest, committed["cell"].astype(str).tolist(), n, seed=name)
    r.notes += staleness(p, manifest, r.cells)
    r.problems += copies(folder, committed, manifest)
    tasks = {t.label: t for t in p.tasks}
    r.problems += rows(committed, manifest, list(tasks), run_cfg.scale)
    from .preflight import _grouped

    lacking = [tasks[lb] for lb in r.cells if lb in tasks and tasks[lb].missing]
    r.missing = _grouped((m, t.label) for t in lacking for m in t.missing)
    job.todo = [tasks[lb] for lb in r.cells if lb in tasks and not tasks[lb].missing]
    return job


def _finish(job: _Job, run_cfg: RunConfig, statuses: Dict[str, CellStatus]) -> None:
    from .preflight import _grouped, items_of

    r = job.r
    ok, lacking = [], []
    for t in job.todo:
        st = statuses.get(t.key)
        if st is not None and st.status == "ok":
            ok.append(t)
        elif st is not None and st.status == "missing_data":
            lacking.append((t, st))
        else:
            why = f"{st.status}: {st.error or ''}" if st is not None else "not run"
            r.problems.append(f"cell {t.label}: {why}".rstrip(": "))
    if lacking:
        r.missing += _grouped((m, t.label) for t, st in lacking for m in items_of(st))
    if ok:
        sub = type(job.plan)(job.plan.exp, job.plan.code, ok, job.plan.reads_scale)
        now = roundtrip(load_rows(sub, run_cfg, statuses))
        compare(job.exp, job.committed, now, [t.label for t in ok], r)
    r.verified = [t.label for t in ok]


TMP_PREFIX = "attnlip-verify-"  # + pid + "-": the temporary cache of one --verify


class Interrupted(KeyboardInterrupt):
    """SIGTERM, SIGINT or SIGHUP while --verify runs, raised where the run is, so that its temporary cache is
    removed on the way out (SIGTERM or SIGHUP would end the process at once)."""

    def __init__(self, signum: int):
        import signal

        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def _signals_raise():
    """SIGTERM, SIGINT and SIGHUP (a closed terminal) raise Interrupted in the main thread for the duration (where
    they are not ignored); the handlers before are restored."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Interrupted(signum)

    before = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
              if signal.getsignal(s) is not signal.SIG_IGN}  # an ignored signal stays ignored
    try:
        yield
    finally:
        for s, h in before.items():
            signal.signal(s, signal.SIG_DFL if h is None else h)


@contextlib.contextmanager
def _temporary_cache():
    """A temporary folder for one --verify, removed afterwards whatever happens (an error, SIGTERM, Ctrl-C); those
    that killed runs (SIGKILL) left behind are removed first (their pid is gone)."""
    from ..store.atomic import pid_alive

    for old in Path(tempfile.gettempdir()).glob(TMP_PREFIX + "*"):
        pid = old.name[len(TMP_PREFIX):].split("-")[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    # named before it is made, so a signal that arrives while it is being made still finds it to remove
    tmp = os.path.join(tempfile.gettempdir(), f"{TMP_PREFIX}{os.getpid()}-{secrets.token_hex(6)}")
    with _signals_raise():
        try:
            os.mkdir(tmp, 0o700)
            yield tmp
        finally:
            import signal

            stops = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
            held = signal.pthread_sigmask(signal.SIG_BLOCK, stops)  # a second signal waits for the removal
            try:
                shutil.rmtree(tmp, ignore_errors=True)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, held)


def verify(names: Sequence[str], cfg: RunConfig, n: Union[int, None, str] = "default", echo=print,
           results_root: Optional[Path] = None, scales: Sequence[str] = ()) -> List[ExpVerify]:
    """Recompute (in a temporary cache) and compare the committed cells of `names` at each of `scales` (default
    cfg.scale). n: cells per sample (None: all; "default": all at quick scale, DEFAULT_SAMPLE at the others).
    SIGTERM or SIGINT raises Interrupted, after the temporary cache is removed."""
    results_dir = results_root or cfg.results_dir
    jobs: List[_Job] = []
    with _temporary_cache() as tmp:
        cfgs = {}
        for scale in scales or [cfg.scale]:
            cfgs[scale] = run_cfg = RunConfig(
                scale=scale, results_dir=Path(tmp), cache_dir=Path(tmp) / "cache", executor=cfg.executor,
                jobs=cfg.jobs, threads=cfg.threads, progress=cfg.progress, figures=False,
                fresh_workers=cfg.fresh_workers, device=cfg.device, cluster=cfg.cluster,
                executor_params=cfg.executor_params, timeout_min=cfg.timeout_min)
            root = RunConfig(scale=scale, results_dir=results_dir).output_root
            size = (None if scale == "quick" else DEFAULT_SAMPLE) if n == "default" else n
            for name in names:
                t0 = time.perf_counter()
                jobs.append(_prepare(name, root / name, run_cfg, size))
                jobs[-1].r.wall_s = time.perf_counter() - t0
        specs = [make_spec(j.exp, t, cfgs[j.r.scale], progress=False) for j in jobs for t in j.todo]
        specs = list({s.key: s for s in specs}.values())  # equal cells of two scales: computed once
        missing = sum(len(g["cells"]) for j in jobs for g in j.r.missing)
        echo(f"verify: recomputing {len(specs)} cell(s) of {sum(j.r.committed for j in jobs)} committed "
             f"experiment table(s) at {', '.join(cfgs)} scale" + (f"; {missing} sampled cell(s) lack data or "
                                                                  f"weights here" if missing else ""))
        t0 = time.perf_counter()
        statuses = {s.key: s for s in execute(specs, cfgs[jobs[0].r.scale] if jobs else cfg, desc="verify")}
        share = (time.perf_counter() - t0) / max(1, len(specs))
        for j in jobs:
            if j.r.committed:
                _finish(j, cfgs[j.r.scale], statuses)
                j.r.wall_s += sum(getattr(statuses.get(t.key), "wall_s", None) or share for t in j.todo)
    return [j.r for j in jobs]


def _g(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:.3g}"


def format_one(r: ExpVerify, all_columns: bool = False, show: int = 4) -> List[str]:
    """The lines of one verdict: the verdict, its reasons, notes, and the diff table of the columns that differ."""
    if r.status == ABSENT:
        return [f"== {r.name} ({r.scale}): {ABSENT}"]
    lines = [f"== {r.name} ({r.scale}): {r.status} ({len(r.verified)} of {len(r.cells)} sampled cell(s) "
             f"recomputed, {r.wall_s:.1f}s)"]
    for g in r.missing:
        cells = g["cells"]
        more = f" ... ({len(cells) - show} more)" if len(cells) > show else ""
        lines += [f"   cannot verify {len(cells)} cell(s) ({'; '.join(cells[:show])}{more}): {g['m']['message']}",
                  f"     get it with: {g['m'].get('fix') or 'make data'}"]
    lines += [f"   differs: {x}" for x in r.problems]
    shown = [c for c in r.columns if all_columns or not c.ok or c.max_abs > 0]
    if shown:
        rows = [("column", "values", "max abs diff", "max rel diff", "tolerance", "ok")]
        rows += [(c.column, str(c.n), _g(c.max_abs), _g(c.max_rel), f"{c.tol:g}", "yes" if c.ok else
                  f"NO ({c.bad} over)") for c in shown]
        w = [max(len(x[i]) for x in rows) for i in range(6)]
        lines += ["   " + "  ".join(v.ljust(w[i]) for i, v in enumerate(x)).rstrip() for x in rows]
        lines += [f"   worst {c.column}: {c.worst} (cells: {', '.join(c.cells[:show])}"
                  f"{' ...' if len(c.cells) > show else ''})" for c in shown if not c.ok]
    same = len(r.columns) - len(shown)
    if same:
        lines.append(f"   {same} other column(s) identical")
    lines += [f"   note: {x}" for x in r.notes]
    return lines


def format_report(results: Sequence[ExpVerify], all_columns: bool = False) -> str:
    """Every verdict, then one line per scale: how many reproduced, and which differ or cannot be verified."""
    lines: List[str] = []
    for r in results:
        lines += format_one(r, all_columns)
    for scale in dict.fromkeys(r.scale for r in results):
        rs = [r for r in results if r.scale == scale]
        by = {s: [r.name for r in rs if r.status == s] for s in (REPRODUCED, DIFFERS, CANNOT, ABSENT)}
        parts = [f"{len(by[REPRODUCED])} reproduced"]
        parts += [f"{len(by[s])} {s} ({', '.join(by[s])})" for s in (DIFFERS, CANNOT, ABSENT) if by[s]]
        lines.append(f"verify ({scale}): " + "; ".join(parts))
    if results and all(r.status == ABSENT for r in results):
        lines.append("nothing was verified: no committed table of these experiments at these scales under the "
                     "results folder (check --results-dir and the scale)")
    return "\n".join(lines)


def exit_status(results: Sequence[ExpVerify]) -> int:
    statuses = {r.status for r in results}
    checked = statuses - {ABSENT}
    return 1 if DIFFERS in statuses else 3 if CANNOT in statuses or not checked else 0


def parse_sample(text: Optional[str]) -> Union[int, None, str]:
    """--verify-sample: a whole number >= 1, or 'all' (None); absent: "default"."""
    if text is None:
        return "default"
    if str(text).strip().lower() == "all":
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"--verify-sample must be a whole number >= 1 or 'all', got {text!r}")
    return n


def main(names: Sequence[str], cfg: RunConfig, n: Optional[str] = None, echo=print,
         results_root: Optional[Path] = None, scales: Sequence[str] = (), stamp: bool = False) -> int:
    """CLI body of --verify (see the module docstring for the exit status)."""
    import sys

    from . import stamp as _stamp

    extra = [f"--set {k}" for k in cfg.overrides] + [f"--bound {b}" for b in cfg.bounds]
    extra += [f"--dtype {cfg.dtype}"] if cfg.dtype != "float64" else []
    extra += [f"--seed {cfg.seed}"] if cfg.seed != 0 else []
    try:
        if extra:
            raise ValueError(f"{', '.join(extra)} selects a run whose tables are not committed; --verify compares the "
                             f"committed canonical tables (results/<exp>/, results/quick/<exp>/): drop "
                             f"{', '.join(extra)}")
        size = parse_sample(n)
        commit = _stamp.clean_commit() if stamp else None
    except ValueError as e:
        print(f"run_all.py: error: {e}", file=sys.stderr)
        return 2
    try:
        results = verify(names, cfg, size, echo=echo, results_root=results_root, scales=scales)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM (Interrupted): the temporary cache is gone already
        print(f"run_all.py: --verify interrupted ({e or 'SIGINT'}); its temporary cache was removed, nothing was "
              "stamped", file=sys.stderr)
        return 128 + getattr(e, "signum", 2)
    echo(format_report(results))
    status = exit_status(results)
    if stamp:
        done = [r for r in results if r.status == REPRODUCED]
        status = _stamp.stamp_all(done, results_root or cfg.results_dir, commit, echo) or status
    return status
