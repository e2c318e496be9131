"""Worker side: compute one cell in this process and write its cache file (parameters in, never tensors).

The context a cell sees (dtype, device, threads, seed) is set here, once, for every experiment; RNGs are reset
before every cell so a cell's rows do not depend on execution order. A cell claimed by another live runner is
left to it ("claimed"). Pool workers exit when the runner that started them dies (no orphans)."""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Dict, List, Optional

from .. import config as _config
from .. import process as _process
from .. import catalog as _catalog
from ..errors import MissingData, PluginError, UnsupportedContext
from ..context import Context, seed_everything
from ..catalog import Experiment
from ..store import claims as _claims
from ..store.atomic import atomic_write_text, canonical_json, os_error_line
from ..store.cells import CellCache, CellRecord
from . import discovery as _discovery
from .specs import CellSpec, CellStatus, status_of

RESERVED = ("experiment", "cell", "cell_key", "seed", "device", "dtype", "scale")


def make_spec(exp: Experiment, task, cfg, progress: bool) -> CellSpec:
    """The description of one cell's work (parameters only) that a worker receives."""
    mod = exp.module
    return CellSpec(
        experiment=exp.name, module=mod.__name__, module_file=getattr(mod, "__file__", None),
        cell=task.cell, key=task.key, label=task.label, seed=cfg.seed, dtype=cfg.dtype,
        scale=cfg.scale, device=cfg.device, cache_dir=str(cfg.cache_dir), progress=progress,
        threads=cfg.threads, model_source=task.model_source, data_source=task.data_source,
        force=bool(cfg.force),
        bounds=list(cfg.bounds) if exp.accepts_bounds else [],  # else via the plugins grid key
    )


def _resolve(spec: CellSpec) -> Experiment:
    """The experiment in this (possibly fresh) process: import only its own module (by name, else by file),
    falling back to loading every experiment module."""
    import importlib

    name = spec.experiment
    if name not in _catalog._REGISTRY:
        mod, mfile = spec.module or "", spec.module_file
        with contextlib.suppress(Exception):
            if mod.startswith("_attnlip_ext_") and mfile:
                _discovery.load_module_file(mfile)
            else:
                try:
                    importlib.import_module(mod)
                except ImportError:
                    if not mfile:
                        raise
                    _discovery.load_module_file(mfile)
    return _discovery.get_experiment(name)  # every experiment module when its own did not register it


class RSSSampler:
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


def check_rows(rows: Any) -> List[Dict[str, Any]]:
    if not isinstance(rows, (list, tuple)) or not all(isinstance(r, dict) for r in rows):
        raise TypeError(f"run() must return a list of dicts (tidy rows), got {type(rows).__name__}")
    if not rows:
        raise ValueError("run() returned no rows: every cell yields at least one (a cell file without rows is "
                         "treated as corrupt)")
    for r in rows:
        bad = [k for k in r if k in RESERVED]
        if bad:
            raise ValueError(f"row keys {bad} are reserved for the harness (it adds {', '.join(RESERVED)})")
    return json.loads(canonical_json(list(rows)))  # fails early on non-JSON values


