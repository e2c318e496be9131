"""Executors: run cell specs serially, in a local spawn pool (with recovery from dead workers), or via submitit.

Pool workers watch their parent and exit when it dies, so `kill -9` of a runner leaves no orphan workers.
On Slurm, the controller is asked before anything is submitted (a clear error when none answers), and job states
come from `squeue`, so a cancelled, timed-out or killed job is reported even on clusters without accounting
(where submitit's `sacct` fails and would wait for its result forever)."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

from .. import config as _config
from ..errors import AttnLipError
from .specs import CellSpec, CellStatus, lost
from .worker import run_cells, run_one, run_sent, worker_init

SLURM_PROBE_TIMEOUT_S = 15.0  # how long `sinfo` may take before the cluster counts as not answering
SLURM_POLL_S = 2.0  # how often `squeue` is asked for job states while waiting
SLURM_GRACE_S = 5.0  # an ended job's result file may appear this much later (shared file systems)
SLURM_ACTIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_FED",
                "REQUEUE_HOLD", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "PREEMPTED"}
SLURM_FIX = ("start Slurm (on one machine, as root: .ci/slurm-up.sh; elsewhere ask the cluster's admins), or set "
             "SLURM_CONF to the cluster's slurm.conf, or run on this machine instead: --cluster local, or "
             "--executor process -j N")


class ClusterUnavailable(AttnLipError, RuntimeError):
    """The Slurm executor was asked for but no Slurm controller answers; raised before anything is submitted."""


def _pbar(total: int, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="cell", disable=not enabled or total == 0, dynamic_ncols=True,
                file=sys.stderr)


def _cluster(cfg) -> str:
    return cfg.cluster or ("slurm" if shutil.which("sbatch") else "local")


def threads_per_worker(cfg) -> int:
    """--threads, else the thread policy's count for --jobs workers on this machine (harness.config.thread_count:
    $ATTNLIP_THREADS / $OMP_NUM_THREADS, else the free cores shared by the workers). A Slurm job gets its own
    cores, whatever the load of the submitting machine: cores // jobs of one node (its cpus_per_task)."""
    if cfg.executor == "submitit" and _cluster(cfg) == "slurm":
        return cfg.threads or max(1, (os.cpu_count() or 1) // cfg.jobs)
    return _config.thread_count(cfg.threads, cfg.jobs)


def execute(specs: List[CellSpec], cfg, desc: str = "cells") -> List[CellStatus]:
    """Run cell specs with the configured executor; one status per spec (order not guaranteed)."""
    if not specs:
        return []
    if cfg.executor == "serial":  # in this process: the caller's thread count is given back afterwards
        import torch

        out, before = [], torch.get_num_threads()
        _config.apply_threads(threads_per_worker(cfg))
        try:
            with _pbar(len(specs), desc, cfg.progress) as bar:
                for s in specs:
                    bar.set_postfix_str(s.label[:40], refresh=False)
                    out.append(run_one(s))
                    bar.update()
        finally:
            torch.set_num_threads(before)
        return out
    threads = threads_per_worker(cfg)
    specs = [s.but(threads=threads) for s in specs]
    if cfg.executor == "process":
        return _execute_pool(specs, cfg, desc, threads)
    return _execute_submitit(specs, cfg, desc, threads)


def _execute_pool(specs: List[CellSpec], cfg, desc: str, threads: int) -> List[CellStatus]:
    """Process pool with recovery: when a worker dies (the OS killed it, e.g. out of memory), every unfinished
    cell of that pool is lost with it. Those are retried once in fresh worker processes (one cell per process),
    then one at a time, each alone in its pool; a cell that kills its worker even alone is reported failed."""
    out: List[CellStatus] = []
    with _pbar(len(specs), desc, cfg.progress) as bar:
        dead = _pool_round(specs, cfg.jobs, threads, cfg.fresh_workers, out, bar)
        retried = {s.key for s in dead}
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
    return [_own(st, retried) for st in out]


def _own(st: CellStatus, retried: set) -> CellStatus:
    """A retried cell found done ("elsewhere") was finished by this run's own worker: a pool that breaks fails every
    unfinished future, including those whose worker had written the cell file and was sending its result. It was
    computed here, and is counted so."""
    if st.status == "elsewhere" and st.key in retried:
        return dataclasses.replace(st, status="ok")
    return st


def _pool_round(specs: List[CellSpec], jobs: int, threads: int, fresh: bool, out: List[CellStatus], bar
                ) -> List[CellSpec]:
    """Run specs in one spawn pool, appending statuses to out; returns the specs lost with a dead worker."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from concurrent.futures.process import BrokenProcessPool

    dead = []
    kw = {"max_tasks_per_child": 1} if fresh else {}
    pool = ProcessPoolExecutor(max_workers=min(jobs, len(specs)), mp_context=mp.get_context("spawn"),
                               initializer=worker_init, initargs=(threads, os.getpid()), **kw)
    try:
        futs = {pool.submit(run_sent, s.to_dict()): s for s in specs}  # plain dicts across the boundary
        for f in as_completed(futs):
            try:
                out.append(CellStatus.from_dict(f.result()))
            except BrokenProcessPool:  # the worker died (killed by the OS), not the cell code: retried by the caller
                dead.append(futs[f])
                continue
            except Exception as e:  # noqa: BLE001 - e.g. a spec that cannot be sent to the worker
                out.append(lost(futs[f], f"cell could not run in a worker: {e.__class__.__name__}: {e}"))
            bar.update()
    except KeyboardInterrupt:
        stop_pool(pool)
        raise
    except BaseException:
        pool.shutdown(wait=True)
        raise
    pool.shutdown(wait=True)
    return dead


def stop_pool(pool) -> None:
    """Ctrl-C: cancel the cells not started and end the workers now (they ignore SIGINT, worker_init); a cell they
    were computing is not written (cell files are written whole or not at all), its claim and temp files are
    removed by the runner (harness.run.runner)."""
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(Exception):
            p.terminate()
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)


def check_slurm(timeout_s: Optional[float] = None) -> str:
    """Ask the Slurm controller (`sinfo`) whether it answers; ClusterUnavailable with the cause and the fix if not.

    Returns a warning (empty when none): a cluster that answers but has no usable node runs nothing."""
    timeout_s = SLURM_PROBE_TIMEOUT_S if timeout_s is None else timeout_s
    missing = [c for c in ("sbatch", "sinfo", "squeue", "scancel") if shutil.which(c) is None]
    if missing:
        raise ClusterUnavailable(f"--cluster slurm needs the Slurm commands, but {', '.join(missing)} "
                                 f"{'is' if len(missing) == 1 else 'are'} not on PATH. Fix: {SLURM_FIX}")
    try:
        p = subprocess.run(["sinfo", "-h", "-o", "%P|%a|%T|%D"], capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise ClusterUnavailable(f"no Slurm cluster answers: `sinfo` got no reply within {timeout_s:.0f} s (the "
                                 f"controller slurmctld is down or unreachable). Fix: {SLURM_FIX}") from None
    except OSError as e:
        raise ClusterUnavailable(f"no Slurm cluster answers: `sinfo` could not run ({e}). Fix: {SLURM_FIX}") from None
    if p.returncode != 0:
        why = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        raise ClusterUnavailable(f"`sbatch` is on PATH but no Slurm cluster answers: `sinfo` failed ({why}). "
                                 f"Fix: {SLURM_FIX}")
    rows = [line.split("|") for line in p.stdout.splitlines() if line.count("|") == 3]
    if not rows:
        raise ClusterUnavailable(f"the Slurm cluster answers but has no partition (`sinfo` listed none). "
                                 f"Fix: {SLURM_FIX}")
    usable = [r for r in rows if r[1] == "up" and r[2].rstrip("*~#!%$@^-") in ("idle", "mixed", "allocated",
                                                                                "completing")]
    if not usable:
        states = ", ".join(sorted({f"{r[0]} {r[1]} {r[2]}" for r in rows}))
        return (f"warning: no Slurm node is usable now ({states}): submitted jobs wait until one is "
                f"(`sinfo -R` says why nodes are down)")
    return ""


def slurm_states(job_ids: List[str]) -> Optional[Dict[str, str]]:
    """State of every task of these Slurm jobs, e.g. {"12_0": "COMPLETED", "12_1": "RUNNING"} (array tasks one by
    one); a task missing from the answer has left the controller's memory. None when `squeue` does not answer."""
    base = sorted({j.split("_")[0] for j in job_ids})
    try:
        p = subprocess.run(["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T", "-j", ",".join(base)],
                           capture_output=True, text=True, timeout=SLURM_PROBE_TIMEOUT_S)
    except (subprocess.TimeoutExpired, OSError):
        return None
    if p.returncode != 0 and "Invalid job id" not in p.stderr:  # all jobs long gone: no states, not an error
        return None
    return dict(line.strip().split("|", 1) for line in p.stdout.splitlines() if "|" in line)


def _execute_submitit(specs: List[CellSpec], cfg, desc: str, threads: int) -> List[CellStatus]:
    import submitit

    cluster = _cluster(cfg)
    if cluster == "slurm":
        warning = check_slurm()
        if warning:
            print(warning, file=sys.stderr)
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
    jobs = ex.map_array(run_cells, [[s.to_dict() for s in c] for c in chunks])  # plain dicts across the boundary
    try:
        with _pbar(len(specs), desc, cfg.progress) as bar:
            return _collect(list(zip(jobs, chunks)), cluster == "slurm", bar)
    except KeyboardInterrupt:  # Ctrl-C: the jobs still running are cancelled, not left to finish unseen
        for job in jobs:
            with contextlib.suppress(Exception):
                job.cancel(check=False)
        raise


def _result(job, chunk: List[CellSpec]) -> List[CellStatus]:
    try:
        return [CellStatus.from_dict(d) for d in job.result()]
    except Exception as e:  # noqa: BLE001 - job crashed / was killed: its cells count as failed unless cached
        return [lost(s, f"submitit job {job.job_id} failed: {e}") for s in chunk]


def _collect(pending, slurm: bool, bar) -> List[CellStatus]:
    """Statuses of submitted jobs as they finish. A Slurm job is done when its result file exists, or when squeue
    says it ended (cancelled, timed out, failed) and no result file appears within SLURM_GRACE_S."""
    out: List[CellStatus] = []
    ended: Dict[str, tuple] = {}  # job id -> (state, when first seen ended)
    next_probe = time.monotonic() + SLURM_POLL_S
    while pending:
        still = []
        for job, chunk in pending:
            if slurm:
                gone = ended.get(job.job_id)
                if job.paths.result_pickle.exists():
                    res = _result(job, chunk)
                elif gone and time.monotonic() - gone[1] > SLURM_GRACE_S:
                    res = [lost(s, f"Slurm job {job.job_id} ended {gone[0]} without a result (cancelled, timed out "
                                   f"or killed; log: {job.paths.stderr}); run again to compute its cells") for s in chunk]
                else:
                    still.append((job, chunk))
                    continue
            elif job.done():
                res = _result(job, chunk)
            else:
                still.append((job, chunk))
                continue
            out += res
            bar.update(len(res))
        pending = still
        if slurm and pending and time.monotonic() >= next_probe:
            states = slurm_states([j.job_id for j, _ in pending])
            if states is not None:
                for job, _ in pending:
                    st = states.get(job.job_id, "(no longer listed by squeue)")
                    if st not in SLURM_ACTIVE:
                        ended.setdefault(job.job_id, (st, time.monotonic()))
            next_probe = time.monotonic() + SLURM_POLL_S
        if pending:
            time.sleep(0.2)
    return out
