"""Shared presentation of every experiment figure (imported only inside figures()/summary()): the paper figure an
experiment reproduces, readable layer names, footnotes naming the paper's data and models beside what ran here
(paper_note, models_note: read from the table, so they hold at every scale, offline or online), and faceted
images (one panel per group, split into several images of at most plotting.MAX_PANELS panels; each with a title,
one outside legend and a footnote)."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence, Tuple

from harness import plotting

N_LAYERS = {"minilm": 6, "all-minilm-l6-v2": 6, "bert-base-uncased": 12, "gpt2": 12}

MODEL_NOTES = {  # models the papers did not use; BERT-base / GPT-2 / ViT notes come from the table (weights_note)
    "minilm": "MiniLM-L6 = pretrained all-MiniLM-L6-v2 (BERT family, d = 384)",
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


def vit_name(table, data: bool = True) -> str:
    """'a ViT (d = 64, 4 layers) trained here on Fashion-MNIST': the size (and `data`) of the table's ViT rows."""
    vit = table[table["model"].astype(str).str.startswith("vit")] if "model" in table.columns else table
    size = [(k, int(vit[k].dropna().iloc[0])) for k in ("vit_d", "vit_depth")
            if k in vit.columns and vit[k].notna().any()]
    size = [f"d = {v}" if k == "vit_d" else f"{v} layer{'s' * (v != 1)}" for k, v in size]
    where = f" on {dataset_name(vit)}" if data else ""
    return f"a ViT{' (' + ', '.join(size) + ')' if size else ''} trained here{where}"


def ref(table, i: int = 0) -> str:
    """The paper figure the table's experiment reproduces (its figures_ref[i]); '' for an unregistered one."""
    from harness import catalog

    try:
        return catalog.get_experiment(str(table["experiment"].iloc[0])).figures_ref[i]
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


def _ran(table, column: str) -> List[str]:
    return [str(v) for v in table[column].dropna().unique()] if column in table.columns else []


def _substituted(table, paper) -> bool:
    """Whether the table's `data_used` column records a stand-in for the paper's item `paper`."""
    return any(f"(substitute for {paper})" in v for v in _ran(table, "data_used"))


def weights_note(table, model: str) -> str:
    """How the table's rows of `model` got their weights, from its `pretrained` / `weights_source` columns:
    'pretrained GPT-2', 'random-init GPT-2 (pretrained weights unreachable)' where the declared stand-in ran (column
    `data_used`), 'random-init GPT-2' where random init was asked for; both kinds joined by ' and '."""
    rows = table[table["model"].astype(str) == str(model)] if "model" in table.columns else table.iloc[:0]
    name = MODEL_NAMES.get(str(model), str(model))
    if "pretrained" in rows.columns:
        kinds = [bool(v) for v in rows["pretrained"].dropna().unique()]
    elif "weights_source" in rows.columns:
        kinds = [not str(v).startswith("random-init") for v in rows["weights_source"].dropna().unique()]
    else:
        kinds = []
    out = [f"pretrained {name}" for k in dict.fromkeys(kinds) if k]
    if False in kinds or not kinds:
        why = " (pretrained weights unreachable)" if _substituted(table, model) else ""
        out.append(f"random-init {name}{why}")
    return " and ".join(out)


def _declared(table) -> tuple:
    """The substitutes (catalog.Substitute) the table's experiment declares; () for an unregistered one."""
    from harness import catalog

    try:
        return tuple(catalog.get_experiment(str(table["experiment"].iloc[0])).substitutes or ())
    except (KeyError, IndexError, AttributeError):
        return ()


def _random_stand_ins(table, models: Sequence[str]) -> List[str]:
    """The random-init models of a grid without any of the paper's `models` (the test scale's tiny BERT)."""
    ran = _ran(table, "model")
    if not models or any(m in ran for m in models) or "pretrained" not in table.columns:
        return []
    pre = table.groupby("model")["pretrained"].first().astype(bool)
    return [m for m in ran if m in pre.index and not pre[m]]


# Experiments whose paper figure used other data than our ViT's planned data (the declared substitute's `paper`):
# there the data sentence names the paper's setting and calls CIFAR-10 what it is, the data our ViT trains on.
PAPER_SETTING = {
    "jasmin_attention_maps": "ViT-L/16 on ImageNet (JaSMin Figs. 2-3)",
    "jasmin_jsm_rows": "ViT-L/16 on ImageNet (JaSMin Figs. 2-3)",
    "jasmin_g1_ratio": "ViT-L/16 on ImageNet (JaSMin Fig. 3)",
    "bound_leaderboard": "ViT-B fine-tuned on CIFAR-100 with JaSMin k = 10, lambda = 1e-2 (JaSMin Fig. 6, App. C; "
                         "model: App. E)",
}


def within(curves: dict, rtol: float = 0.03) -> List[Tuple[str, str]]:
    """The pairs (a, b) of labelled curves {label: values}, in order, that agree within rtol at every point (same
    length): drawn on top of each other, so a figure names them."""
    import numpy as np

    items = [(k, np.asarray(v, dtype=float)) for k, v in curves.items()]
    return [(a, b) for i, (a, va) in enumerate(items) for b, vb in items[i + 1:]
            if len(va) == len(vb) and len(va) and np.allclose(va, vb, rtol=rtol)]


