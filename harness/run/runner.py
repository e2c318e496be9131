"""The runner's main loop: plan every experiment, execute the missing cells (one executor batch over all of them,
or experiment by experiment when serial), then count each experiment's outcomes and write its outputs
(`_finish`) and the results README. harness.run re-exports what callers use."""
from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ..store import claims as _claims
from ..store.atomic import clean_stale_tmp
from ..store.cells import CellCache
from . import preflight as _preflight
from .executors import execute
from .outputs import OutputReport, write_outputs
from .verify_compare import against_existing
from .plan import ExpPlan, RunConfig, check_overrides, compute_command, plan
from .specs import CellSpec, CellStatus, status_of
from .substitutes import plan_notices
from .worker import make_spec

MEMORY_BUDGET_MB = 8192  # cells above this peak RSS are flagged in the run log
CLAIM_POLL_S = 0.5


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
    elsewhere: int = 0  # computed by another runner on the same cache while this one waited
    uncached: int = 0  # computed but the cache could not be written (read-only / full)
    cache_error: str = ""  # why, once ("cache disk full: N MB free at PATH")
    wall_s: float = 0.0  # serial: the experiment's own time; in a pool, the compute time of its cells (cell_time)
    cell_time: bool = False  # wall_s sums the cells' compute times (pool runs: the experiments share one batch)
    errors: List[CellStatus] = field(default_factory=list)
    figure_error: Optional[str] = None
    output: Optional[OutputReport] = None
    absent: List[str] = field(default_factory=list)  # cells without a result (not cached, failed, no data)
    kept: Optional[str] = None  # why the outputs already there were kept rather than replaced by an incomplete set
    command: str = ""  # the run_all.py command that computes the absent cells and writes the outputs
    reproduced: Optional[str] = None  # the outputs there reproduced within the verify tolerances and were kept
    replaced: Optional[str] = None  # the outputs there differed (what, by how much) and were rewritten

    def line(self) -> str:
        extra = f", {self.missing_data} missing data" if self.missing_data else ""
        extra += f", {self.corrupt} corrupt->recomputed" if self.corrupt else ""
        extra += f", {self.missing} missing (not computed)" if self.missing else ""
        extra += f", {self.elsewhere} computed by another runner" if self.elsewhere else ""
        extra += f", {self.uncached} NOT CACHED ({self.cache_error or 'cache unwritable'})" if self.uncached else ""
        extra += ", FIGURES FAILED" if self.figure_error else ""
        extra += ", outputs there KEPT (incomplete result not written)" if self.kept else ""
        line = (f"{self.name}: {self.n_cells} cells: {self.computed} computed, {self.cached} cached, "
                f"{self.failed} failed{extra} [{'cells ' if self.cell_time else ''}{self.wall_s:.1f}s]")
        if self.reproduced:
            line += f"\n   {self.reproduced}"
        elif self.replaced:
            line += f"\n   rewritten: the result there differs: {self.replaced}"
        return line

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.missing == 0 and self.missing_data == 0 and not self.figure_error


def _wait_for_claims(specs: List[CellSpec], cfg: RunConfig, statuses: Dict[str, CellStatus]) -> List[CellSpec]:
    """Wait for cells another runner claimed; returns those it abandoned (claim gone, no cell) to run here."""
    store = CellCache(cfg.cache_dir)
    pending = list(specs)
    again: List[CellSpec] = []
    while pending:
        still = []
        for s in pending:
            if store.exists(s.experiment, s.key):
                statuses[s.key] = status_of(s, "elsewhere")
            elif _claims.claimed_elsewhere(cfg.cache_dir, s.experiment, s.key):
                still.append(s)
            else:
                again.append(s)
        pending = still
        if pending:
            time.sleep(CLAIM_POLL_S)
    return again


def _execute_all(todo: List[CellSpec], cfg: RunConfig, desc: str, statuses: Dict[str, CellStatus]) -> None:
    for _ in range(3):  # claimed elsewhere -> wait -> abandoned claims are run here
        claimed = []
        for st in execute(todo, cfg, desc=desc):
            if st.status == "claimed":
                claimed.append(next(s for s in todo if s.key == st.key))
            else:
                statuses[st.key] = st
        todo = _wait_for_claims(claimed, cfg, statuses) if claimed else []
        if not todo:
            return


