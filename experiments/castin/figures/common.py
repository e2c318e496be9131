"""What the Castin figures share: log-n axes, sparse log-y minor labels, panel labels, the truth's tolerance and the
measured map's note."""
from __future__ import annotations

import math

from matplotlib.ticker import LogFormatterSciNotation


def log_n_ticks(ax):
    """Plain major tick labels on the log n axis, no minor labels (they overlap on short ranges)."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


class SparseLogFormatter(LogFormatterSciNotation):
    """Minor labels of a log axis that spans less than two labelled decades: of the multipliers {1, 3} (over more
    than a decade), {1, 2, 5}, {1, 2, 3, 5} (x a power of ten), the first that labels at least two ticks in view;
    Matplotlib's own choice, 2, 3, 4 and 6, crowds such an axis. Wider axes keep decade labels only."""

    def set_locs(self, locs=None):
        super().set_locs(locs)
        vmin, vmax = sorted(self.axis.get_view_interval())
        if self._sublabels is None or self._sublabels == {1} or vmin <= 0:
            return
        lo, hi = math.log10(vmin), math.log10(vmax)
        ticks = [c * 10.0 ** e for e in range(math.floor(lo), math.ceil(hi) + 1) for c in range(1, 10)]
        coeffs = [round(t / 10.0 ** math.floor(math.log10(t) + 1e-9)) for t in ticks if vmin <= t <= vmax]
        for subs in ([{1, 3}] if hi - lo > 1 else []) + [{1, 2, 5}, {1, 2, 3, 5}]:
            if sum(c in subs for c in coeffs) >= 2:
                self._sublabels = subs
                return


def sparse_log_y(ax):
    """Few minor labels on the log y axis of `ax` (SparseLogFormatter)."""
    ax.yaxis.set_minor_formatter(SparseLogFormatter(labelOnlyBase=False))


def panel_label(model, layer, masked=None, extra="", pretrained=True):
    from experiments.figures.common import layer_name, model_name

    m = "causal mask" if masked else "no mask"
    return f"{model_name(model, pretrained)}, {layer_name(model, layer)}" + ("" if masked is None else f"\n{m}") + \
        (f", {extra}" if extra else "")


def truth_tolerance(dtype: str) -> float:
    """The truth's Lanczos tolerance in `dtype` (harness.settings.truth_tol)."""
    from harness.settings import truth_tol

    return truth_tol(dtype)


def random_tag(g) -> str:
    """" (random)" for a random-init model's group, else ""."""
    return "" if g["pretrained"].iloc[0] else " (random)"


def loglog_n_axes(ax, ylabel):
    ax.set_xlabel("sequence length n (tokens)")
    ax.set_ylabel(ylabel)
    log_n_ticks(ax)


MAP_NOTE = {"layer": "map: multi-head attention layer with W^O and biases, no residual / LayerNorm",
            "self": "map: attention.self (heads concatenated, no W^O), as the authors' adversarial code"}


def map_note(table) -> str:
    maps = list(dict.fromkeys(table["map"])) if "map" in table.columns else []
    return " ".join(f"{MAP_NOTE.get(m, f'map {m}')}." for m in maps)


def paper_models(table) -> str:
    """'pretrained BERT-base and random-init GPT-2 (pretrained weights unreachable)': how the paper's models ran in
    this table (experiments.figures.common.weights_note), '' when the table has neither."""
    from experiments.figures.common import weights_note

    have = set(map(str, table["model"])) if "model" in table.columns else set()
    return " and ".join(weights_note(table, m) for m in ("bert-base-uncased", "gpt2") if m in have)

