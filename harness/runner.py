"""Runner: expand grids -> skip cached cells -> execute the rest (serial | process pool | submitit) -> tables.

Workers write their own cell files (harness.cache), so an interrupted or distributed run resumes by
skipping what exists, and `collect` rebuilds tables, figures and manifests from the cache alone.
Workers receive parameters (a small dict per cell), never tensors.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from . import cache as _cache
from . import grid as _grid
from . import registry as _registry
from .registry import Context, Experiment, MissingData

MEMORY_BUDGET_MB = 8192  # issue 3: a full run_all.py stays under 8 GiB; cells above this are flagged
RESERVED = ("experiment", "cell", "cell_key", "seed", "device", "dtype", "scale")
EXECUTORS = ("serial", "process", "submitit")


@dataclass
class RunConfig:
    """Everything that selects and keys a run (CLI flags map 1:1 onto these)."""

    scale: str = "full"
    seed: int = 0
    dtype: str = "float64"
    device: str = "cpu"  # resolved: cpu | cuda | cuda:N
    results_dir: Path = field(default_factory=lambda: _cache.REPO_ROOT / "results")
    cache_dir: Optional[Path] = None  # default results_dir/cache
    executor: str = "serial"
    jobs: int = 1
    force: bool = False
    overrides: Dict[str, List[Any]] = field(default_factory=dict)
    progress: bool = True
    figures: bool = True
    cluster: Optional[str] = None  # submitit: None -> slurm if sbatch exists else local
    executor_params: Dict[str, Any] = field(default_factory=dict)
    timeout_min: int = 60
    fresh_workers: bool = False  # process executor: one cell per worker process (memory returned between cells)

    def __post_init__(self):
        self.results_dir = Path(self.results_dir)
        self.cache_dir = Path(self.cache_dir) if self.cache_dir else self.results_dir / "cache"
        if self.executor not in EXECUTORS:
            raise ValueError(f"unknown executor {self.executor!r}: use {', '.join(EXECUTORS)}")
        if self.scale not in ("full", "quick", "test"):
            raise ValueError(f"unknown scale {self.scale!r}: use full, quick or test")
        if self.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {self.jobs}")
        if self.dtype not in ("float64", "float32", "float16", "bfloat16"):
            raise ValueError(f"unknown dtype {self.dtype!r}: use float64, float32, float16 or bfloat16")


@dataclass
class CellTask:
    experiment: str
    cell: Dict[str, Any]
    key: str
    label: str
    state: str = "missing"  # cached | missing | corrupt
    note: str = ""


@dataclass
class ExpPlan:
    exp: Experiment
    code: str
    tasks: List[CellTask]


# ------------------------------------------------------------------------------------------------ planning
def select(names: Sequence[str] = (), only: Sequence[str] = ()) -> List[str]:
    """Experiment names from exact names and/or globs (positional and --only); all when none given.

    An exact name that is not registered, or a glob matching nothing, raises KeyError with suggestions."""
    pats = [p for item in list(names) + list(only) for p in str(item).split(",") if p.strip()]
    if not pats:
        return _registry.list_experiments()
    out: List[str] = []
    for p in pats:
        p = p.strip()
        if any(ch in p for ch in "*?["):
            hits = _registry.list_experiments(p)
            if not hits:
                raise KeyError(f"pattern {p!r} matches no experiment. Known: "
                               f"{', '.join(_registry.list_experiments()) or '(none)'}")
        else:
            hits = [_registry.get_experiment(p).name]  # KeyError with close matches
        out += [h for h in hits if h not in out]
    return out


def overrides_for(exp: Experiment, cfg: RunConfig) -> Dict[str, List[Any]]:
    """The --set overrides that apply to this experiment (keys its grid at this scale has)."""
    known = _grid.keys(exp.grid_for(cfg.scale))
    return {k: v for k, v in cfg.overrides.items() if k in known}


def check_overrides(names: Sequence[str], cfg: RunConfig) -> None:
    """Every --set key must belong to at least one selected experiment's grid."""
    known = set()
    for n in names:
        known.update(_grid.keys(_registry.get_experiment(n).grid_for(cfg.scale)))
    bad = [k for k in cfg.overrides if k not in known]
    if bad:
        raise ValueError(f"--set {', '.join(bad)}: no selected experiment has such a grid parameter; "
                         f"known: {', '.join(sorted(known)) or '(none)'}")


