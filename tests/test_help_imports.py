"""Help answers before the heavy libraries load: `--help` of every entry point imports neither torch nor
transformers nor an experiment module (checked in a fresh interpreter, by sys.modules, not by a clock)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "pandas", "scipy", "matplotlib", "datasets")

PROBE = """
import json, runpy, sys
argv, names = json.loads(sys.argv[1]), json.loads(sys.argv[2])
try:
    if argv[0] == "run_all.py":
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")
    else:
        from harness import entry
        entry.main(argv[1:])
except SystemExit:
    pass
heavy = [m for m in sys.modules if m.split(".")[0] in names or m.startswith("experiments.")]
print(json.dumps(sorted(heavy)))
"""


@pytest.mark.parametrize("argv", [["attnlip", "--help"], ["attnlip", "analyze", "--help"],
                                  ["attnlip", "certify", "--help"], ["attnlip", "run", "--help"],
                                  ["attnlip", "data", "--help"], ["attnlip", "data", "fetch", "--help"],
                                  ["run_all.py", "--help"]])
def test_help_loads_no_heavy_library(argv):
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argv), json.dumps(HEAVY)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"{' '.join(argv)} imported {loaded[:8]}"
