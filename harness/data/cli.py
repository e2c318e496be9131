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

from harness.data import paths, resolve, sources
from harness.errors import DataNotFound

USAGE_EPILOG = "The optional local mirror ($ATTNLIP_DATA) is read before any cache; its layout:\n" + sources.MIRROR_LAYOUT


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="attnlip data", description=__doc__, epilog=USAGE_EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="each dataset, its sources and the source that resolves now; then every dataset, "
                                "model and tokenizer the experiments read: present, will download or missing")
    f = sub.add_parser("fetch", help="download datasets into the standard caches (default: what the default run "
                                     "reads: " + ", ".join(sources.DEFAULT) + ")")
    f.add_argument("names", nargs="*", metavar="NAME", help=f"datasets ({', '.join(sources.DATASETS)}) or 'all', "
                                                             f"or hub files ({', '.join(sources.HUB_FILES)})")
    f.add_argument("--for", dest="exps", action="append", default=[], metavar="EXP",
                   help="also every dataset, model and tokenizer experiment EXP needs (glob; repeat or comma-separate)")
    f.add_argument("--all", action="store_true", help="what every experiment needs (--for '*')")
    f.add_argument("--scale", choices=("quick", "full", "both"), default="both",
                   help="the scale(s) whose cells --for / --all read (default both)")
    f.add_argument("--to", metavar="DIR", help="download into DIR (DIR/huggingface, DIR/nltk_data) instead of the "
                                               "standard caches; prints the variables a compute node sets to use it")
    return ap


def cmd_list(out=print, planner=None) -> int:
    out(f"{'dataset':18s} {'default':7s} {'resolves now':44s} sources")
    for name, d in sources.DATASETS.items():
        try:
            r = resolve.locate(name)
            now = r.source + (" (download)" if r.kind == "download" else "")
        except DataNotFound as e:
            now = f"error: {e}"
        out(f"{name:18s} {'yes' if d.default else '':7s} {now:44s} {', '.join(d.sources)}")
    for h in sources.HUB_FILES.values():  # labelled as the datasets are: mirror:..., hf:... (download), missing:...
        now = ""
        if planner is not None:
            state, where = planner.model_state(h.repo, h.kind)
            now = {planner.PRESENT: where.split(" ")[0] if where.startswith("mirror:") else f"hf:{h.repo} (cached)",
                   planner.DOWNLOAD: f"hf:{h.repo} (download)", planner.MISSING: f"missing:{h.name}"}[state]
        out(f"{h.name:18s} {'':7s} {now:44s} hf:{h.repo} ({h.kind} files)")
    out("\n'hf:<repo>' without '@<revision>' or 'nltk:<package>' marked (download) is fetched on first use; "
        "'missing' needs `attnlip data fetch NAME` on a machine with network, or the mirror.")
    if planner is not None:  # what the experiments read, models and tokenizers included (harness.run.fetch)
        out("\nwhat the experiments read (quick and full scale): present (where), will download, or missing")
        for line in planner.inventory_lines(["*"], ["quick", "full"]):
            out("  " + line)
    out("\n" + USAGE_EPILOG)
    try:
        paths.mirror_root()
    except DataNotFound as e:  # the listing above shows what it breaks; the status says the setting is wrong
        print(f"attnlip data list: error: {e}", file=sys.stderr)
        return 1
    return 0


def _writable_folder(to: str) -> Path:
    """--to DIR resolved, created if absent and checked writable before anything is downloaded; a ValueError
    naming what is wrong otherwise (a file, a symlink loop, a folder this user cannot write), with any folder
    this check created removed again."""
    from harness.store.atomic import unwritable

    why = unwritable(to) if to.strip() else "'' is not a folder name"
    if why:
        raise ValueError(f"--to {why}; name a folder you can write to (created if absent)")
    return Path(to).expanduser().resolve()


def _use_folder(to: str) -> Tuple[Path, str]:
    """Point this process's downloads at DIR (datasets and NLTK read the variables when they download; hub models
    get the folder explicitly): (hub cache folder, the line a compute node exports)."""
    root = _writable_folder(to)
    os.environ["HF_HOME"] = str(root / "huggingface")
    os.environ.pop("HF_DATASETS_CACHE", None)
    os.environ["NLTK_DATA"] = os.pathsep.join([str(root / "nltk_data"), *filter(None, [os.environ.get("NLTK_DATA")])])
    return root / "huggingface" / "hub", (f"export HF_HOME={root / 'huggingface'} NLTK_DATA={root / 'nltk_data'} "
                                          "ATTNLIP_OFFLINE=1")


def cmd_fetch(names: List[str], out=print, err=None, exps: Optional[List[str]] = None, scale: str = "both",
              to: Optional[str] = None, planner=None) -> int:
    """Fetch datasets `names`, plus (with `exps`) what those experiments need as `planner` (harness.run.fetch,
    which knows the experiments: this module sits below them) lists it."""
    err = err or (lambda s: print(s, file=sys.stderr))
    exps = [p for e in (exps or []) for p in e.split(",") if p]
    if not names and not exps:
        names = list(sources.DEFAULT)
    elif "all" in names:
        names = list(sources.DATASETS)
    unknown = [n for n in names if n not in sources.DATASETS and n not in sources.HUB_FILES]
    if unknown:
        err(f"attnlip data fetch: unknown dataset(s) {', '.join(unknown)}; known: {', '.join(sources.DATASETS)}, "
            f"and the hub files {', '.join(sources.HUB_FILES)}")
        return 2
    hub_files = {sources.HUB_FILES[n].repo: sources.HUB_FILES[n].kind for n in names if n in sources.HUB_FILES}
    names = [n for n in names if n in sources.DATASETS]
    if hub_files and planner is None:
        err(f"attnlip data fetch: {', '.join(sources.HUB_FILES)} need the model downloads: run it as "
            "`attnlip data fetch`")
        return 2
    try:
        hub_cache, export = _use_folder(to) if to is not None else (None, "")
    except ValueError as e:
        err(f"attnlip data fetch: {e}")
        return 2
    models: Dict[str, str] = dict(hub_files)
    if exps:
        if planner is None:
            err("attnlip data fetch: --for / --all need the experiments: run it as `attnlip data fetch`")
            return 2
        try:
            data, needed = planner.needs(exps, ["quick", "full"] if scale == "both" else [scale])
        except ValueError as e:
            err(f"attnlip data fetch: {e}")
            return 2
        models.update({repo: what for repo, what in needed.items() if models.get(repo) != "weights"})
        names = list(dict.fromkeys([*names, *data]))
    from tqdm import tqdm

    jobs = [("dataset", n, None) for n in names] + [("model", repo, what) for repo, what in models.items()]
    failed = []
    bar = tqdm(jobs, desc="fetch", unit="item", file=sys.stderr)
    for kind, n, what in bar:
        bar.set_postfix_str(n)
        ok, msg = resolve.fetch(n) if kind == "dataset" else planner.fetch_model(n, what, hub_cache)
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


def main(argv: Optional[List[str]] = None, planner=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # the commands, not argparse's "the following arguments are required: cmd"
        _parser().print_help()
        return 2
    a = _parser().parse_args(argv)
    if a.cmd == "list":
        return cmd_list(planner=planner)
    return cmd_fetch(list(a.names), exps=a.exps + (["*"] if a.all else []), scale=a.scale, to=a.to,
                     planner=planner)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
