"""House style for every AttnLip figure: figure(), save() -> [png, pdf], log-log helpers, substitute notes.

Figures are drawn from result tables only (never recompute). Colors are fixed per bound family so the same
quantity looks the same across experiments: use `color("castin")` etc.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple

os.environ.setdefault("MPLBACKEND", "Agg")
import matplotlib  # noqa: E402

matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

STYLE = {
    "figure.dpi": 110,
    "savefig.dpi": 150,
    "savefig.bbox": "tight",
    "font.size": 9,
    "axes.titlesize": 9,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "grid.linewidth": 0.5,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "lines.linewidth": 1.5,
    "lines.markersize": 4,
    "legend.frameon": False,
    "image.cmap": "viridis",
    "pdf.fonttype": 3,  # subset Type 3 fonts: small, fast PDFs (42 embeds whole TTFs: ~2 s per figure)
}

# One color per quantity family, consistent across all figures (colorblind-safe Okabe-Ito palette).
COLORS = {
    "exact": "#000000", "lipschitz": "#000000", "pgd": "#555555", "lower": "#555555",
    "lofast": "#0072B2", "jasmin": "#D55E00", "castin": "#009E73", "kim": "#CC79A7",
    "specformer": "#CC79A7", "naive": "#999999", "g1": "#D55E00", "paper": "#E69F00", "ours": "#56B4E9",
}
_CYCLE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000"]


def color(name: str) -> str:
    """The house color of a quantity/bound family (prefix match, e.g. 'bound_castin' -> castin)."""
    key = name.lower()
    for k, c in COLORS.items():
        if k in key:
            return c
    return _CYCLE[abs(hash(key)) % len(_CYCLE)]


def figure(nrows: int = 1, ncols: int = 1, width: Optional[float] = None, height: Optional[float] = None,
           squeeze: bool = True, **kw) -> Tuple[plt.Figure, object]:
    """A new figure in house style: (fig, axes). Default panel 3.4 x 2.8 inches."""
    plt.rcParams.update(STYLE)
    w = width if width is not None else 3.4 * ncols
    h = height if height is not None else 2.8 * nrows
    return plt.subplots(nrows, ncols, figsize=(w, h), squeeze=squeeze, constrained_layout=True, **kw)


def save(fig: plt.Figure, outdir, stem: str, formats: Sequence[str] = ("png", "pdf")) -> List[Path]:
    """Save `fig` as <outdir>/<stem>.png and .pdf (deterministic metadata), close it, return the paths."""
    if not stem or "/" in stem:
        raise ValueError(f"figure stem must be a plain file name, got {stem!r}")
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    paths = []
    for fmt in formats:
        p = outdir / f"{stem}.{fmt}"
        meta = {"CreationDate": None, "Producer": None} if fmt == "pdf" else {"Software": None} if fmt == "png" else None
        fig.savefig(p, format=fmt, metadata=meta)
        paths.append(p)
    plt.close(fig)
    return paths


def loglog(ax, x, y, label: Optional[str] = None, key: Optional[str] = None, **kw):
    """Log-log line (+markers) in the family color of `key` (or of `label`)."""
    kw.setdefault("marker", "o")
    c = kw.pop("color", None) or color(key or label or "")
    line, = ax.loglog(np.asarray(x), np.asarray(y), label=label, color=c, **kw)
    return line


def semilogy(ax, x, y, label: Optional[str] = None, key: Optional[str] = None, **kw):
    """Linear x, log y, in the family color."""
    kw.setdefault("marker", "o")
    c = kw.pop("color", None) or color(key or label or "")
    line, = ax.semilogy(np.asarray(x), np.asarray(y), label=label, color=c, **kw)
    return line


def slope_guide(ax, x: Iterable[float], slope: float, anchor: Tuple[float, float], label: Optional[str] = None,
                **kw):
    """Reference power law y = anchor_y (x / anchor_x)^slope (dashed gray), e.g. slope 0.5 for sqrt(n)."""
    x = np.asarray(list(x), dtype=float)
    x0, y0 = anchor
    kw.setdefault("color", "#888888")
    kw.setdefault("linestyle", "--")
    kw.setdefault("linewidth", 1.0)
    line, = ax.plot(x, y0 * (x / x0) ** slope, label=label if label is not None else f"slope {slope:g}", **kw)
    return line


def fit_slope(x, y) -> float:
    """Least-squares slope of log y against log x (the empirical exponent of a power law)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    ok = (x > 0) & (y > 0) & np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 2:
        return float("nan")
    return float(np.polyfit(np.log(x[ok]), np.log(y[ok]), 1)[0])


def footnote(fig: plt.Figure, text: str, fontsize: float = 7, y: float = -0.01):
    """A small italic note under the figure, e.g. 'substitute: MiniLM-L6 instead of BERT-base (offline)'."""
    return fig.text(0.01, y, text, ha="left", va="top", fontsize=fontsize, style="italic", color="#444444",
                    wrap=True, transform=fig.transFigure)


def substitute_note(fig: plt.Figure, paper: str, ours: str, why: str = "not available offline"):
    """Footnote for figures using a substitute model/data: 'Paper: X. Here: Y (why).'"""
    return footnote(fig, f"Paper: {paper}. Here: {ours} ({why}).")


def share_x(fig: plt.Figure, axes) -> Tuple[float, float]:
    """One x-range for `axes` (the union of their current ranges), declared on `fig` so that a check can see it:
    panels whose x values are the same quantity compare by eye only on a common axis. Returns the range."""
    axes = list(axes)
    lims = [ax.get_xlim() for ax in axes]
    lo, hi = min(min(a, b) for a, b in lims), max(max(a, b) for a, b in lims)
    for ax in axes:
        ax.set_xlim(lo, hi)
    fig.shared_x_axes = axes  # read by tests/test_figures.py
    return lo, hi


