"""Transition shim: the runner is the `harness.run` package (plan, worker, executors, outputs)."""
from .run import *  # noqa: F401,F403
from .run import RunConfig, format_errors, plan, run, select  # noqa: F401
