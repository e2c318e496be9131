"""The example experiment of docs/notes/harness.md runs as written: copied to a file, it registers, plans, computes
at test scale in both dtypes, and writes its table, figure and summary."""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from harness import catalog
from harness.run import discovery
from harness import run as runner

DOC = Path(__file__).resolve().parent.parent / "docs" / "notes" / "harness.md"


def _example() -> str:
    text = DOC.read_text()
    section = text[text.index("## Writing an experiment"):]
    return re.search(r"```python\n(.*?)```", section, flags=re.S).group(1)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_documented_experiment_runs_as_written(tmp_path, dtype):
    f = tmp_path / "my_softmax_rows.py"
    f.write_text(_example())
    discovery.load_module_file(f)
    try:
        exp = catalog.get_experiment("my_softmax_rows")
        assert exp.figures_ref and exp.cells("test") == [{"n": 4, "count": 10}]
        cfg = runner.RunConfig(scale="test", dtype=dtype, results_dir=tmp_path / "results",
                               cache_dir=tmp_path / "cache", progress=False)
        r = runner.run(["my_softmax_rows"], cfg, echo=lambda *a: None)[0]
        assert (r.computed, r.failed) == (1, 0), r.errors
        out = cfg.output_root / "my_softmax_rows"
        table = pd.read_parquet(out / "table.parquet")
        assert len(table) == 10 and (table["ratio"] >= 1 - 1e-6).all()  # Cor. 1: g_1 >= ||J_sm||
        assert (out / "figures" / "my_softmax_rows.png").is_file()
        assert "g_1 >= ||J_sm|| on every row" in exp.summary(table)
    finally:
        catalog.unregister("my_softmax_rows")
