"""Every figure an experiment draws reads at the README's width: aspect ratio <= 3.5, at most 16 data
panels per image, every data panel with an x and a y label (a figure-level supxlabel / supylabel counts for every
panel; a colorbar needs a label on its long axis), at most one legend per image, and a title (the paper figure).
An experiment that declares substitutes (registry.Substitute) says in every image's footnote what the paper used
and what stands in for it here.

Figures are built from each registered experiment's test-scale table: the same run as the smoke test, on its
session cache (`experiment_cache`), so after the smoke test only the rendering is timed here. The check sits in
Figure.savefig, so it sees each Figure as it is written."""
from __future__ import annotations

from pathlib import Path

import matplotlib.figure
import matplotlib.ticker
import numpy as np
import pytest
from PIL import Image

from harness import plotting, catalog
from harness import run as runner

NAMES = catalog.list_experiments()
REPO = Path(__file__).resolve().parent.parent


def _has_data(ax) -> bool:
    return bool(ax.get_visible() and (ax.lines or ax.collections or ax.images or ax.patches or ax.containers))


def _sup(fig, which: str) -> str:
    t = getattr(fig, f"_sup{which}label", None)
    return t.get_text().strip() if t is not None else ""


def _ys(ax) -> list:
    """Every y value (data coordinates) the artists of `ax` draw at: lines, markers, bars, box patches."""
    ys = []
    for ln in ax.lines:
        ys += [float(y) for y in np.asarray(ln.get_ydata(), float).ravel()]
    for c in ax.collections:
        ys += [float(y) for y in np.asarray(c.get_offsets(), float).reshape(-1, 2)[:, 1]]
    for p in ax.patches:
        ys += [float(y) for y in p.get_path().transformed(p.get_patch_transform()).vertices[:, 1]]
    return [y for y in ys if np.isfinite(y)]


def _is_word(label: str) -> bool:
    try:
        float(label.replace("\u2212", "-"))
        return False
    except ValueError:
        return bool(label.strip())


def empty_rows(ax) -> list:
    """Labelled categorical y ticks (set_yticks with labels) with nothing drawn in their row: a legend-like row
    that promises a series the panel does not have."""
    if ax.images or not isinstance(ax.yaxis.get_major_locator(), matplotlib.ticker.FixedLocator):
        return []
    ticks, labels = ax.get_yticks(), [t.get_text() for t in ax.get_yticklabels()]
    if len(ticks) < 2 or not any(_is_word(lab) for lab in labels):
        return []
    half, ys = np.min(np.diff(np.sort(ticks))) / 2, np.asarray(_ys(ax))
    return [lab for t, lab in zip(ticks, labels)
            if lab.strip() and not (len(ys) and (np.abs(ys - t) < half).any())]


def figure_problems(fig) -> list:
    """What a reader would miss in `fig`: unlabelled axes, extra legends, too many panels, no title, empty panels
    or rows, panels declared to share an x-range (plotting.share_x) that do not."""
    bad, panels = [], 0
    for i, ax in enumerate(fig.axes):
        if not _has_data(ax):
            if ax.get_visible() and ax.axison and not ax.texts and getattr(ax, "_colorbar", None) is None:
                bad.append(f"{ax.get_title(loc='left') or ax.get_title() or f'axes {i}'!r}: empty panel")
            continue
        cb = getattr(ax, "_colorbar", None)
        if cb is not None:
            long_axis = ax.yaxis if cb.orientation == "vertical" else ax.xaxis
            if not long_axis.get_label().get_text().strip():
                bad.append(f"colorbar {i}: no label")
            continue
        panels += 1
        name = ax.get_title(loc="left") or ax.get_title() or f"axes {i}"
        if not (ax.get_xlabel().strip() or _sup(fig, "x")):
            bad.append(f"{name!r}: no x label")
        if not (ax.get_ylabel().strip() or _sup(fig, "y")):
            bad.append(f"{name!r}: no y label")
        rows = empty_rows(ax)
        if rows:
            bad.append(f"{name!r}: empty rows {rows}")
    shared = getattr(fig, "shared_x_axes", [])
    if len({tuple(np.round(ax.get_xlim(), 9)) for ax in shared}) > 1:
        bad.append("panels declared to share one x-range (plotting.share_x) show different ranges")
    legends = len(fig.legends) + sum(ax.get_legend() is not None for ax in fig.axes)
    if legends > 1:
        bad.append(f"{legends} legends (one per image, outside the data)")
    if panels > plotting.MAX_PANELS:
        bad.append(f"{panels} data panels (at most {plotting.MAX_PANELS}: split the image)")
    if fig._suptitle is None or not fig._suptitle.get_text().strip():
        bad.append("no suptitle naming the paper figure it reproduces")
    return bad


