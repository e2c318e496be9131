"""The bound registry is the only list of bounds: certification takes its bounds from it, the same bound gives the
same value in the registry, the certificates and analyze, and a user's finite-eps (ball-change) plug-in certifies
beside the paper's bounds with the same PGD check (an unsound one fails the run)."""
from __future__ import annotations

import pathlib
import re
import sys
import textwrap

import pytest
import torch

from harness.bounds import lofast
from harness.bounds import registry as R
from harness.bounds.input_state import InputState
from harness.kernels.attention import AttentionWeights
from harness.models import certify

DT = torch.float64
ROOT = pathlib.Path(__file__).resolve().parents[1]

PLUGIN = '''
from harness.bounds import lofast


def good_bound(X, w, eps, causal=False):
    """Theorem 1 with xi_l on the residual map, 1 % slack: sound."""
    return 1.01 * lofast.delta(X, w, eps, residual=True, fine=False)


def bad_bound(X, w, eps, causal=False):
    """0.01 eps: unsound."""
    return 0.01 * eps * X.new_ones(X.shape[:-2])


for f in (good_bound, bad_bound):
    f.scope, f.bounds, f.residual = "layer", "ball_change", True
'''


@pytest.fixture
def plug(tmp_path, monkeypatch):
    (tmp_path / "bl_plug.py").write_text(textwrap.dedent(PLUGIN))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    yield tmp_path
    for n in ("good_bound", "bad_bound", "renamed"):
        if n in R.bound_names():
            R.unregister_bound(n)
    sys.modules.pop("bl_plug", None)


def _case(seed=0, B=3, n=5, d=8, h=2):
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d=d, h=h, generator=g, dtype=DT)
    X = torch.randn(B, n, d, generator=g, dtype=DT)
    return X / X.norm(dim=-1, keepdim=True), w


def test_certificates_are_the_registrys_ball_change_bounds():
    ball = [b for b in R.bounds(what="ball_change") if not b.user]
    names = tuple(b.name for b in ball)
    assert names == certify.BOUNDS + ("second_order", "best") == tuple(R.ball_change_names())
    assert certify.BOUNDS == ("naive", "coarse", "fine", "sharp", "refined")
    assert all(b.scope == "layer" for b in ball)
    assert all((b.theorem1 is not None) == (b.name in certify.BOUNDS) for b in ball)
    assert R.best_members() == list(names[:-1])  # "best" is the minimum of every other built-in certificate
    assert set(certify.NEEDS_M) == {"fine", "sharp", "refined"}
    ev = R.evaluate(*_case(), names=["castin", "fine"])  # evaluate: local values only (a ball change needs eps)
    assert ("castin", "head") in ev.values and ("fine", "layer") not in ev.values
    with pytest.raises(ValueError, match="scope='layer'"):
        R.register_bound(lambda X, w, eps: eps, name="headwise", bounds="ball_change")


def test_no_list_of_bound_names_outside_the_registry():
    """No literal sequence of two registered bound names in computing code (presentation modules may key labels)."""
    names = "|".join(map(re.escape, R.bound_names()))
    pat = re.compile(r'["\'](%s)["\']\s*,\s*["\'](%s)["\']' % (names, names))
    files = [p for p in (ROOT / "harness").rglob("*.py") if p.name != "ball_change.py"]
    files += [p for p in (ROOT / "experiments").rglob("*.py") if "figures" not in p.parts]
    hits = [f"{p.relative_to(ROOT)}:{i}" for p in files for i, line in enumerate(p.read_text().splitlines(), 1)
            if pat.search(line)]
    assert not hits, hits


