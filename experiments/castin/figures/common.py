"""What the Castin figures share: log-n axes, panel labels, the truth's tolerance and the measured map's note."""
from __future__ import annotations

def log_n_ticks(ax):
    """Plain major tick labels on the log n axis, no minor labels (they overlap on short ranges)."""
    from matplotlib.ticker import NullFormatter, ScalarFormatter

    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())


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