def plan(name: str, cfg: RunConfig, verify: bool = True) -> ExpPlan:
    """Cells of one experiment with their keys and cache state (verify: load each file to detect corruption)."""
    exp = _registry.get_experiment(name)
    code = _cache.code_hash(exp)
    store = _cache.CellCache(cfg.cache_dir)
    tasks = []
    for cell in exp.cells(cfg.scale, overrides_for(exp, cfg)):
        key = _cache.cell_key(name, cell, cfg.seed, cfg.dtype, cfg.scale, cfg.device, code)
        t = CellTask(name, cell, key, _grid.cell_label(cell))
        if store.exists(name, key):
            if verify:
                try:
                    store.load(name, key)
                    t.state = "cached"
                except _cache.CorruptCell as e:
                    t.state, t.note = "corrupt", str(e)
            else:
                t.state = "cached"
        tasks.append(t)
    return ExpPlan(exp, code, tasks)


# ------------------------------------------------------------------------------------------------ worker side
def make_spec(exp: Experiment, task: CellTask, cfg: RunConfig, progress: bool) -> Dict[str, Any]:
    """The picklable description of one cell's work (parameters only)."""
    mod = exp.module
    return {
        "experiment": exp.name, "module": mod.__name__, "module_file": getattr(mod, "__file__", None),
        "cell": task.cell, "key": task.key, "label": task.label, "seed": cfg.seed, "dtype": cfg.dtype,
        "scale": cfg.scale, "device": cfg.device, "cache_dir": str(cfg.cache_dir), "progress": progress,
    }


def _resolve(spec: Dict[str, Any]) -> Experiment:
    """The experiment in this (possibly fresh) process: import only its own module (by name, else by file),
    falling back to loading every experiment module."""
    import importlib

    name = spec["experiment"]
    if name not in _registry._REGISTRY:
        mod, mfile = spec.get("module") or "", spec.get("module_file")
        with contextlib.suppress(Exception):
            if mod.startswith("_attnlip_ext_") and mfile:
                _registry.load_module_file(mfile)
            else:
                try:
                    importlib.import_module(mod)
                except ImportError:
                    if not mfile:
                        raise
                    _registry.load_module_file(mfile)
    if name not in _registry._REGISTRY:
        _registry.load_all()
    return _registry.get_experiment(name)


class _RSSSampler:
    """Peak resident memory of this process during a block, sampled every `dt` seconds (psutil)."""

    def __init__(self, dt: float = 0.02):
        self.dt, self.peak, self._stop = dt, 0, threading.Event()
        try:
            import psutil

            self._proc = psutil.Process()
        except ImportError:  # pragma: no cover
            self._proc = None

    def _poll(self):
        while not self._stop.is_set():
            self._sample()
            self._stop.wait(self.dt)

    def _sample(self):
        if self._proc is not None:
            with contextlib.suppress(Exception):
                self.peak = max(self.peak, self._proc.memory_info().rss)

    def __enter__(self):
        self._sample()
        self._t = threading.Thread(target=self._poll, daemon=True)
        self._t.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()
        self._sample()


def _seed_everything(seed: int) -> None:
    """Reset global RNGs before every cell so a cell's result does not depend on execution order."""
    import random

    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        torch.manual_seed(seed)
        threads = os.environ.get("ATTNLIP_THREADS")
        if threads:
            torch.set_num_threads(int(threads))


def _check_rows(rows: Any) -> List[Dict[str, Any]]:
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, dict) for r in rows):
        raise TypeError(f"run() must return a list of dicts (tidy rows), got {type(rows).__name__}")
    for r in rows:
        bad = [k for k in r if k in RESERVED]
        if bad:
            raise ValueError(f"row keys {bad} are reserved for the harness (it adds {', '.join(RESERVED)})")
    return json.loads(_cache.canonical_json(list(rows)))  # fails early on non-JSON values


