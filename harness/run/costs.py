"""Expected wall time of a run, from the per-cell wall times the committed manifests record.

results/<exp>/manifest.json (full scale) and results/quick/<exp>/manifest.json (quick scale) list every cell with
its `wall_s`. A planned cell takes the time recorded for the same cell label at its own scale, else at the other
scale (equal cells of two scales are the same computation); cells found in neither are counted as unknown. A cell
that carries plug-in bounds (`--bound`, the cell's `plugins` key) takes the time of the same cell without them:
the built-in part of its work; the plug-ins' own time comes on top.
The cells of a run are then scheduled longest-first onto the -j workers (a serial run adds them up), which is
what the process pool does with one batch over all selected experiments.

This is an estimate: the recorded times come from the machine and thread count of the committed run, a cell whose
trained model was already cached when it was recorded takes longer from an empty cache, and process start,
imports and figures are not in the per-cell times."""
from __future__ import annotations

import heapq
import json
import re
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple


MAX_WALL_S = 30 * 86400  # a recorded cell wall time above this is damage, not a record
ESTIMATE_NOTE = ("estimate from the per-cell wall times of the committed manifests, scheduled onto the workers; "
                 "training of models not yet cached, plug-in bounds, process start and figures come on top")


def recorded_walls(results_dir: Path, name: str, scale: str) -> Dict[str, float]:
    """cell label -> recorded wall seconds for one experiment, its own scale's manifest first."""
    roots = {"full": [results_dir, results_dir / "quick"], "quick": [results_dir / "quick", results_dir]}
    out: Dict[str, float] = {}
    for root in roots.get(scale, [results_dir / "quick", results_dir]):
        try:
            man = json.loads((Path(root) / name / "manifest.json").read_text())
        except (OSError, ValueError):
            continue
        for c in man.get("cells", []) if isinstance(man, dict) else []:
            w = c.get("wall_s") if isinstance(c, dict) else None
            if _plausible_wall(w) and c.get("cell") not in out:
                out[c["cell"]] = float(w)
    return out


def _plausible_wall(w) -> bool:
    """A recorded wall time an estimate may use: a finite number of seconds from 0 to 30 days (a damaged or edited
    manifest's NaN, negative or astronomic value is no record, so the estimate does not print it)."""
    return isinstance(w, (int, float)) and not isinstance(w, bool) and 0 <= w <= MAX_WALL_S


_PLUGINS = re.compile(r",?plugins=\[[^\]]*\]")


def _bare(label: str) -> str:
    """A cell label without its plug-in bounds (plug-in names hold no ']')."""
    return _PLUGINS.sub("", label).lstrip(",")


def wall_of(rec: Dict[str, float], label: str) -> Optional[float]:
    """The recorded wall time of cell `label`, else that of the same cell with other (or no) plug-in bounds."""
    if label in rec:
        return rec[label]
    bare = _bare(label)
    return next((w for other, w in rec.items() if _bare(other) == bare), None)


def makespan(walls: Iterable[float], workers: int) -> float:
    """Finish time of the jobs scheduled longest-first onto `workers` identical workers."""
    loads = [0.0] * max(1, int(workers))
    for w in sorted(walls, reverse=True):
        heapq.heapreplace(loads, loads[0] + w)
    return max(loads)


def workers_for(cfg) -> int:
    """How many cells run at once: -j for the process pool and submitit, one for the serial executor."""
    return 1 if cfg.executor == "serial" else max(1, cfg.jobs)


def estimate(plan, cfg, only_missing: bool = True) -> Tuple[List[float], int]:
    """(recorded walls of the plan's cells to compute, number of those cells with no recorded time)."""
    rec = recorded_walls(Path(cfg.results_dir), plan.exp.name, cfg.scale)
    walls: List[float] = []
    unknown = 0
    for t in plan.tasks:
        if only_missing and t.state == "cached" and not cfg.force:
            continue
        w = wall_of(rec, t.label)
        if w is not None:
            walls.append(w)
        else:
            unknown += 1
    return walls, unknown


def fmt_seconds(s: Optional[float]) -> str:
    if s is None:
        return "?"
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{s / 60:.1f}min"
    return f"{s / 3600:.1f}h"


def describe(walls: List[float], unknown: int, workers: int) -> str:
    """'~12min at -j 2' (+ how many cells have no recorded time)."""
    if not walls and unknown:
        return f"? ({unknown} cell(s) without a recorded time)"
    txt = f"~{fmt_seconds(makespan(walls, workers))}"
    return txt + (f" + {unknown} cell(s) without a recorded time" if unknown else "")


def paper_estimate(exp, results_dir: Path) -> Tuple[Optional[float], str]:
    """(seconds or None, how) for an experiment's --scale paper run: its declared `paper_cost` factor times the
    total cell time its committed full-scale manifest records (machine and device of that run). The papers' sizes
    change the model, data and device at once, so the factor is the experiment's own declared guess."""
    factor = exp.paper_cost
    if not factor:
        return None, "no estimate (the experiment declares no paper_cost)"
    walls = recorded_walls(results_dir, exp.name, "full")
    if not walls:
        return None, "no estimate (no recorded full-scale cell times)"
    return float(factor) * sum(walls.values()), (f"declared {factor:g} x the {fmt_seconds(sum(walls.values()))} "
                                                 f"of cell time the committed full-scale run recorded")
