"""The `attnlip` command: `attnlip analyze ...` (any model and input, every bound + the truth), `attnlip certify
...` (certified robustness radii of a classifier's predictions),
`attnlip run ...` (the experiment harness, same as `python run_all.py ...`) and `attnlip data ...` (datasets)."""
from __future__ import annotations

import sys
from typing import List, Optional

USAGE = """usage: attnlip {analyze,certify,run,data} ...

  attnlip analyze --model minilm --text "The cat sat on the mat."   every bound and the truth, per layer/head
  attnlip certify --model ./sst2-bert --dataset sst2:dev      certified l2 radius of each prediction vs an attack
  attnlip run --quick                                              the experiments (= python run_all.py)
  attnlip data fetch                                               download the datasets the default run reads
  attnlip data list                                                each dataset, its sources, what resolves now

`attnlip analyze --help`, `attnlip certify --help`, `attnlip run --help` and `attnlip data --help` list the options."""


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    from harness import venv_check

    venv_check.require("attnlip")
    from harness import config, network

    config.prefer_passive_wait()  # before torch loads libgomp; the thread count: config.init_threads
    config.portable_numerics()  # before torch picks its CPU code paths: results independent of AVX-512
    asks = cmd in ("analyze", "certify", "run", "data") and not network.asks_help(rest)
    note = network.offline_if_unreachable() if asks else None
    if note:  # before the hub libraries read their offline variables
        print(f"attnlip: {note}", file=sys.stderr)
    try:
        return _dispatch(cmd, rest)
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT; outputs are written whole or not
        print(f"attnlip {cmd}: interrupted; nothing more was written", file=sys.stderr)
        return 130


def _dispatch(cmd: str, rest: List[str]) -> int:
    if cmd == "analyze":  # its threads and memory settings: harness.analyze.cli.threads
        from harness.analyze.cli import main as analyze_main

        return analyze_main(rest)
    if cmd == "certify":
        from harness.certify.cli import main as certify_main

        return certify_main(rest)
    if cmd == "run":
        from harness.cli import main as run_main

        return run_main(rest)
    if cmd == "data":
        from harness.data.cli import main as data_main
        from harness.run import fetch

        return data_main(rest, planner=fetch)
    print(f"attnlip: unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