def run_one(spec: CellSpec) -> CellStatus:
    """Compute one cell and write its cache file; returns its status (never raises for a cell error)."""
    t0 = time.perf_counter()
    claim = _claims.try_claim(spec.cache_dir, spec.experiment, spec.key)
    if claim is None:
        return status_of(spec, "claimed", error="being computed by another runner", wall_s=0.0)
    if not spec.force and _done_meanwhile(spec):  # another runner finished it since this one planned
        claim.release()
        return status_of(spec, "elsewhere", wall_s=0.0)
    try:
        exp = _resolve(spec)
        exp.check_context(spec.dtype, spec.device)
        threads = _config.apply_threads(spec.threads)
        _register_plugins(spec.bounds or [])
        ctx = Context(device=spec.device, dtype=spec.dtype, seed=spec.seed, scale=spec.scale,
                      cache_dir=Path(spec.cache_dir), progress=spec.progress, threads=threads)
        seed_everything(int(spec.seed))
        _process.retain_freed_memory()  # the cell reuses the blocks it frees (process.py); given back after it
        with _RSS() as rss:
            rows = check_rows(exp.run(dict(spec.cell), ctx))
        wall = time.perf_counter() - t0
        meta = {"wall_s": round(wall, 4), "peak_rss_mb": round(rss.peak / 2**20, 1), "threads": threads,
                "pid": os.getpid(), "computed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        record = CellRecord(experiment=spec.experiment, key=spec.key, cell=spec.cell, rows=rows,
                            seed=spec.seed, dtype=spec.dtype, scale=spec.scale, device=spec.device,
                            model_source=spec.model_source, data_source=spec.data_source, meta=meta)
        try:
            CellCache(spec.cache_dir).save(record)
            cache = {"cached": True}
        except OSError as e:  # read-only or full cache: the rows are still reported, with the real cause
            cache = {"cached": False, "cache_error": os_error_line(e, spec.cache_dir), "record": record}
        _failure_log(spec, None)
        status = status_of(spec, "ok", **cache, **meta, n_rows=len(rows))
    except (UnsupportedContext, PluginError) as e:  # a stated reason (a user's plug-in): one line, no traceback
        status = status_of(spec, "failed", error=f"{e.__class__.__name__}: {e}", traceback="",
                           wall_s=time.perf_counter() - t0)
    except MissingData as e:
        status = status_of(spec, "missing_data", error=f"MissingData: {e}", traceback="",
                           fix=getattr(e, "fix", ""), wall_s=time.perf_counter() - t0)
    except Exception as e:  # noqa: BLE001 - a failed cell is reported, never cached
        tb = traceback.format_exc()
        _failure_log(spec, tb)
        status = status_of(spec, "failed", error=f"{e.__class__.__name__}: {e}", traceback=tb,
                           wall_s=time.perf_counter() - t0)
    finally:
        claim.release()
        _process.release_freed_memory()  # the next cell's peak RSS starts from what this process holds, not ours
    return status


_RSS = RSSSampler


_PLUGINS: set = set()  # names of the plug-ins this process registered for its previous cell


def _register_plugins(specs: List[str]) -> None:
    """Register exactly this cell's --bound plug-ins in this (possibly fresh or reused) process, as each function's
    attributes declare it (registry.register_plugin: bound_name, scope, bounds, residual, paper); plug-ins an
    earlier cell registered here and this one does not name are removed (a cell evaluates what its key says)."""
    if not specs and not _PLUGINS:
        return
    from ..bounds import registry as _bounds

    names = {b.name for spec in specs for b in _bounds.register_plugin(spec, replace=True)}
    for stale in _PLUGINS - names:
        if stale in _bounds.bound_names():
            _bounds.unregister_bound(stale)
    _PLUGINS.clear()
    _PLUGINS.update(names)


def _done_meanwhile(spec: CellSpec) -> bool:
    from ..store.cells import CorruptCell

    try:
        CellCache(spec.cache_dir).load(spec.experiment, spec.key)
        return True
    except (FileNotFoundError, CorruptCell):
        return False


def run_sent(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Worker entry point of a process pool: one cell spec as sent (CellSpec.to_dict), its status as a dict."""
    return run_one(CellSpec.from_dict(spec)).to_dict()


def run_cells(specs: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Worker entry point of a submitit job: a chunk of cell specs as sent, run in order; statuses as dicts."""
    return [run_sent(s) for s in specs]


def _failure_log(spec: CellSpec, tb: Optional[str]) -> None:
    p = Path(spec.cache_dir) / "failures" / spec.experiment / f"{spec.key}.txt"
    if tb is None:
        with contextlib.suppress(OSError):
            p.unlink()
    else:
        with contextlib.suppress(OSError):
            atomic_write_text(p, f"{spec.label}\n{tb}")


def worker_init(threads: int, parent_pid: Optional[int] = None) -> None:
    """Pool worker start-up: thread count, SIGINT ignored (Ctrl-C in a terminal reaches every process of the group:
    the runner alone handles it and ends its workers), and a watchdog that exits this worker when its parent dies."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ[_config.THREADS_ENV] = os.environ.get(_config.THREADS_ENV) or str(threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    os.environ.setdefault("MKL_NUM_THREADS", str(threads))
    if parent_pid is not None:
        threading.Thread(target=_watch_parent, args=(parent_pid,), daemon=True).start()


def _watch_parent(parent_pid: int, dt: float = 1.0) -> None:
    """Exit (without cleanup of queued work) as soon as the runner is gone: re-parented or its pid dead."""
    while True:
        time.sleep(dt)
        if os.getppid() != parent_pid:
            os._exit(3)
