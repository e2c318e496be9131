#!/usr/bin/env python
"""Run every registered AttnLip experiment (cached per cell) and regenerate results/; see --help."""
import sys

from harness import venv_check

venv_check.require("run_all.py")  # one line, not a traceback, outside the venv

from harness import config, network  # noqa: E402

config.prefer_passive_wait()  # before torch loads libgomp (harness.config.init_threads)
config.portable_numerics()  # before torch picks its CPU code paths: results independent of AVX-512
# before the hub libraries read their offline variables; help answers without the check
_note = None if network.asks_help(sys.argv[1:]) else network.offline_if_unreachable()
if _note:
    print(f"run_all.py: {_note}", file=sys.stderr)

from harness.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
