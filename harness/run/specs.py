"""The two messages between the runner and its workers: a cell's spec (what to compute) and its status (what came
of it).

Both cross process and Slurm boundaries (spawn pools and submitit send them to workers and back), so they are
TypedDicts: plain dicts of JSON values at run time, with no class of this package inside what is sent."""
from __future__ import annotations

from typing import Any, Dict, List, Literal, Optional, TypedDict

# ok: computed (and cached unless the cache was unwritable); claimed: another live runner holds the cell;
# elsewhere: another runner finished it meanwhile; failed: run() raised or the worker died; missing_data: an
# optional input (weights, data) is absent.
Status = Literal["ok", "claimed", "elsewhere", "failed", "missing_data"]


class CellSpec(TypedDict):
    """One cell's work, parameters only (never tensors)."""

    experiment: str
    module: str  # the experiment's module name, imported by the worker
    module_file: Optional[str]  # its file, for modules loaded from $ATTNLIP_EXPERIMENTS_PATH
    cell: Dict[str, Any]  # the grid parameters handed to run()
    key: str
    label: str
    seed: int
    dtype: str
    scale: str
    device: str
    cache_dir: str
    progress: bool
    threads: Optional[int]
    model_source: Optional[str]
    data_source: Optional[str]
    force: bool
    bounds: List[str]  # --bound plug-ins the worker registers before run() (accepts_bounds experiments)


class _StatusHead(TypedDict):
    experiment: str
    key: str
    label: str
    status: Status


class CellStatus(_StatusHead, total=False):
    """What came of one cell; the worker's metadata (wall_s, peak_rss_mb, ...) where it ran."""

    error: str
    traceback: str
    fix: str  # missing_data: the command that fetches what is absent
    missing: List[Dict[str, str]]  # missing_data found before running: the absent items (harness.run.preflight)
    wall_s: float
    peak_rss_mb: float
    threads: int
    pid: int
    computed_at: str
    n_rows: int
    cached: bool  # ok: whether the cell file was written
    cache_error: str  # ok but not cached: why
    record: Dict[str, Any]  # ok but not cached: the record itself, for the outputs


def status_of(spec: CellSpec, status: Status, **fields: Any) -> CellStatus:
    """The status of `spec`'s cell: its identity (experiment, key, label), `status` and the given fields."""
    out: CellStatus = {"experiment": spec["experiment"], "key": spec["key"], "label": spec["label"],
                       "status": status}
    out.update(fields)  # type: ignore[typeddict-item]
    return out


def lost(spec: CellSpec, why: str) -> CellStatus:
    """A cell whose worker or job ended without an answer: failed, with `why` as error and traceback."""
    return status_of(spec, "failed", error=why, traceback=why)
