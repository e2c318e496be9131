"""`run_all.py --verify`: committed quick-scale numbers reproduce on this checkout (a cheap sample, recomputed from an
empty cache), and an edited committed number is caught (exit 1, the column in the diff table).

The sample (CHEAP) is cells that need no shared data and no trained model, about 10 s in all on one core: an exact
quantity from each paper's toolkit (Castin's radius bounds, JaSMin's interlacing and softmax, mass splitting)."""
from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from harness import cli
from harness.run import verify as V
from harness.store.codehash import REPO_ROOT

RESULTS = REPO_ROOT / "results"
CHEAP = ["castin_radius_quadratic", "castin_radius_edge", "jasmin_interlacing", "jasmin_softmax"]


def _run(argv, capsys):
    code = cli.main(argv)
    cap = capsys.readouterr()
    return code, cap.out + cap.err


@pytest.mark.skipif(not (RESULTS / "quick").is_dir(), reason="no committed quick-scale results")
def test_committed_quick_sample_reproduces(capsys):
    code, out = _run(["--verify", "--quick", "--verify-sample", "1", "--no-progress", *CHEAP], capsys)
    assert code == 0, out
    for name in CHEAP:
        assert f"== {name}: OK (1 cell(s)" in out, out
    assert f"verify: {len(CHEAP)} of {len(CHEAP)} experiment(s) reproduce" in out


@pytest.fixture
def results_copy(tmp_path):
    """A copy of the committed quick tables of one cheap experiment (the tests edit it, never the repository)."""
    name = "castin_radius_quadratic"
    src = RESULTS / "quick" / name
    if not src.is_dir():
        pytest.skip("no committed quick-scale results")
    dst = tmp_path / "results" / "quick" / name
    shutil.copytree(src, dst)
    return tmp_path / "results", dst, name


def test_an_edited_committed_number_fails_with_the_diff(results_copy, capsys):
    root, folder, name = results_copy
    table = pd.read_parquet(folder / "table.parquet")
    col = "lipschitz"
    assert col in table.columns
    table.loc[3, col] = table.loc[3, col] * (1 + 1e-6)  # far below any plot's resolution, far above rounding
    table.to_parquet(folder / "table.parquet", index=False)
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 1, out
    line = next(x for x in out.splitlines() if x.strip().startswith(col + " "))
    assert "NO (1 over)" in line and "1e-09" in line, line
    assert f"worst {col}: " in out and "row 3" in out
    assert f"MISMATCH in {name}" in out
    assert not (folder / "cache").exists() and not (root / "cache").exists()  # nothing written beside the tables


def test_csv_only_and_missing_or_extra_rows(results_copy, capsys):
    """Without parquet the CSV is read; a committed row the code no longer produces is a mismatch."""
    root, folder, name = results_copy
    table = pd.read_parquet(folder / "table.parquet")
    (folder / "table.parquet").unlink()
    pd.concat([table, table.iloc[[0]]]).to_csv(folder / "table.csv", index=False)
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 1 and f"{len(table) + 1} committed rows, {len(table)} recomputed" in out, out


def test_a_cell_gone_from_the_grid_is_a_mismatch(results_copy, capsys):
    root, folder, name = results_copy
    table = pd.read_parquet(folder / "table.parquet")
    table["cell"] = table["cell"] + ",extra=1"
    table.to_parquet(folder / "table.parquet", index=False)
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 1 and "not a cell of the current quick grid" in out, out


def test_usage_errors_and_stale_note(results_copy, capsys):
    root, folder, name = results_copy
    code, out = _run(["--verify", "--quick", "--seed", "3", "--results-dir", str(root), name], capsys)
    assert code == 2 and "--seed 3" in out and "drop" in out
    code, out = _run(["--verify", "--quick", "--verify-sample", "0", "--results-dir", str(root), name], capsys)
    assert code == 2 and "--verify-sample must be >= 1" in out
    man = json.loads((folder / "manifest.json").read_text())
    man["code_hash"] = "0" * 64
    (folder / "manifest.json").write_text(json.dumps(man))
    code, out = _run(["--verify", "--quick", "--no-progress", "--results-dir", str(root), name], capsys)
    assert code == 0 and "stale: committed with code 0000000000" in out, out


def test_tolerance_lookup_and_sampling_order():
    class E:
        verify_tol = {"default": 1e-9, "step_*": None, "acc": 1e-3}

    assert V.tolerance(E, "acc") == 1e-3 and V.tolerance(E, "step_s") is None and V.tolerance(E, "x") == 1e-9
    man = {"cells": [{"cell": "a", "wall_s": 5.0}, {"cell": "b", "wall_s": 1.0}, {"cell": "c"}]}
    assert V.sample(man, ["a", "a", "b", "c"], 2) == ["b", "a"]
    assert V.sample(man, ["c", "b", "a"], None) == ["b", "a", "c"]
    d = V.ColumnDiff("x", 1e-9)
    V._compare_value(d, "a", 0, 2.0, 2.0 + 1e-9)  # 5e-10 relative: within
    V._compare_value(d, "a", 1, float("nan"), float("nan"))
    assert d.ok
    V._compare_value(d, "a", 2, 1.0, float("nan"))
    assert not d.ok and "row 2" in d.worst
