"""Costs in README.md and docs/notes come from the committed manifests: the notes state no cell or wall time of
a committed run by hand (README's generated block has them; tests/test_readme_costs.py keeps it equal)."""
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HAND_COST = re.compile(r"\d[\d,.]* (?:s|min|h) of (?:cell|wall) time|cell compute, full scale|\d[\d,.]* min wall")


def test_experiment_notes_state_no_hand_written_run_cost():
    bad = [f"{f.name}:{i}: {line.strip()}" for f in sorted((REPO / "docs" / "notes").glob("*-exp.md"))
           for i, line in enumerate(f.read_text().splitlines(), 1) if HAND_COST.search(line)]
    assert not bad, "hand-written run costs (use the manifests / README's generated block):\n" + "\n".join(bad)