def _finish(r: ExpResult, p: ExpPlan, statuses: Dict[str, CellStatus], cfg: RunConfig, collect_only: bool,
            started: float, echo) -> bool:
    """Count one experiment's cell outcomes into `r`, write its outputs from the cache and print its line; True
    when a table was written."""
    n = r.name
    for t in p.tasks:
        st = statuses.get(t.key)
        if st is None:
            continue
        if st.status == "ok":
            r.computed += 1
            r.uncached += st.cached is False
            r.cache_error = r.cache_error or str(st.cache_error or "")
        elif st.status == "elsewhere":
            r.elsewhere += 1
        elif st.status == "missing_data":
            r.missing_data += 1
            r.errors.append(st)
        else:
            r.failed += 1
            r.errors.append(st)
    if collect_only:
        r.missing = sum(1 for t in p.tasks if t.state != "cached")
    try:
        out = write_outputs(p, cfg, statuses, started=started, overrides=p.overrides,
                            judge=None if collect_only else against_existing)  # --collect always writes
    except OSError as e:
        out = OutputReport(n, figure_error=f"writing outputs to {cfg.output_root / n} failed: "
                                           f"{e.__class__.__name__}: {e}")
    except Exception as e:  # noqa: BLE001 - reported, run goes on
        out = OutputReport(n, figure_error=f"writing outputs failed: {e.__class__.__name__}: {e}\n"
                                           f"{traceback.format_exc()}")
    r.output = out
    r.figure_error = out.figure_error
    r.absent = [t.label for t in p.tasks if t.state != "cached"
                and getattr(statuses.get(t.key), "status", None) not in ("ok", "elsewhere")]
    r.kept = out.kept and out.skipped
    r.reproduced, r.replaced = out.reproduced, out.replaced
    r.command = compute_command([n], cfg)
    r.wall_s = time.perf_counter() - started
    if cfg.executor != "serial":  # the batch is shared: time since the run started would be the same on every line
        r.cell_time = True
        r.wall_s = sum(getattr(statuses.get(t.key), "wall_s", None) or 0.0 for t in p.tasks)
    echo(r.line())
    for t in p.tasks:
        mb = getattr(statuses.get(t.key), "peak_rss_mb", None) or 0
        if mb > MEMORY_BUDGET_MB:
            echo(f"warning: {n} [{t.label}]: peak RSS {mb:.0f} MiB exceeds the {MEMORY_BUDGET_MB} MiB budget")
    return out.written


