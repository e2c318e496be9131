"""The README's cost paragraph is what the committed manifests record (harness.report.cost_text), never a number
typed by hand; and cost_text sums and names what the manifests say."""
import json
from pathlib import Path

from harness import report

REPO = Path(__file__).resolve().parent.parent


def test_readme_costs_equal_the_committed_manifests():
    block = report.costs_block((REPO / "README.md").read_text())
    assert block is not None, "README.md has no generated cost block"
    expected = report.cost_text(REPO / "results")
    assert block == expected, ("README.md's cost block differs from the committed manifests; regenerate it with "
                               "python -c \"from harness.report import write_costs; write_costs('README.md', "
                               "'results')\"\n" + expected)


def _manifest(folder: Path, name: str, scale: str, cells: int, wall: float) -> None:
    (folder / name).mkdir(parents=True)
    (folder / name / "manifest.json").write_text(json.dumps(
        {"experiment": name, "scale": scale, "n_cells": cells, "total_cell_wall_s": wall}))


def test_cost_text_sums_and_names_the_large_ones(tmp_path):
    _manifest(tmp_path, "big", "full", 3, 7200.0)
    _manifest(tmp_path, "small", "full", 2, 30.0)
    _manifest(tmp_path / "quick", "big", "quick", 1, 50.0)
    _manifest(tmp_path / "quick", "only_quick", "quick", 1, 10.0)
    text = report.cost_text(tmp_path)
    assert "2 experiments, 5 cells; the cells' wall times (each manifest's `total_cell_wall_s`) sum to **2.01 h**: " \
           "big 120 min (3 cells); the other 1 under 4 min each." in text, text
    assert "**Quick scale** (`results/quick/`): 2 experiments, 2 cells" in text and "sum to **1 min**." in text
    assert text.endswith("Committed at the quick scale only: `only_quick`.")


def test_write_costs_replaces_only_the_block(tmp_path):
    _manifest(tmp_path / "results", "big", "full", 3, 600.0)
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{report.COSTS_BEGIN}\nold 4.2 h\n{report.COSTS_END}\nafter\n")
    report.write_costs(readme, tmp_path / "results")
    text = readme.read_text()
    assert text.startswith("before\n") and text.endswith("after\n") and "4.2 h" not in text
    assert report.costs_block(text) == report.cost_text(tmp_path / "results")
