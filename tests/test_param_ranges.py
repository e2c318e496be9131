"""Grid parameter ranges (harness.catalog.PARAM_RANGES, Experiment.ranges): a --set value outside is refused when
the run is planned, naming the range, instead of failing inside a cell; every value an experiment declares lies
inside, so the table describes the experiments as they are."""
from __future__ import annotations

import importlib

import pytest

from harness import cli, catalog
from harness.run import discovery

plan = importlib.import_module("harness.run.plan")


def test_every_declared_value_is_in_its_range():
    discovery.load_all()
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
    ("resolution=-5", "--set resolution=-5: grid parameter 'resolution' of jasmin_softmax takes values >=3"),
    ("resolution=1", "takes values >=3"),
    ("resolution=2", "takes values >=3"),  # the experiment's own range, not a looser shared one
])
def test_a_set_value_out_of_range_is_refused_before_running(setting, message, capsys, tmp_path):
    rc = cli.main(["--set", setting, "--dry-run", "--quick", "--results-dir", str(tmp_path), "jasmin_softmax"],
                  out=lambda *a: None)
    err = capsys.readouterr().err
    assert rc == 2 and message in err and "Traceback" not in err
    assert cli.main(["--set", "resolution=9", "--dry-run", "--quick", "--results-dir", str(tmp_path),
                     "jasmin_softmax"], out=lambda *a: None) == 0


def test_set_values_are_typed_and_checked_once_per_experiment(monkeypatch, tmp_path):
    """Planning, the outputs and the checks before a run share one answer: the experiment's declared values type a
    --set value (9 -> 9.0 where floats are declared) and its ranges check it, once a run."""
    from harness import run as runner

    calls = []
    real = plan.check_value

    def counted(*a, **k):
        calls.append(a[1])
        return real(*a, **k)

    monkeypatch.setattr(importlib.import_module("harness.run.overrides"), "check_value", counted)
    cfg = runner.RunConfig(scale="test", results_dir=tmp_path, overrides={"resolution": [9]})
    runner.check_overrides(["jasmin_softmax"], cfg)
    p = runner.plan("jasmin_softmax", cfg, verify=False)
    assert calls == ["resolution"] and p.overrides == {"resolution": [9]}
    assert [t.cell["resolution"] for t in p.tasks] == [9]


def test_ranges_of_a_grid_resolution_are_the_experiments_own():
    """A name whose meaning differs between experiments is ranged by each experiment, not by the shared table."""
    assert "resolution" not in catalog.PARAM_RANGES
    assert catalog.get_experiment("jasmin_softmax").ranges["resolution"] == ">=3"
    assert catalog.get_experiment("mass_splitting").ranges["resolution"] == ">=2"