def _norm(text: str) -> str:
    return "".join(c for c in str(text).lower() if c.isalnum())


def substitute_problems(exp, notes: str, table) -> list:
    """What the figure text `notes` (footnotes, not the title) leaves out of `exp`'s declared substitutes: each
    Substitute's paper item ('CIFAR-10', 'GPT-2') and what ran instead: the data of the table's `dataset` column
    ('Fashion-MNIST'), or for a model the random-init stand-in."""
    from experiments.figures import common as common_figures

    text, bad = _norm(notes), []
    for s in getattr(exp, "substitutes", ()) or ():
        paper = common_figures.MODEL_NAMES.get(str(s.paper), s.label.replace("pretrained ", "")) if s.key == "model" \
            else (s.label or str(s.paper))
        if _norm(paper) not in text:
            bad.append(f"the paper's {s.key} {paper!r} not named")
        here = "random" if s.key == "model" else common_figures.dataset_name(table, default=str(s.use))
        if _norm(here) not in text:
            bad.append(f"its stand-in {here!r} not named")
    return bad


class Saved(dict):
    """{file name: problems} and, in .notes, {file name: the figure's text outside its title}."""
    notes: dict


@pytest.fixture
def saved(monkeypatch):
    """Every Figure.savefig of the test: {file name: problems}; PDFs are skipped (same Figure as the PNG)."""
    found = Saved()
    found.notes = {}
    original = matplotlib.figure.Figure.savefig

    def savefig(fig, fname, *a, **kw):
        name = str(getattr(fname, "name", fname))
        if kw.get("format", name.rsplit(".", 1)[-1]) != "png":
            return None
        problems = figure_problems(fig)
        original(fig, fname, *a, **{**kw, "dpi": 40})  # the aspect ratio does not depend on dpi; 40 is fast
        with Image.open(fname) as im:
            w, h = im.size
        if w / h > plotting.MAX_ASPECT:
            problems.append(f"aspect ratio {w}x{h} = {w / h:.2f} > {plotting.MAX_ASPECT}")
        found[name.rsplit("/", 1)[-1]] = problems
        found.notes[name.rsplit("/", 1)[-1]] = " ".join(t.get_text() for t in fig.texts if t is not fig._suptitle)
        return None

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", savefig)
    return found


@pytest.mark.parametrize("name", NAMES)
def test_figures_readable(name, tmp_path, experiment_cache, saved):
    cfg = runner.RunConfig(scale="test", results_dir=tmp_path / "results", cache_dir=experiment_cache, progress=False)
    (res,) = runner.run([name], cfg, echo=lambda *a: None)
    if res.missing_data and not res.computed:
        pytest.skip(f"{name}: missing data: {res.errors[0]['error']}")
    assert res.figure_error is None, res.figure_error
    assert saved, f"{name}: no PNG written"
    bad = {f: p for f, p in saved.items() if p}
    assert not bad, f"{name}: " + "; ".join(f"{f}: {', '.join(p)}" for f, p in bad.items())
    exp = catalog.get_experiment(name)
    if exp.substitutes:
        import pandas as pd

        (path,) = (tmp_path / "results").glob(f"**/{name}/table.parquet")
        table = pd.read_parquet(path)
        subs = {f: substitute_problems(exp, n, table) for f, n in saved.notes.items()}
        subs = {f: p for f, p in subs.items() if p}
        assert not subs, f"{name}: footnote " + "; ".join(f"{f}: {', '.join(p)}" for f, p in subs.items())


