"""Every registered experiment runs at scale 'test' into a temp dir: tidy table schema + figure files.

Parametrized over list_experiments(), so a newly registered experiment is covered automatically. A cell
raising harness.catalog.MissingData (absent shared data / weights) turns the test into a skip."""
from __future__ import annotations

import pandas as pd
import pytest

from harness import catalog
from harness.run import discovery
from harness import run as runner

NAMES = catalog.list_experiments()
SCHEMA = {"experiment", "cell", "seed", "device", "dtype"}


def test_experiment_modules_import():
    assert discovery.import_errors() == {}, "\n".join(discovery.import_errors().values())


@pytest.mark.parametrize("name", NAMES)
def test_experiment_smoke(name, tmp_path, experiment_cache):
    cfg = runner.RunConfig(scale="test", results_dir=tmp_path / "results", cache_dir=experiment_cache, progress=False)
    (res,) = runner.run([name], cfg, echo=lambda *a: None)
    if res.missing_data and not res.computed:
        pytest.skip(f"{name}: missing data: {res.errors[0]['error']}")
    assert res.failed == 0, runner.format_errors([res])
    assert res.figure_error is None, res.figure_error
    out = cfg.output_root / name
    assert cfg.output_root == tmp_path / "results" / "test"  # test scale never writes where full results live
    table = pd.read_csv(out / "table.csv")
    assert len(table) > 0, f"{name}: empty table"
    assert SCHEMA <= set(table.columns), f"{name}: missing columns {SCHEMA - set(table.columns)}"
    assert (table["experiment"] == name).all()
    assert (out / "table.parquet").is_file() and (out / "manifest.json").is_file()
    figs = res.output.figures
    assert figs, f"{name}: figures() returned no files"
    for f in figs:
        p = out / f if not str(f).startswith("/") else f
        assert pd.io.common.file_exists(str(p)), f"{name}: figure {p} missing"
    assert list((out / "figures").glob("*.png")), f"{name}: no PNG figure"
    exp = catalog.get_experiment(name)
    assert exp.figures_ref, f"{name}: declare the paper figure(s) it reproduces in figures_ref"
    assert isinstance(exp.summary(table), str)
