"""Executors: run cell specs serially, in a local spawn pool (with recovery from dead workers), or via submitit.

Pool workers watch their parent and exit when it dies, so `kill -9` of a runner leaves no orphan workers."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List

from .. import config as _config
from .worker import run_cells, run_one, worker_init


def _pbar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="cell", disable=not enabled or total == 0, dynamic_ncols=True,
                file=sys.stderr)


def threads_per_worker(cfg) -> int:
    return cfg.threads or max(1, (os.cpu_count() or 1) // cfg.jobs)


def execute(specs: List[Dict[str, Any]], cfg, desc: str = "cells") -> List[Dict[str, Any]]:
    """Run cell specs with the configured executor; one status dict per spec (order not guaranteed)."""
    if not specs:
        return []
    if cfg.executor == "serial":
        out = []
        if cfg.threads:
            _config.apply_threads(cfg.threads)
        with _pbar(len(specs), desc, cfg.progress) as bar:
            for s in specs:
                bar.set_postfix_str(s["label"][:40], refresh=False)
                out.append(run_one(s))
                bar.update()
        return out
    threads = threads_per_worker(cfg)
    specs = [dict(s, threads=threads) for s in specs]
    if cfg.executor == "process":
        return _execute_pool(specs, cfg, desc, threads)
    return _execute_submitit(specs, cfg, desc, threads)


def lost(spec: Dict[str, Any], why: str) -> Dict[str, Any]:
    return {"experiment": spec["experiment"], "key": spec["key"], "label": spec["label"], "status": "failed",
            "error": why, "traceback": why}


def _execute_pool(specs, cfg, desc: str, threads: int):
    """Process pool with recovery: when a worker dies (the OS killed it, e.g. out of memory), every unfinished
    cell of that pool is lost with it. Those are retried once in fresh worker processes (one cell per process),
    then one at a time, each alone in its pool; a cell that kills its worker even alone is reported failed."""
    out: List[Dict[str, Any]] = []
    with _pbar(len(specs), desc, cfg.progress) as bar:
        dead = _pool_round(specs, cfg.jobs, threads, cfg.fresh_workers, out, bar)
        if dead:
            print(f"warning: a worker process died (killed by the OS: out of memory?) with {len(dead)} cell(s) "
                  f"unfinished; retrying them in fresh worker processes", file=sys.stderr)
            dead = _pool_round(dead, cfg.jobs, threads, True, out, bar)
        if dead:
            print(f"warning: a worker died again; running the {len(dead)} remaining cell(s) one at a time",
                  file=sys.stderr)
            for s in dead:
                if _pool_round([s], 1, threads, True, out, bar):
                    out.append(lost(s, "worker process died even running this cell alone (killed by the OS: "
                                       "out of memory? see `dmesg`); lower its size or run with more memory"))
                    bar.update()
    return out


def _pool_round(specs, jobs: int, threads: int, fresh: bool, out: List[Dict[str, Any]], bar) -> List[Dict[str, Any]]:
    """Run specs in one spawn pool, appending statuses to out; returns the specs lost with a dead worker."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    dead = []
    kw = {"max_tasks_per_child": 1} if fresh else {}
    with ProcessPoolExecutor(max_workers=min(jobs, len(specs)), mp_context=mp.get_context("spawn"),
                             initializer=worker_init, initargs=(threads, os.getpid()), **kw) as pool:
        futs = {pool.submit(run_one, s): s for s in specs}
        for f in as_completed(futs):
            try:
                out.append(f.result())
            except BrokenProcessPool:  # the worker died (killed by the OS), not the cell code: retried by the caller
                dead.append(futs[f])
                continue
            except Exception as e:  # noqa: BLE001 - e.g. a spec that cannot be sent to the worker
                out.append(lost(futs[f], f"cell could not run in a worker: {e.__class__.__name__}: {e}"))
            bar.update()
    return dead


def _execute_submitit(specs, cfg, desc: str, threads: int):
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
    jobs = ex.map_array(run_cells, chunks)
    by_job = {id(j): c for j, c in zip(jobs, chunks)}
    out = []
    with _pbar(len(specs), desc, cfg.progress) as bar:
        for job in as_completed(jobs, poll_frequency=0.2):
            try:
                res = job.result()
            except Exception as e:  # job crashed / was killed: its cells count as failed unless cached
                res = [lost(s, f"submitit job {job.job_id} failed: {e}") for s in by_job[id(job)]]
            out += res
            bar.update(len(res))
    return out
