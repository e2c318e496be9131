"""run_all.py --bound module:function: a user's bound joins the experiments that evaluate every registered bound,
in spawned workers too, keyed by its source, checked against the truth, and an unsound one fails the run."""
from __future__ import annotations

import sys
import textwrap

import pytest

from harness import catalog, cli
from harness.run import discovery
from harness.bounds import registry as bounds

EXP = '''
import torch
from harness.catalog import Experiment, experiment


@experiment
class FakeBoard(Experiment):
    """Fake leaderboard: every registered bound vs the truth on random inputs."""
    name = "_fake_board"
    figures_ref = ["Fake"]
    accepts_bounds = True
    grid = {"n": [4], "count": [2]}

    def run(self, cell, ctx):
        from harness.bounds import registry
        from harness.kernels.attention import AttentionWeights

        g = ctx.generator()
        w = AttentionWeights.random(d=6, h=2, generator=g, dtype=ctx.torch_dtype)
        X = torch.randn(cell["count"], cell["n"], 6, generator=g, dtype=ctx.torch_dtype)
        names = [b for b in registry.bound_names() if b in ("truth", "castin") or b.startswith("my_")]
        return [r for r in registry.evaluate(X, w, names=names).rows() if r["method"] != "truth"]
'''

PLUGIN = '''
import torch


def my_loose(X, w, causal=False):
    """Sound: 1e6 per head."""
    return torch.full((*X.shape[:-2], w.h), 1e6, dtype=X.dtype)


def my_zero(X, w):
    """Unsound: 0 per head."""
    return torch.zeros((*X.shape[:-2], w.h), dtype=X.dtype)


def my_nan(X, w):
    """Not a number: bounds nothing."""
    return torch.full((*X.shape[:-2], w.h), float("nan"), dtype=X.dtype)
'''


@pytest.fixture
def board(tmp_path, monkeypatch):
    (tmp_path / "myplug.py").write_text(textwrap.dedent(PLUGIN))
    exp = tmp_path / "fake_board.py"
    exp.write_text(EXP)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    discovery.load_all()
    discovery.load_module_file(exp)
    yield tmp_path
    catalog.unregister("_fake_board")
    for n in ("my_loose", "my_zero", "my_nan"):
        if n in bounds.bound_names():
            bounds.unregister_bound(n)
    sys.modules.pop("myplug", None)


def test_sound_plugin_joins_the_table_in_its_own_folder(board, capsys):
    import pandas as pd

    args = ["_fake_board", "--results-dir", str(board / "r"), "--no-progress", "--no-figures"]
    assert cli.main(args + ["--bound", "myplug:my_loose", "--executor", "process", "-j", "1"],
                    out=lambda *a: None) == 0
    (out,) = list((board / "r" / "custom").glob("*/_fake_board/table.csv"))
    assert out.parent.parent.name == "full__bound=myplug_my_loose" and not (board / "r" / "_fake_board").exists()
    t = pd.read_csv(out)
    assert {"castin", "my_loose"} <= set(t["method"]) and t["sound"].all()


def test_unsound_plugin_fails_the_run_and_is_named(board, capsys):
    rc = cli.main(["_fake_board", "--results-dir", str(board / "r"), "--no-progress", "--no-figures",
                   "--bound", "myplug:my_zero"], out=lambda *a: None)
    err = capsys.readouterr().err
    assert rc == 1 and "UNSOUND" in err and "my_zero" in err


def test_a_nan_plugin_is_unsound_not_fine(board, capsys):
    rc = cli.main(["_fake_board", "--results-dir", str(board / "r"), "--no-progress", "--no-figures",
                   "--bound", "myplug:my_nan"], out=lambda *a: None)
    err = capsys.readouterr().err
    assert rc == 1 and "UNSOUND" in err and "my_nan: 6 of 6 values are not a finite number" in err, err


def test_analyze_counts_a_nan_bound_as_unsound():
    import pandas as pd

    from harness.analyze import report

    nan = float("nan")
    df = pd.DataFrame({"method": ["a", "b", "c", "d", "kim"], "kind": ["upper", "upper", "lower", "upper", "upper"],
                       "value": [2.0, nan, nan, float("inf"), nan], "sound": [True] * 5,
                       "note": ["", "", "", "", "n/a: not proven for this score map"]})
    assert list(report.unsound(df)["method"]) == ["b", "d"]  # a NaN lower bound claims nothing; n/a is declared


def test_bad_plugin_is_a_usage_error(board, capsys):
    rc = cli.main(["_fake_board", "--dry-run", "--results-dir", str(board / "r"), "--bound", "myplug:nope"])
    assert rc == 2 and "cannot load" in capsys.readouterr().err


def test_a_lower_bound_of_zero_at_a_positive_truth_is_not_converged():
    import pandas as pd

    from harness.analyze import report

    df = pd.DataFrame({"kind": ["lower", "lower", "upper"], "value": [0.0, 1.5, 0.0], "truth": [2.0, 2.0, 2.0],
                       "converged": [True, True, True]})
    assert report.honest_convergence(df)["converged"].tolist() == [False, True, True]
