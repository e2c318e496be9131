"""The runner: plan (grid, --set, keys, cache state) -> execute missing cells (serial | process | submitit) ->
write outputs from the cache -> results README. Modules: plan, runner (the main loop), worker, executors, outputs.

Workers write their own cell files (harness.store), so an interrupted, concurrent or distributed run resumes by
skipping what exists; cells claimed by another live runner are waited for, not recomputed."""
from __future__ import annotations

from .executors import execute
from .outputs import load_rows, to_table, write_outputs
from .preflight import summary as missing_summary  # MISSING DATA: each absent item once, with its fix
from .plan import (EXECUTORS, CellTask, ExpPlan, RunConfig, check_overrides, compute_command, paper_selection, plan,
                   select, typed_overrides)
from .runner import CLAIM_POLL_S, MEMORY_BUDGET_MB, ExpResult, Interrupted, absent_lines, format_errors, run
from .specs import CellSpec, CellStatus
from .worker import RESERVED, run_one

__all__ = ["RunConfig", "run", "plan", "select", "check_overrides", "execute", "write_outputs", "load_rows",
           "to_table", "format_errors", "missing_summary", "ExpResult", "EXECUTORS", "RESERVED", "CellTask", "ExpPlan",
           "run_one", "typed_overrides", "CLAIM_POLL_S", "compute_command", "paper_selection", "CellSpec", "CellStatus",
           "MEMORY_BUDGET_MB", "absent_lines", "Interrupted"]
