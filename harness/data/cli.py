"""`attnlip data list` and `attnlip data fetch [NAME ...]`: the datasets, their sources, and downloading them into
the libraries' own caches (NLTK's data folder, the `datasets` cache)."""
from __future__ import annotations

import argparse
import sys
from typing import List, Optional

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
    return ap


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


def cmd_fetch(names: List[str], out=print, err=None) -> int:
    err = err or (lambda s: print(s, file=sys.stderr))
    if not names:
        names = list(sources.DEFAULT)
    elif "all" in names:
        names = list(sources.DATASETS)
    unknown = [n for n in names if n not in sources.DATASETS]
    if unknown:
        err(f"attnlip data fetch: unknown dataset(s) {', '.join(unknown)}; known: {', '.join(sources.DATASETS)}")
        return 2
    from tqdm import tqdm

    failed = []
    bar = tqdm(names, desc="datasets", unit="dataset", file=sys.stderr)
    for n in bar:
        bar.set_postfix_str(n)
        ok, msg = resolve.fetch(n)
        bar.write(("ok      " if ok else "MISSING ") + msg, file=sys.stderr)
        if not ok:
            failed.append(msg)
    bar.close()
    if failed:
        err(f"\ncould not get {len(failed)} of {len(names)} dataset(s):")
        for m in failed:
            err(f"  {m}")
        err("run `attnlip data fetch` again where the network is reachable, or set ATTNLIP_DATA to a mirror "
            "(`attnlip data list` prints its layout)")
        return 1
    out(f"all {len(names)} dataset(s) available: " + ", ".join(f"{n} ({resolve.source(n)})" for n in names))
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:  # the commands, not argparse's "the following arguments are required: cmd"
        _parser().print_help()
        return 2
    a = _parser().parse_args(argv)
    if a.cmd == "list":
        return cmd_list()
    return cmd_fetch(list(a.names))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
