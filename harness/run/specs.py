"""The two messages between the runner and its workers: a cell's spec (what to compute) and its status (what came
of it).

Both are frozen dataclasses in this process and plain dicts across process and Slurm boundaries (spawn pools and
submitit send `to_dict()` to workers and back, `from_dict` on arrival): no class of this package inside what a
worker receives."""
from __future__ import annotations

from dataclasses import MISSING, dataclass, fields, replace
from typing import Any, Dict, List, Literal, Mapping, Optional

# ok: computed (and cached unless the cache was unwritable); claimed: another live runner holds the cell;
# elsewhere: another runner finished it meanwhile; failed: run() raised or the worker died; missing_data: an
# optional input (weights, data) is absent.
Status = Literal["ok", "claimed", "elsewhere", "failed", "missing_data"]


def _from_dict(cls, d: Mapping[str, Any], what: str):
    """cls(**d), with a clear error naming the missing and unknown fields of a message that does not fit."""
    names = {f.name for f in fields(cls)}
    required = {f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING}
    unknown, missing = sorted(set(d) - names), sorted(required - set(d))
    if unknown or missing:
        raise ValueError(f"not a {what}: missing {missing or 'nothing'}, unknown {unknown or 'nothing'}")
    return cls(**dict(d))


@dataclass(frozen=True)
class CellSpec:
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

    def to_dict(self) -> Dict[str, Any]:
        """The message sent to a worker process or Slurm job (plain JSON values)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CellSpec":
        return _from_dict(cls, d, "cell spec")

    def but(self, **changes: Any) -> "CellSpec":
        """A copy with `changes` (e.g. the worker thread count)."""
        return replace(self, **changes)


@dataclass(frozen=True)
class CellStatus:
    """What came of one cell; the worker's metadata (wall_s, peak_rss_mb, ...) where it ran, None where not."""

    experiment: str
    key: str
    label: str
    status: Status
    error: Optional[str] = None
    traceback: Optional[str] = None
    fix: Optional[str] = None  # missing_data: the command that fetches what is absent
    missing: Optional[List[Dict[str, str]]] = None  # missing_data found before running (harness.run.preflight)
    wall_s: Optional[float] = None
    peak_rss_mb: Optional[float] = None
    threads: Optional[int] = None
    pid: Optional[int] = None
    computed_at: Optional[str] = None
    n_rows: Optional[int] = None
    cached: Optional[bool] = None  # ok: whether the cell file was written
    cache_error: Optional[str] = None  # ok but not cached: why
    record: Any = None  # ok but not cached: the record itself (a store.cells.CellRecord), for the outputs

    def to_dict(self) -> Dict[str, Any]:
        """The message sent back from a worker (fields that are None left out)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CellStatus":
        return _from_dict(cls, d, "cell status")


def status_of(spec: CellSpec, status: Status, **fields_: Any) -> CellStatus:
    """The status of `spec`'s cell: its identity (experiment, key, label), `status` and the given fields."""
    return CellStatus(experiment=spec.experiment, key=spec.key, label=spec.label, status=status, **fields_)


def lost(spec: CellSpec, why: str) -> CellStatus:
    """A cell whose worker or job ended without an answer: failed, with `why` as error and traceback."""
    return status_of(spec, "failed", error=why, traceback=why)