# The paper's own models where they are not the pretrained weights of the declared substitutes
PAPER_MODELS = {
    "castin_sqrt_n": "pretrained BERT-base (as encoder and as decoder) and random-init GPT-2 (Fig. 1; pretrained "
                     "GPT-2 in App. E.2)",
    "castin_sqrt_n_adversarial": "pretrained BERT-base (as encoder and as decoder) and random-init GPT-2 (Fig. 1's "
                                 "adversarial row; pretrained GPT-2 in App. E.2)",
}


def paper_note(table, lead: str = "") -> str:
    """'Paper data: CIFAR-10. Here: Fashion-MNIST (CIFAR-10 unreachable).' and 'Paper models: pretrained BERT-base
    and pretrained GPT-2. Here: pretrained BERT-base and random-init GPT-2 (pretrained weights unreachable).' for
    the substitutes the table's experiment declares (catalog.Substitute), read from what ran: the `dataset`
    column, the model rows' weights (weights_note) and `data_used`. '' when it declares none, else led by `lead`."""
    subs = _declared(table)
    out = []
    for s in (s for s in subs if s.key != "model"):
        paper = s.label or DATASETS.get(str(s.paper), str(s.paper))
        here = dataset_name(table, default=str(s.use)) if s.key == "dataset" else \
            " / ".join(_ran(table, s.key)) or str(s.use)
        why = f" ({paper} unreachable)" if _substituted(table, s.paper) else ""
        setting = PAPER_SETTING.get(str(table["experiment"].iloc[0])) if "experiment" in table and len(table) else None
        if setting and s.key == "dataset":  # the paper's figure used other data than our ViT's planned data
            ours = here if here == paper else f"{here} ({paper} planned{', unreachable' if why else ''})"
            out.append(f"Paper: {setting}. Our ViT's training data: {ours}.")
        else:
            out.append(f"Paper data: {paper}. Here: {here}{why}.")
    models = [str(s.paper) for s in subs if s.key == "model"]
    if models:
        ran = _ran(table, "model")
        here = [weights_note(table, m) for m in models if m in ran]
        absent = [MODEL_NAMES.get(m, m) for m in models if m not in ran]
        if here and absent:
            here.append(f"{' / '.join(absent)} not in this grid")
        scale = " (test-scale grid)" if "test" in _ran(table, "scale") else ""
        here = here or [model_name(m, False) for m in _random_stand_ins(table, models)] or ["none of them"]
        exp = str(table["experiment"].iloc[0]) if "experiment" in table and len(table) else ""
        paper = PAPER_MODELS.get(exp) or " and ".join(f"pretrained {MODEL_NAMES.get(m, m)}" for m in models)
        out.append(f"Paper models: {paper}. Here{scale}: {' and '.join(here)}.")
    return lead + " ".join(out) if out else ""


def models_note(models: Sequence[str], table=None) -> str:
    """'Models: ...' for the models present that are not the papers' own: MiniLM, the ViT trained here (its size
    and data from `table`), tiny test models. BERT-base / GPT-2 with their weights (weights_note), and the random
    stand-ins of a grid without them, are left to paper_note where the experiment declares them as substitutes."""
    declared = [str(s.paper) for s in _declared(table) if s.key == "model"] if table is not None else []
    named = set(declared) | set(_random_stand_ins(table, declared) if declared else ())
    subs = []
    for m in dict.fromkeys(str(m).split(" (")[0] for m in models):
        if m in named:
            continue
        if m in MODEL_NOTES:
            subs.append(MODEL_NOTES[m])
        elif m == "vit":
            if table is None:
                subs.append("ViT = a ViT trained here")
            else:  # the data is named by paper_note where the experiment declares a dataset substitute
                subs.append(f"ViT = {vit_name(table, not any(s.key == 'dataset' for s in _declared(table)))}")
        elif m in ("bert-base-uncased", "gpt2"):
            subs.append(weights_note(table, m) if table is not None else f"{MODEL_NAMES[m]} with random weights")
    return ("Models: " + "; ".join(subs) + ".") if subs else ""


def setting_note(table, models: Optional[Sequence[str]] = None) -> str:
    """paper_note and models_note of the table (its `model` column unless `models`), as one footnote part."""
    models = list(table["model"]) if models is None and "model" in table.columns else models or []
    return " ".join(n for n in (paper_note(table), models_note(models, table)) if n)


def facets(table, keys: Sequence[str], outdir, stem: str, draw: Callable, title: str, note: str = "",
           split: Optional[str] = None, split_title: Callable = str, ncols: int = 4,
           panel: Tuple[float, float] = (3.4, 2.8), ref_text: Optional[str] = None, after: Optional[Callable] = None,
           **kw) -> List:
    """One panel per group of `keys` (draw(ax, key, group)), one image per value of `split` (stem_<value>) and per
    MAX_PANELS panels (stem_p2, ...); every image gets `title` (+ the split value), the paper figure, one legend
    below the panels and `note` as footnote (a string, or a function of the split value and that image's rows, so a
    footnote describes only what its image shows); after(fig, axes) runs before saving (e.g. a shared colorbar).
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
                                     ref_text if ref_text is not None else ref(table), title=t,
                                     note=note(value, part) if callable(note) else note)
    return paths