def run_one(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Compute one cell and write its cache file; returns a status dict (never raises for a cell error)."""
    t0 = time.perf_counter()
    status: Dict[str, Any] = {"experiment": spec["experiment"], "key": spec["key"], "label": spec["label"]}
    try:
        exp = _resolve(spec)
        ctx = Context(device=spec["device"], dtype=spec["dtype"], seed=spec["seed"], scale=spec["scale"],
                      cache_dir=Path(spec["cache_dir"]), progress=spec["progress"])
        _seed_everything(int(spec["seed"]))
        with _RSSSampler() as rss:
            rows = _check_rows(exp.run(dict(spec["cell"]), ctx))
        wall = time.perf_counter() - t0
        meta = {"wall_s": round(wall, 4), "peak_rss_mb": round(rss.peak / 2**20, 1),
                "pid": os.getpid(), "computed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _cache.CellCache(spec["cache_dir"]).save({
            "experiment": spec["experiment"], "key": spec["key"], "cell": spec["cell"], "rows": rows,
            "seed": spec["seed"], "dtype": spec["dtype"], "scale": spec["scale"], "device": spec["device"],
            "meta": meta,
        })
        _failure_log(spec, None)
        status.update(status="ok", **meta, n_rows=len(rows))
    except MissingData as e:
        status.update(status="missing_data", error=f"MissingData: {e}", traceback="",
                      wall_s=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - a failed cell is reported, never cached
        tb = traceback.format_exc()
        _failure_log(spec, tb)
        status.update(status="failed", error=f"{e.__class__.__name__}: {e}", traceback=tb,
                      wall_s=time.perf_counter() - t0)
    return status


def run_cells(specs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Worker entry point (process pool / submitit job): run a chunk of cells in order."""
    return [run_one(s) for s in specs]


def _failure_log(spec: Dict[str, Any], tb: Optional[str]) -> None:
    p = Path(spec["cache_dir"]) / "failures" / spec["experiment"] / f"{spec['key']}.txt"
    if tb is None:
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
    else:
        with contextlib.suppress(OSError):
            _cache.atomic_write_text(p, f"{spec['label']}\n{tb}")


# ------------------------------------------------------------------------------------------------ executors
def _pbar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="cell", disable=not enabled or total == 0, dynamic_ncols=True,
                file=sys.stderr)


def _worker_init(threads: int) -> None:
    os.environ["ATTNLIP_THREADS"] = os.environ.get("ATTNLIP_THREADS") or str(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(threads))