def test_same_bound_same_value_in_registry_certificates_lofast_and_analyze():
    from harness.analyze.core import AnalyzeState, _extra
    from harness.analyze.options import AnalyzeOptions

    X, w = _case(1)
    e = torch.full((X.shape[0],), 0.05, dtype=DT)
    t = certify.layer_terms(X, w, residual=False)
    s = InputState(X, w)
    for name in certify.BOUNDS:
        reg = R.get(name, "layer").fn(s, e)
        assert torch.allclose(reg, certify.layer_delta(t, e, name), rtol=1e-9), name
    assert torch.allclose(R.get("fine", "layer").fn(s, e), lofast.delta(X, w, e, residual=False), rtol=1e-9)
    extra = _extra(AnalyzeState(X, w), AnalyzeOptions(eps=0.05, pgd_steps=0), set(R.ball_change_names()))
    for name in certify.BOUNDS:  # analyze reports every certificate under its registry name, / eps
        val, _ = extra[(name, "layer")]
        assert torch.allclose(val * 0.05, certify.layer_delta(t, e, name), rtol=1e-9), name
    assert {k for k in extra if k[0] in R.ball_change_names()} == {(b, "layer") for b in R.ball_change_names()}
    for name in certify.CERTIFICATES:  # from the certified truth (AnalyzeState), so not below the plain one
        assert (extra[(name, "layer")][0] * 0.05 >= R.get(name, "layer").fn(s, e) * (1 - 1e-12)).all(), name


def test_plugin_honours_scope_name_and_kind(plug):
    import bl_plug

    bl_plug.good_bound.bound_name = "renamed"
    (b,) = R.register_plugin("bl_plug:good_bound")
    assert (b.name, b.scope, b.bounds, b.residual, b.user) == ("renamed", "layer", "ball_change", True, True)
    assert "renamed" in R.ball_change_names() and "renamed" not in certify.BOUNDS
    assert "renamed" not in R.bound_names(what=R.LOCAL)  # never evaluated as a local constant


def test_plugin_certifies_and_an_unsound_one_is_counted(plug):
    from harness.models.lipvit import LipViT
    from harness.models.lofast_eval import certify_rows

    torch.manual_seed(0)
    m = LipViT(image_size=28, patch=14, d=16, depth=1, heads=2, vo_norm=0.5).double().eval()
    X = torch.rand(8, 1, 28, 28, dtype=DT)
    with torch.no_grad():
        y = m(X).argmax(-1)  # every point correct: certification is decided by the bound alone
    for spec in ("bl_plug:good_bound", "bl_plug:bad_bound"):
        R.register_plugin(spec)
    rows = certify_rows(m, X, y, [0.0, 1.0, 4.0], pgd_steps=10, pgd_restarts=1)
    curve = lambda b: [r for r in rows if r["kind"] == "curve" and r["bound"] == b]  # noqa: E731
    assert {r["bound"] for r in rows} >= set(certify.BOUNDS) | {"good_bound", "bad_bound"}
    assert sum(r["violations"] for r in curve("good_bound")) == 0
    assert all(r["guarantee"] == 0.0 for r in curve("good_bound"))
    assert sum(r["violations"] for r in curve("bad_bound")) > 0
    radius = lambda b: [r["radius"] for r in rows if r["kind"] == "radius" and r["bound"] == b]  # noqa: E731
    assert all(rb > 2 * rr > 0 for rb, rr in zip(radius("bad_bound"), radius("refined")))  # 0.01 eps claims far more


def _run(plug, bound):
    from harness import cli

    return cli.main(["lofast_certified", "--scale", "test", "--set", "epochs=[4]", "--bound", bound,
                     "--results-dir", str(plug / "r"), "--no-progress", "--no-figures"], out=lambda *a: None)


def test_run_all_plugin_certifies_and_unsound_fails(plug, capsys):
    import pandas as pd

    assert _run(plug, "bl_plug:good_bound") == 0
    (table,) = list((plug / "r" / "custom").glob("*bound=bl_plug_good_bound/lofast_certified/table.csv"))
    t = pd.read_csv(table)
    assert {"good_bound", "fine", "refined"} <= set(t["bound"]) and int(t["violations"].clip(lower=0).sum()) == 0
    capsys.readouterr()
    assert _run(plug, "bl_plug:bad_bound") == 1
    err = capsys.readouterr().err
    assert "UNSOUND" in err and "bad_bound" in err and "broken by PGD" in err
