#!/usr/bin/env python
"""Run every registered AttnLip experiment (cached per cell) and regenerate results/; see --help."""
import sys

from harness.cli import main

if __name__ == "__main__":
    sys.exit(main())
