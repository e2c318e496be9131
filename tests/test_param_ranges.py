"""Grid parameter ranges (harness.catalog.PARAM_RANGES, Experiment.ranges): a --set value outside is refused when
the run is planned, naming the range, instead of failing inside a cell; every value an experiment declares lies
inside, so the table describes the experiments as they are."""
from __future__ import annotations

import importlib

import pytest

from harness import cli, catalog

plan = importlib.import_module("harness.run.plan")


def test_every_declared_value_is_in_its_range():
    catalog.load_all()
    bad = []
    for name in catalog.list_experiments():
        exp = catalog.get_experiment(name)
        rules = {**catalog.PARAM_RANGES, **exp.ranges}
        for key, rule in rules.items():
            bad += [(name, key, v) for v in plan._declared(exp, key) if catalog.out_of_range(rule, v)]
    assert not bad


@pytest.mark.parametrize("rule, good, wrong", [
    (">=1", [1, 7, [1, 2]], [0, -3, 0.5, [1, 0], float("nan"), float("inf")]),
    (">=0", [0, 0.0, [0.0, 0.1]], [-1e-9, [0.1, -1]]),
    (">0", [1e-12, 3.0], [0, 0.0, -2]),
    (">=2", [2, 81], [1]),
])
def test_out_of_range(rule, good, wrong):
    assert not any(catalog.out_of_range(rule, v) for v in good)
    assert all(catalog.out_of_range(rule, v) for v in wrong)


@pytest.mark.parametrize("setting, message", [
    ("resolution=-5", "--set resolution=-5: grid parameter 'resolution' of jasmin_softmax takes values >=2"),
    ("resolution=1", "takes values >=2"),
])
def test_a_set_value_out_of_range_is_refused_before_running(setting, message, capsys, tmp_path):
    rc = cli.main(["--set", setting, "--dry-run", "--quick", "--results-dir", str(tmp_path), "jasmin_softmax"],
                  out=lambda *a: None)
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err
    assert cli.main(["--set", "resolution=9", "--dry-run", "--quick", "--results-dir", str(tmp_path),
                     "jasmin_softmax"], out=lambda *a: None) == 0
