#!/usr/bin/env python
"""Run every registered AttnLip experiment (cached per cell) and regenerate results/; see --help."""
import sys

from harness import config

config.prefer_passive_wait()  # before torch loads libgomp (harness.config.init_threads)

from harness.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
