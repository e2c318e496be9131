"""Shared presentation of every experiment figure (imported only inside figures()/summary()): the paper figure an
experiment reproduces, readable layer names, and faceted images (one panel per group, split into several
images of at most plotting.MAX_PANELS panels; each with a title, one outside legend and a footnote)."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

from harness import plotting

N_LAYERS = {"minilm": 6, "all-minilm-l6-v2": 6, "bert-base-uncased": 12, "gpt2": 12}

SUBSTITUTES = {
    "minilm": "pretrained MiniLM-L6 (all-MiniLM-L6-v2, BERT family) stands in for pretrained BERT-base",
    "bert-base-uncased": "BERT-base with random weights (no BERT-base weights offline)",
    "gpt2": "GPT-2 with random weights (no GPT-2 weights offline)",
    "vit": "a small ViT trained here on Fashion-MNIST (CPU budget; no CIFAR / ViT-B offline)",
    "tiny-bert": "tiny random BERT (test scale)",
}


DATASETS = {"fashion_mnist": "Fashion-MNIST", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100",
            "synthetic": "synthetic test-scale images"}


def dataset_name(table, default: str = "fashion_mnist") -> str:
    """The image data the table's ViT rows ran on, readable ('Fashion-MNIST'): read from its `dataset` column (the
    cell that ran, after harness.run.substitutes swapped in a stand-in), else the committed setting `default`."""
    ran = [str(v) for v in (table["dataset"].dropna().unique() if "dataset" in table.columns else [])
           if str(v) in DATASETS]
    return " / ".join(DATASETS[v] for v in dict.fromkeys(ran)) or DATASETS.get(default, default)


def lipvit_name(table) -> str:
    """'Fashion-MNIST LipViT' (the data the table's Lipschitz ViT was trained on)."""
    return f"{dataset_name(table)} LipViT"


def ref(table, i: int = 0) -> str:
    """The paper figure the table's experiment reproduces (its figures_ref[i]); '' for an unregistered one."""
    from harness import registry

    try:
        return registry.get_experiment(str(table["experiment"].iloc[0])).figures_ref[i]
    except (KeyError, IndexError, AttributeError):
        return ""


MODEL_NAMES = {"minilm": "MiniLM-L6", "bert-base-uncased": "BERT-base", "gpt2": "GPT-2", "vit": "ViT",
               "tiny-bert": "tiny BERT"}


def model_name(model, pretrained=None) -> str:
    """'MiniLM-L6', 'GPT-2 (random weights)' (BERT-base and GPT-2 are random unless a table says otherwise)."""
    base, _, rest = str(model).partition(" (")  # 'vit (JaSMin k=10 ...)': a ViT trained with a regularizer
    if pretrained is None or pretrained == "auto":
        pretrained = base not in ("gpt2", "bert-base-uncased")
    return MODEL_NAMES.get(base, base) + (f" ({rest}" if rest else "") + ("" if pretrained else " (random weights)")


def layer_name(model, layer) -> str:
    """'L0', or for a negative index 'last layer (L5)' (MiniLM has 6 layers) / 'layer -2 from the end'."""
    layer = int(layer)
    if layer >= 0:
        return f"L{layer}"
    n = N_LAYERS.get(str(model).lower())
    where = "last layer" if layer == -1 else f"layer {layer} from the end"
    return f"{where} (L{n + layer})" if n else where


def pretty(label: str) -> str:
    """'minilm L-1 head 6' -> 'MiniLM-L6, last layer (L5), head 6' (model codes and negative layer indices)."""
    import re

    def sub(m):
        return f"{model_name(m.group(1))}, {layer_name(m.group(1), m.group(2))}"
    return re.sub(r"\b([\w.-]+) L(-?\d+)\b", sub, str(label)).replace(") head", "), head")


def models_note(models: Sequence[str]) -> str:
    """'Here: ...' substitutions for the models present."""
    subs = [SUBSTITUTES[m] for m in dict.fromkeys(str(m).split(" (")[0] for m in models) if m in SUBSTITUTES]
    return ("Substitutes: " + "; ".join(subs) + ".") if subs else ""


def facets(table, keys: Sequence[str], outdir, stem: str, draw: Callable, title: str, note: str = "",
           split: Optional[str] = None, split_title: Callable = str, ncols: int = 4,
           panel: Tuple[float, float] = (3.4, 2.8), ref_text: Optional[str] = None, after: Optional[Callable] = None,
           **kw) -> List:
    """One panel per group of `keys` (draw(ax, key, group)), one image per value of `split` (stem_<value>) and per
    MAX_PANELS panels (stem_p2, ...); every image gets `title` (+ the split value), the paper figure, one legend
    below the panels and `note` as footnote; after(fig, axes) runs before saving (e.g. a shared colorbar).
    Returns the saved paths."""
    keys = [k for k in keys if k in table.columns]
    parts = [(None, table)] if split is None or split not in table.columns else \
        list(table.groupby(split, sort=False))
    paths = []
    for value, part in parts:
        groups = list(part.groupby(keys, sort=False)) if keys else [((), part)]
        pages = plotting.chunks(groups)
        base = stem if value is None else f"{stem}_{value}"
        for i, page in enumerate(pages):
            c = min(ncols, len(page))
            if c > 2 and -len(page) % (c - 1) < -len(page) % c:  # 4 panels: 2 x 2, not 3 + 1
                c -= 1
            fig, axes = plotting.grid(len(page), ncols=c, panel=panel, **kw)
            for ax, (k, g) in zip(axes, page):
                draw(ax, k if isinstance(k, tuple) else (k,), g)
            if after is not None:
                after(fig, axes)
            t = title if value is None else f"{title}: {split_title(value)}"
            if len(pages) > 1:
                t += f" (part {i + 1} of {len(pages)})"
            paths += plotting.finish(fig, outdir, base if i == 0 else f"{base}_p{i + 1}",
                                     ref_text if ref_text is not None else ref(table), title=t, note=note)
    return paths