def run(names: Sequence[str], cfg: RunConfig, collect_only: bool = False, echo=print) -> List[ExpResult]:
    """Plan, execute missing cells (all experiments' cells share one executor batch), write outputs."""
    check_overrides(names, cfg)
    inside = Path(cfg.cache_dir).resolve().is_relative_to(Path(cfg.results_dir).resolve())
    removed = [] if inside else clean_stale_tmp(cfg.cache_dir)
    removed += clean_stale_tmp(cfg.results_dir)
    if removed:
        echo(f"removed {len(removed)} stale temp file(s) left by killed writers")
    store = CellCache(cfg.cache_dir)
    results: Dict[str, ExpResult] = {}
    plans: Dict[str, ExpPlan] = {}
    todo: List[CellSpec] = []
    skipped: Dict[str, CellStatus] = {}
    t_start: Dict[str, float] = {}
    for n in names:
        t_start[n] = time.perf_counter()
        p = plans[n] = plan(n, cfg)
        r = results[n] = ExpResult(n, len(p.tasks))
        for t in p.tasks:
            if t.state == "corrupt":
                r.corrupt += 1
                gone = store.remove(n, t.key)
                echo(f"warning: {n} [{t.label}]: corrupt cache file ({t.note}); "
                     + ("recomputing" if gone else "cache is read-only: recomputing without caching"))
            if t.state == "cached" and not cfg.force:
                r.cached += 1
            elif t.missing and not collect_only:  # absent data / weights: skipped, reported once per item
                skipped[t.key] = CellStatus(experiment=n, key=t.key, label=t.label, status="missing_data",
                                            error=_preflight.error_text(t.missing), traceback="",
                                            fix=" ; ".join(m["fix"] for m in t.missing if m["fix"]),
                                            missing=t.missing)
            elif not collect_only:
                todo.append(make_spec(p.exp, t, cfg, progress=cfg.progress and cfg.executor == "serial"))
        if not collect_only:
            for line in recompute_lines(p, cfg.force):
                echo(line)
    for line in plan_notices(plans.values(), cfg.scale):  # one line per substitute, before anything runs
        echo(line)
    statuses: Dict[str, CellStatus] = dict(skipped)
    written: List[str] = []

    def finish(n: str) -> None:
        if _finish(results[n], plans[n], statuses, cfg, collect_only, t_start[n], echo):
            written.append(n)

    try:
        if cfg.executor == "serial":  # experiment by experiment: outputs appear as soon as one is done
            for n in names:
                t_start[n] = time.perf_counter()  # each line's time is its own experiment's
                g = [s for s in todo if s.experiment == n]
                if g:
                    _execute_all(g, cfg, n, statuses)
                finish(n)
        else:  # one batch over all experiments keeps every worker busy
            _execute_all(todo, cfg, f"{len(names)} experiment(s)", statuses)
            for n in names:
                finish(n)
    except KeyboardInterrupt:
        raise Interrupted(_tidy_after_interrupt(cfg, store, todo)) from None
    from .. import report as _report

    if not written:  # nothing changed under the output root: its README stays as it is
        return list(results.values())
    try:
        _report.write_readme(cfg.output_root, canonical=cfg.results_dir if not cfg.variant else None)
    except Exception as e:  # noqa: BLE001
        echo(f"warning: could not write {cfg.output_root / 'README.md'}: {e.__class__.__name__}: {e}")
    return list(results.values())


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a run: `kept` cells computed by it are in the cache, whole (a rerun skips them)."""

    def __init__(self, kept: int):
        super().__init__(kept)
        self.kept = kept


def _tidy_after_interrupt(cfg: RunConfig, store: CellCache, todo: Sequence[CellSpec]) -> int:
    """After Ctrl-C: remove the claims and temp files of the ended workers; the number of `todo` cells cached."""
    _claims.remove_stale(cfg.cache_dir)
    clean_stale_tmp(cfg.cache_dir)
    clean_stale_tmp(cfg.results_dir)
    return sum(store.exists(s.experiment, s.key) for s in todo)


def recompute_lines(p: ExpPlan, force: bool) -> List[str]:
    """One line per reason the plan gives for computing cells again (harness.run.changes), with their count."""
    counts: Dict[str, int] = {}
    for t in p.tasks:
        if t.why and t.state == "missing" and not t.missing:
            counts[t.why] = counts.get(t.why, 0) + 1
    return [] if force else [f"{p.exp.name}: computing {k} cell(s) again: {why}" for why, k in counts.items()]


def format_errors(results: Sequence[ExpResult], full: bool = True) -> str:
    """The errors of a run: the first traceback per experiment in full, the rest one line each."""
    lines: List[str] = []
    for r in results:
        for i, e in enumerate(r.errors):
            if e.status == "missing_data":  # its message is in missing_summary, once per item
                lines.append(f"[{r.name}] cell {e.label}: skipped, missing "
                             f"{', '.join(m['item'] for m in _preflight.items_of(e))} (see MISSING DATA)")
                continue
            head = f"[{r.name}] cell {e.label}: {e.error}"
            if full and i == 0 and e.traceback:
                lines += [head, e.traceback.rstrip()]
            else:
                lines.append(head)
        if r.figure_error:
            lines.append(f"[{r.name}] figures: {r.figure_error.rstrip()}")
        lines += absent_lines(r)
    return "\n".join(lines)


def absent_lines(r: ExpResult, show: int = 8) -> List[str]:
    """Which cells of an experiment have no result (those not cached at --collect included), whether the outputs
    already there were kept, and the command that computes the absent cells."""
    lines: List[str] = []
    if r.missing:
        names = r.absent[:show] + ([f"... ({len(r.absent) - show} more)"] if len(r.absent) > show else [])
        lines.append(f"[{r.name}] {r.missing} of {r.n_cells} cell(s) not in the cache: {'; '.join(names)}")
    if r.kept:
        lines.append(f"[{r.name}] outputs not written: {r.kept}")
    if (r.missing or r.kept) and r.command:
        lines.append(f"[{r.name}] compute the absent cells and write the outputs with: {r.command}")
    return lines