def test_substitute_check_can_fail(saved, tmp_path):
    """A figure of an experiment with a CIFAR-10 -> Fashion-MNIST substitute fails without a footnote and with
    one naming only the paper's data; it passes once the footnote also names what ran."""
    import pandas as pd

    exp = catalog.get_experiment("lofast_ablation")
    table = pd.DataFrame({"dataset": ["fashion_mnist"]})
    for stem, note in (("none", ""), ("half", "Paper: a CIFAR-10 ViT."), ("full", "Paper: CIFAR-10. Here: "
                                                                              "Fashion-MNIST LipViT.")):
        fig, ax = plotting.figure()
        ax.plot([0, 1], [0, 1])
        plotting.finish(fig, tmp_path, stem, "Fig. 1", note=note)
    assert len(substitute_problems(exp, saved.notes["none.png"], table)) == 2
    assert substitute_problems(exp, saved.notes["half.png"], table) == ["its stand-in 'Fashion-MNIST' not named"]
    assert substitute_problems(exp, saved.notes["full.png"], table) == []


def test_checker_catches_a_strip(saved, tmp_path):
    """The check can fail: a 1 x 8 strip with unlabelled axes and two legends is rejected on each count."""
    fig, axes = plotting.figure(1, 8, width=16, height=2)
    for ax in axes:
        ax.plot([0, 1], [0, 1], label="a")
    axes[0].legend()
    axes[1].legend()
    plotting.save(fig, tmp_path, "strip")
    p = " ".join(saved["strip.png"])
    assert "aspect ratio" in p and "no x label" in p and "2 legends" in p and "no suptitle" in p


def test_checker_catches_empty_rows_panels_and_unshared_x(saved, tmp_path):
    """A categorical row with no box, an empty panel and a declared shared x-range that one panel leaves: each is
    named; the same figure with every row filled and the range shared passes."""
    def draw(fill: bool, share: bool, blank: bool):
        fig, axes = plotting.figure(1, 3, height=3.2)
        for ax, hi in zip(axes[:2], (3, 9)):
            ax.boxplot([[1, 2, hi], [0, 1, 2]] if fill else [[1, 2, hi]], positions=[1, 2] if fill else [1],
                       orientation="horizontal")
            ax.set_yticks([1, 2], ["bound a", "bound b"])
            ax.set_xlabel("x")
            ax.set_ylabel("y")
        if share:
            plotting.share_x(fig, axes[:2])
        else:
            fig.shared_x_axes = list(axes[:2])
        if blank:
            axes[2].set_title("nothing here")
        else:
            fig.delaxes(axes[2])
        fig.suptitle("t")
        return fig

    plotting.save(draw(False, False, True), tmp_path, "bad")
    p = " ".join(saved["bad.png"])
    assert "empty rows ['bound b']" in p and "'nothing here': empty panel" in p and "share one x-range" in p, p
    plotting.save(draw(True, True, False), tmp_path, "good")
    assert saved["good.png"] == []


def test_committed_figures_aspect():
    """The PNGs committed under results/ (what results/README.md shows) keep the aspect ratio too."""
    wide = []
    for p in sorted((REPO / "results").glob("**/figures/*.png")):
        with Image.open(p) as im:
            w, h = im.size
        if w / h > plotting.MAX_ASPECT:
            wide.append(f"{p.relative_to(REPO)}: {w}x{h}")
    assert not wide, "regenerate with run_all.py <exp> --collect: " + ", ".join(wide)


def test_chunks_are_balanced_and_grid_is_not_a_strip():
    assert [len(c) for c in plotting.chunks(range(20))] == [10, 10]
    assert [len(c) for c in plotting.chunks(range(72))] == [15, 15, 15, 15, 12]
    assert plotting.chunks([]) == [[]]
    fig, axes = plotting.grid(7)
    assert len(axes) == 7 and len(fig.axes) == 7 and axes[4].get_subplotspec().rowspan.start == 1
