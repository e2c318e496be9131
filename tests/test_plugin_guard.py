"""A plug-in bound is the user's code, called under guard (harness.plugins.guarded): it gets private copies of its
inputs, so writing into them changes no other bound; an exit, a result that is not numbers or no result within the
time limit is a PluginError naming it (one line and exit 2 from `attnlip analyze`), never a traceback, a hang or a
silent exit 0; a KeyboardInterrupt stays the user's interrupt."""
from __future__ import annotations

import re
import sys
import textwrap
import time

import numpy as np
import pytest
import torch

from harness import plugins
from harness.bounds import registry
from harness.errors import PluginError
from tests.test_cli_inputs import without_notes
from harness.kernels.attention import AttentionWeights

PLUGIN = '''
def exits(X, w):
    raise SystemExit(0)


def generator(X, w):
    return (v for v in range(w.h))
'''


@pytest.fixture
def plug(tmp_path, monkeypatch):
    (tmp_path / "guard_plug.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "guard_plug"
    sys.modules.pop("guard_plug", None)


@pytest.fixture
def registered():
    """Registers user bounds through register_bound; unregisters them afterwards."""
    names = []

    def add(fn, **kw):
        names.extend(b.name for b in registry.register_bound(fn, replace=True, **kw))

    yield add
    for n in set(names):
        registry.unregister_bound(n)


def _layer():
    g = torch.Generator().manual_seed(0)
    w = AttentionWeights.random(d=6, h=2, generator=g, dtype=torch.float64)
    return torch.randn(2, 5, 6, generator=g, dtype=torch.float64), w


def _weights(w):
    return [t.clone() for t in vars(w).values() if isinstance(t, torch.Tensor)]


def test_a_plugin_writing_into_its_inputs_changes_no_other_bound(registered):
    def scribbler(X, w, causal=False):
        X.mul_(3.0)
        for t in vars(w).values():
            if isinstance(t, torch.Tensor):
                t.mul_(3.0)
        return torch.full((*X.shape[:-2], w.h), 1e6, dtype=X.dtype)

    def scribbling_change(X, w, eps):
        X.zero_()
        return torch.full(X.shape[:-2], 1e6, dtype=X.dtype)

    registered(scribbler)
    registered(scribbling_change, scope="layer", bounds="ball_change")
    X, w = _layer()
    X0, w0 = X.clone(), _weights(w)
    names = ["castin", "jasmin", "lofast_fine"]
    clean = registry.evaluate(X.clone(), w, names=names)
    clean_changes = registry.ball_changes(clean.state, 0.01, ["fine", "second_order"])
    ev = registry.evaluate(X, w, names=names + ["scribbler"])
    changes = registry.ball_changes(ev.state, 0.01, ["scribbling_change", "fine", "second_order"])
    assert torch.equal(X, X0) and all(torch.equal(a, b) for a, b in zip(_weights(w), w0))
    for key, v in clean.values.items():
        assert torch.equal(ev.values[key], v), key
    for name, v in clean_changes.items():
        assert torch.equal(changes[name], v), name


@pytest.mark.parametrize("exc", [SystemExit(0), SystemExit("bye"), GeneratorExit()])
def test_a_plugin_that_exits_is_a_plugin_error(exc):
    def leaver(X, w):
        raise exc

    with pytest.raises(PluginError, match=f"plug-in mine:leaver exited \\({type(exc).__name__}"):
        plugins.guarded(leaver, "mine:leaver")(*_layer())


def test_a_keyboard_interrupt_stays_an_interrupt():
    def interrupted(X, w):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        plugins.guarded(interrupted, "mine:interrupted")(*_layer())


@pytest.mark.parametrize("result, what", [
    ((v for v in range(2)), "generator"), (object(), "object"), (torch.ones(2, dtype=torch.complex128), "complex128"),
    (torch.ones(2, dtype=torch.bool), "bool"), (np.array(["a", "b"]), "ndarray"), ([1.0, "x"], "list"),
    (True, "bool"), (None, "NoneType"), ("1.0", "str"), (torch.empty(2, device="meta"), "meta device"),
    (torch.ones(2).to_sparse(), "sparse_coo"),
])
def test_a_result_that_is_not_numbers_is_a_plugin_error(result, what):
    with pytest.raises(PluginError, match=f"plug-in mine:odd returned .*{what}.*not bound values"):
        plugins.guarded(lambda X, w: result, "mine:odd")(*_layer())


@pytest.mark.parametrize("result", [torch.ones(2), torch.ones(2, dtype=torch.int64), np.ones(2), [1.0, 2],
                                    (3, 4.5), 2.0, 7, np.float32(1.5), torch.tensor(float("nan"))])
def test_numbers_pass_unchanged(result):
    assert plugins.guarded(lambda X, w: result, "mine:fine")(*_layer()) is result


def test_a_plugin_that_does_not_return_is_stopped_at_the_time_limit(monkeypatch):
    monkeypatch.setenv(plugins.TIMEOUT_ENV, "0.2")

    def stuck(X, w):
        time.sleep(30)

    t0 = time.perf_counter()
    with pytest.raises(PluginError, match=r"plug-in mine:stuck did not return within 0.2 s .*ATTNLIP_PLUGIN_TIMEOUT"):
        plugins.guarded(stuck, "mine:stuck")(*_layer())
    assert time.perf_counter() - t0 < 5


def test_the_time_limit_setting_is_checked(monkeypatch):
    for bad in ("soon", "-1", "nan", "inf"):
        monkeypatch.setenv(plugins.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match="ATTNLIP_PLUGIN_TIMEOUT"):
            plugins.guarded(lambda X, w: 1.0, "mine:any")
    monkeypatch.setenv(plugins.TIMEOUT_ENV, "0")  # no limit: called in the caller's thread
    assert plugins.timeout_s() == 0 and plugins.guarded(lambda X, w: 1.0, "mine:any")(*_layer()) == 1.0


def test_the_plugin_runs_in_the_callers_grad_mode():
    seen = []
    fn = plugins.guarded(lambda X, w: seen.append(torch.is_grad_enabled()) or 1.0, "mine:mode")
    with torch.no_grad():
        fn(*_layer())
    fn(*_layer())
    assert seen == [False, True]


def test_register_bound_guards_a_plain_function(registered):
    registered(lambda X, w: (v for v in range(w.h)), name="gen_bound")
    with pytest.raises(PluginError, match="gen_bound|<lambda>"):
        registry.evaluate(*_layer(), names=["gen_bound"])


@pytest.mark.parametrize("fn, message", [("exits", "plug-in guard_plug:exits exited (SystemExit: 0)"),
                                         ("generator", "plug-in guard_plug:generator returned generator")])
def test_analyze_reports_a_bad_plugin_in_one_line(plug, capsys, fn, message):
    from harness.analyze import cli

    rc = cli.main(["--model", "tiny-bert", "--text", "The cat sat on the mat.", "--layers", "0", "--eps", "0",
                   "--pgd-steps", "0", "--bound", f"{plug}:{fn}", "--no-progress"])
    out, err = capsys.readouterr()
    err = without_notes(err)
    assert rc == 2 and err.count("\n") == 1 and err.startswith("attnlip analyze: error: ") and message in err, err
    assert "Traceback" not in err + out and fn not in registry.bound_names()


@pytest.mark.parametrize("body, message", [("raise SystemExit(0)", "exited while imported (SystemExit: 0)"),
                                           ("import time\ntime.sleep(30)", "did not return within 0.2 s")])
def test_a_plugin_module_that_exits_or_hangs_while_imported_is_named(tmp_path, monkeypatch, body, message):
    """The module's own code runs at load: it may not end the command, and it is under the time limit too."""
    name = f"bad_import_{abs(hash(body))}"
    (tmp_path / f"{name}.py").write_text(body + "\n\ndef f(X, w):\n    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(plugins.TIMEOUT_ENV, "0.2")
    with pytest.raises(PluginError, match=re.escape(message)):
        plugins.load_function(f"{name}:f")


def test_a_plugin_error_in_a_cell_is_one_line_without_traceback(tmp_path, monkeypatch, capsys):
    """A plug-in's failure inside a run's cell is the user's code: the run names it in one line (the cell failed,
    the others computed), never with a traceback of ours."""
    from harness import cli
    from tests._harness_fakes import registered_fakes

    for _ in registered_fakes(tmp_path, monkeypatch, "fake_plugin_cell"):
        monkeypatch.setenv("ATTNLIP_TEST_PLUGIN", "2")
        rc = cli.main(["_fake_squares", "--results-dir", str(tmp_path / "r"), "--no-figures", "--no-progress"],
                      out=lambda *a: None)
        err = capsys.readouterr().err
        assert rc == 1 and "plug-in fake:bound raised ValueError: bad input" in err, err
        assert "Traceback" not in err, err