def execute(specs: List[Dict[str, Any]], cfg: RunConfig, desc: str = "cells") -> List[Dict[str, Any]]:
    """Run cell specs with the configured executor; one status dict per spec (order not guaranteed)."""
    if not specs:
        return []
    if cfg.executor == "serial":
        out = []
        with _pbar(len(specs), desc, cfg.progress) as bar:
            for s in specs:
                bar.set_postfix_str(s["label"][:40], refresh=False)
                out.append(run_one(s))
                bar.update()
        return out
    threads = max(1, (os.cpu_count() or 1) // cfg.jobs)
    if cfg.executor == "process":
        return _execute_pool(specs, cfg, desc, threads)
    return _execute_submitit(specs, cfg, desc, threads)


def _lost(spec: Dict[str, Any], why: str) -> Dict[str, Any]:
    return {"experiment": spec["experiment"], "key": spec["key"], "label": spec["label"], "status": "failed",
            "error": why, "traceback": why}


def _execute_pool(specs, cfg: RunConfig, desc: str, threads: int):
    """Process pool with recovery: when a worker dies (the OS killed it, e.g. out of memory), every unfinished
    cell of that pool is lost with it. Those are retried once in fresh worker processes (one cell per process,
    so memory is returned between cells), then one at a time, each alone in its pool; a cell that kills its
    worker even alone is reported failed. Cells already computed are in the cache either way."""
    out: List[Dict[str, Any]] = []
    with _pbar(len(specs), desc, cfg.progress) as bar:
        lost = _pool_round(specs, cfg.jobs, threads, cfg.fresh_workers, out, bar)
        if lost:
            print(f"warning: a worker process died (killed by the OS: out of memory?) with {len(lost)} cell(s) "
                  f"unfinished; retrying them in fresh worker processes", file=sys.stderr)
            lost = _pool_round(lost, cfg.jobs, threads, True, out, bar)
        if lost:
            print(f"warning: a worker died again; running the {len(lost)} remaining cell(s) one at a time",
                  file=sys.stderr)
            for s in lost:
                if _pool_round([s], 1, threads, True, out, bar):
                    out.append(_lost(s, "worker process died even running this cell alone (killed by the OS: "
                                        "out of memory? see `dmesg`); lower its size or run with more memory"))
                    bar.update()
    return out


def _pool_round(specs, jobs: int, threads: int, fresh: bool, out: List[Dict[str, Any]], bar) -> List[Dict[str, Any]]:
    """Run specs in one spawn pool, appending statuses to out; returns the specs lost with a dead worker.

    fresh: one cell per worker process (max_tasks_per_child=1)."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    lost = []
    kw = {"max_tasks_per_child": 1} if fresh else {}
    with ProcessPoolExecutor(max_workers=min(jobs, len(specs)), mp_context=mp.get_context("spawn"),
                             initializer=_worker_init, initargs=(threads,), **kw) as pool:
        futs = {pool.submit(run_one, s): s for s in specs}
        for f in as_completed(futs):
            try:
                out.append(f.result())
            except BrokenProcessPool:  # the worker died (killed by the OS), not the cell code: retried by the caller
                lost.append(futs[f])
                continue
            except Exception as e:  # noqa: BLE001 - e.g. a spec that cannot be sent to the worker
                out.append(_lost(futs[f], f"cell could not run in a worker: {e.__class__.__name__}: {e}"))
            bar.update()
    return lost


def _execute_submitit(specs, cfg: RunConfig, desc: str, threads: int):
    import submitit
    from submitit.helpers import as_completed

    cluster = cfg.cluster or ("slurm" if shutil.which("sbatch") else "local")
    folder = Path(cfg.cache_dir) / "submitit" / "%j"
    ex = submitit.AutoExecutor(folder=folder, cluster=cluster)
    params = {"timeout_min": cfg.timeout_min, **cfg.executor_params}
    if cluster == "slurm":
        params.setdefault("slurm_array_parallelism", cfg.jobs)
        params.setdefault("cpus_per_task", threads)
        chunks = [[s] for s in specs]  # a job array: one task per cell
    else:  # local/debug launch every job at once: cap concurrency at --jobs by chunking
        n = min(cfg.jobs, len(specs))
        chunks = [specs[i::n] for i in range(n)]
    ex.update_parameters(**params)
    env_before = os.environ.get("ATTNLIP_THREADS")
    os.environ["ATTNLIP_THREADS"] = env_before or str(threads)  # inherited by local jobs
    try:
        jobs = ex.map_array(run_cells, chunks)
    finally:
        if env_before is None:
            os.environ.pop("ATTNLIP_THREADS", None)
        else:
            os.environ["ATTNLIP_THREADS"] = env_before
    by_job = {id(j): c for j, c in zip(jobs, chunks)}
    out = []
    with _pbar(len(specs), desc, cfg.progress) as bar:
        for job in as_completed(jobs, poll_frequency=0.2):
            try:
                res = job.result()
            except Exception as e:  # job crashed / was killed: its cells count as failed unless cached
                res = [_lost(s, f"submitit job {job.job_id} failed: {e}") for s in by_job[id(job)]]
            out += res
            bar.update(len(res))
    return out


# ------------------------------------------------------------------------------------------------ collect
def load_rows(p: ExpPlan, cfg: RunConfig) -> List[Dict[str, Any]]:
    """Tidy rows of every cached cell in the plan, with the harness columns added."""
    store = _cache.CellCache(cfg.cache_dir)
    rows: List[Dict[str, Any]] = []
    for t in p.tasks:
        try:
            rec = store.load(t.experiment, t.key)
        except (FileNotFoundError, _cache.CorruptCell):
            continue
        for r in rec["rows"]:
            row = {"experiment": t.experiment, "cell": t.label}
            row.update({k: v for k, v in t.cell.items() if k not in r})
            row.update(r)
            row.update(seed=cfg.seed, device=_cache.device_kind(cfg.device), dtype=cfg.dtype, scale=cfg.scale,
                       cell_key=t.key[:12])
            rows.append(row)
    return rows


def to_table(rows: List[Dict[str, Any]]):
    """DataFrame with harness columns first/last and params/values in first-seen order."""
    import pandas as pd

    order: List[str] = []
    for r in rows:
        order += [k for k in r if k not in order]
    head = ["experiment", "cell"]
    tail = ["seed", "device", "dtype", "scale", "cell_key"]
    cols = head + [c for c in order if c not in head + tail] + tail
    return pd.DataFrame(rows, columns=cols)


def _parquet_bytes(df) -> bytes:
    """Parquet of the table; object columns mixing types are written as strings."""
    import pandas as pd

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


def write_outputs(p: ExpPlan, cfg: RunConfig, statuses: Optional[Dict[str, Dict]] = None,
                  started: Optional[float] = None) -> Dict[str, Any]:
    """Write results/<exp>/table.csv, table.parquet, figures/, manifest.json from the cache; returns a report."""
    from . import manifest as _manifest

    exp, name = p.exp, p.exp.name
    outdir = Path(cfg.results_dir) / name
    rows = load_rows(p, cfg)
    store = _cache.CellCache(cfg.cache_dir)
    report: Dict[str, Any] = {"experiment": name, "rows": len(rows), "figures": [], "figure_error": None}
    if not rows:
        report["skipped"] = "no cached cells"
        return report
    table = to_table(rows)
    outdir.mkdir(parents=True, exist_ok=True)
    _cache.atomic_write_text(outdir / "table.csv", table.to_csv(index=False))
    _cache.atomic_write_bytes(outdir / "table.parquet", _parquet_bytes(table))
    figdir = outdir / "figures"
    if cfg.figures:
        figdir.mkdir(exist_ok=True)
        for old in list(figdir.glob("*.png")) + list(figdir.glob("*.pdf")):
            old.unlink()
        try:
            import matplotlib

            matplotlib.use("Agg")
            paths = exp.figures(table.copy(), figdir) or []
            report["figures"] = [str(Path(x).relative_to(outdir)) if Path(x).is_absolute() and
                                 Path(x).is_relative_to(outdir) else str(x) for x in paths]
        except Exception as e:  # noqa: BLE001 - reported, run continues
            report["figure_error"] = f"{e.__class__.__name__}: {e}\n{traceback.format_exc()}"
    cells = []
    for t in p.tasks:
        entry = {"cell": t.label, "key": t.key, "params": t.cell}
        try:
            rec = store.load(name, t.key)
            entry.update(status="ok", n_rows=len(rec["rows"]), **rec.get("meta", {}))
        except (FileNotFoundError, _cache.CorruptCell):
            st = (statuses or {}).get(t.key, {})
            entry.update(status=st.get("status", "missing"), error=st.get("error"))
        cells.append(entry)
    walls = [c.get("wall_s", 0) or 0 for c in cells]
    rss = [c.get("peak_rss_mb", 0) or 0 for c in cells]
    man = {
        "experiment": name,
        "figures_ref": list(exp.figures_ref),
        "description": (exp.description or (type(exp).__doc__ or "")).strip().split("\n")[0],
        "version": exp.VERSION,
        "code_hash": p.code,
        "scale": cfg.scale, "seed": cfg.seed, "dtype": cfg.dtype,
        "grid": exp.grid_for(cfg.scale), "overrides": overrides_for(exp, cfg),
        "created": _manifest.now_utc(),
        **_manifest.environment(cfg.device),
        "complete": all(c["status"] == "ok" for c in cells),
        "n_cells": len(cells), "n_rows": len(rows),
        "total_cell_wall_s": round(sum(walls), 3),
        "max_cell_peak_rss_mb": round(max(rss), 1) if rss else None,
        "run_wall_s": round(time.perf_counter() - started, 3) if started else None,
        "runner_peak_rss_mb": {k: round(v, 1) for k, v in _manifest.peak_rss_mb().items()},
        "figures": report["figures"],
        "cells": cells,
    }
    _cache.atomic_write_text(outdir / "manifest.json", json.dumps(man, indent=1, default=str) + "\n")
    report["table"] = table
    return report


# ------------------------------------------------------------------------------------------------ driver
@dataclass
class ExpResult:
    name: str
    n_cells: int
    computed: int = 0
    cached: int = 0
    failed: int = 0
    missing_data: int = 0
    corrupt: int = 0
    missing: int = 0  # --collect: cells not in the cache
    wall_s: float = 0.0
    errors: List[Dict[str, Any]] = field(default_factory=list)
    figure_error: Optional[str] = None
    output: Optional[Dict[str, Any]] = None

    def line(self) -> str:
        extra = f", {self.missing_data} missing data" if self.missing_data else ""
        extra += f", {self.corrupt} corrupt->recomputed" if self.corrupt else ""
        extra += f", {self.missing} missing (not computed)" if self.missing else ""
        extra += ", FIGURES FAILED" if self.figure_error else ""
        return (f"{self.name}: {self.n_cells} cells: {self.computed} computed, {self.cached} cached, "
                f"{self.failed} failed{extra} [{self.wall_s:.1f}s]")

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.missing == 0 and not self.figure_error


def run(names: Sequence[str], cfg: RunConfig, collect_only: bool = False, echo=print) -> List[ExpResult]:
    """Plan, execute missing cells (all experiments' cells share one executor batch), write outputs."""
    check_overrides(names, cfg)
    inside = Path(cfg.cache_dir).resolve().is_relative_to(Path(cfg.results_dir).resolve())
    removed = [] if inside else _cache.clean_stale_tmp(cfg.cache_dir)
    removed += _cache.clean_stale_tmp(cfg.results_dir)
    if removed:
        echo(f"removed {len(removed)} stale temp file(s) left by killed writers")
    store = _cache.CellCache(cfg.cache_dir)
    results: Dict[str, ExpResult] = {}
    plans: Dict[str, ExpPlan] = {}
    todo: List[Dict[str, Any]] = []
    t_start: Dict[str, float] = {}
    for n in names:
        t_start[n] = time.perf_counter()
        p = plans[n] = plan(n, cfg)
        r = results[n] = ExpResult(n, len(p.tasks))
        for t in p.tasks:
            if t.state == "corrupt":
                r.corrupt += 1
                echo(f"warning: {n} [{t.label}]: corrupt cache file, recomputing: {t.note}")
                store.remove(n, t.key)
            if t.state == "cached" and not cfg.force:
                r.cached += 1
            elif not collect_only:
                todo.append(make_spec(p.exp, t, cfg, progress=cfg.progress and cfg.executor == "serial"))
    statuses: Dict[str, Dict] = {}

    def finish(n: str) -> None:
        r, p = results[n], plans[n]
        for t in p.tasks:
            st = statuses.get(t.key)
            if st is None:
                continue
            if st["status"] == "ok":
                r.computed += 1
            elif st["status"] == "missing_data":
                r.missing_data += 1
                r.errors.append(st)
            else:
                r.failed += 1
                r.errors.append(st)
        if collect_only:
            r.missing = sum(1 for t in p.tasks if t.state != "cached")
        try:
            out = write_outputs(p, cfg, statuses, started=t_start[n])
        except Exception as e:  # noqa: BLE001 - e.g. a table that cannot be written; reported, run goes on
            out = {"figure_error": f"writing outputs failed: {e.__class__.__name__}: {e}\n{traceback.format_exc()}"}
        r.output = out
        r.figure_error = out.get("figure_error")
        r.wall_s = time.perf_counter() - t_start[n]
        echo(r.line())
        for t in p.tasks:
            mb = (statuses.get(t.key) or {}).get("peak_rss_mb") or 0
            if mb > MEMORY_BUDGET_MB:
                echo(f"warning: {n} [{t.label}]: peak RSS {mb:.0f} MiB exceeds the {MEMORY_BUDGET_MB} MiB budget")

    if cfg.executor == "serial":  # experiment by experiment: outputs appear as soon as one is done
        for n in names:
            g = [s for s in todo if s["experiment"] == n]
            if g:
                t_start[n] = time.perf_counter()
                for st in execute(g, cfg, desc=n):
                    statuses[st["key"]] = st
            finish(n)
    else:  # one batch over all experiments keeps every worker busy
        for st in execute(todo, cfg, desc=f"{len(names)} experiment(s)"):
            statuses[st["key"]] = st
        for n in names:
            finish(n)
    from . import report as _report

    try:
        _report.write_readme(cfg.results_dir)
    except Exception as e:  # noqa: BLE001
        echo(f"warning: could not write {cfg.results_dir / 'README.md'}: {e.__class__.__name__}: {e}")
    return list(results.values())


def format_errors(results: Sequence[ExpResult], full: bool = True) -> str:
    """The errors of a run: the first traceback per experiment in full, the rest one line each."""
    lines: List[str] = []
    for r in results:
        for i, e in enumerate(r.errors):
            head = f"[{r.name}] cell {e['label']}: {e.get('error')}"
            if full and i == 0 and e.get("traceback"):
                lines += [head, e["traceback"].rstrip()]
            else:
                lines.append(head)
        if r.figure_error:
            lines.append(f"[{r.name}] figures: {r.figure_error.rstrip()}")
    return "\n".join(lines)