def caption(ax, text: str):
    """Panel title in house style (small, left-aligned)."""
    ax.set_title(text, loc="left")


# ---- layout rules every experiment figure follows (tests/test_figures.py checks them) -----------------------------
MAX_ASPECT = 3.5  # width / height of a saved image, so it reads at the README's width
MAX_PANELS = 16  # data panels per image; more are split over several images


def chunks(items: Sequence, size: int = MAX_PANELS) -> List[list]:
    """`items` in as few consecutive pieces of at most `size` as possible, of near-equal length (one image per
    piece: 20 panels -> 10 + 10, not 16 + 4)."""
    items = list(items)
    k = max(1, -(-len(items) // size))
    step = -(-len(items) // k) if items else 1
    return [items[i:i + step] for i in range(0, len(items), step)] or [[]]


def grid(n: int, ncols: Optional[int] = None, panel: Tuple[float, float] = (3.0, 2.5), max_cols: int = 4,
         **kw) -> Tuple[plt.Figure, list]:
    """A figure with `n` panels laid out as a grid (at most `max_cols` columns, never a one-row strip of more):
    (fig, list of the n axes); the unused cells of the last row are removed."""
    ncols = ncols or min(max_cols, max(n, 1))
    nrows = max(1, -(-n // ncols))
    fig, axes = figure(nrows, ncols, width=panel[0] * ncols, height=panel[1] * nrows, squeeze=False, **kw)
    flat = list(axes.flat)
    for ax in flat[n:]:
        fig.delaxes(ax)
    return fig, flat[:n]


MARKERS = ["o", "s", "^", "D", "v", "P", "X"]
HATCHES = ["", "//", "..", "xx"]


def styles(n: int) -> List[dict]:
    """`n` distinguishable series styles {color, marker, hatch}: Okabe-Ito colours up to 7, tab10 up to 10,
    then tab10 again with another hatch (bars) and a different marker (lines): no two series look alike."""
    if n <= 7:
        cols = [c for c in _CYCLE if c != "#F0E442"]  # yellow reads badly on white
    else:
        cols = [matplotlib.colors.to_hex(c) for c in plt.get_cmap("tab10").colors]
    return [dict(color=cols[i % len(cols)], marker=MARKERS[i % len(MARKERS)], hatch=HATCHES[(i // len(cols)) % 4])
            for i in range(n)]


def _bottom(fig: plt.Figure, artists) -> float:
    """Lowest figure-fraction y of `artists` as drawn (layout done)."""
    r = fig.canvas.get_renderer()
    ys = [a.get_tightbbox(r).y0 for a in artists if a.get_visible() and a.get_tightbbox(r) is not None]
    return min(ys) / fig.bbox.height if ys else 0.0


def outside_legend(fig: plt.Figure, ncol: Optional[int] = None, handles=None, labels=None):
    """One legend for the whole figure, centred under every panel (outside the data): the distinct labelled
    artists of all panels (or `handles`/`labels`), after removing any per-panel legend. Freezes the layout."""
    if handles is None:
        seen = {}
        for ax in fig.axes:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                seen.setdefault(lab, h)
        labels, handles = list(seen), list(seen.values())
    for ax in fig.axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    fig.draw_without_rendering()  # run the layout, then keep it: the legend goes under it
    fig.set_layout_engine("none")
    if not handles:
        return None
    ncol = ncol or min(len(handles), 3 if max(len(str(s)) for s in labels) > 30 else 4)
    y = _bottom(fig, fig.axes) - 0.01
    return fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, y), ncol=ncol, fontsize=8,
                      bbox_transform=fig.transFigure)


# The verdict of the experiment whose figures are being drawn ("partly reproduced", ...), as its summary states
# it: harness.run.outputs.render_figures sets it around exp.figures, so every title carries the README's verdict.
VERDICT = {"label": ""}


@contextmanager
def verdict(label: str):
    """Figures drawn inside carry `label` ('' for none) as the verdict in their titles."""
    before = VERDICT["label"]
    VERDICT["label"] = label
    try:
        yield
    finally:
        VERDICT["label"] = before


def headline(ref: str, label: Optional[str] = None) -> str:
    """'<paper figure>: verdict <label>' (the experiment's verdict, never a claim it does not make); without a
    verdict 'Checks <paper figure>'. A ref that already says what it does (Extends / Measures / Checks) keeps its
    verb; a leading 'Reproduces' is dropped, since only the verdict may say so."""
    label = VERDICT["label"] if label is None else label
    verb, _, rest = ref.partition(" ")
    if verb == "Reproduces":
        ref, verb = rest, ""
    if label:
        return f"{ref}: verdict {label}"
    return ref if verb in ("Extends", "Checks", "Measures") else f"Checks {ref}"


def finish(fig: plt.Figure, outdir, stem: str, ref: str, title: str = "", note: str = "",
           legend: bool = True, ncol: Optional[int] = None) -> List[Path]:
    """Title ('<title>' over '<ref>: verdict <verdict>', see headline), one legend under the panels, the
    substitutions / codes as a footnote under everything, then save() -> [png, pdf]. `ref` is the paper figure
    (figures_ref entry)."""
    head = headline(ref)
    fig.suptitle(f"{title}\n{head}" if title else head, fontsize=9)
    if legend:
        outside_legend(fig, ncol=ncol)
    if note:
        fig.draw_without_rendering()
        footnote(fig, note, y=min(-0.01, _bottom(fig, fig.axes + fig.legends) - 0.015))
    return save(fig, outdir, stem)
