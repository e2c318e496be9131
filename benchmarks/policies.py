"""Two process policies measured before / after in one run, on this machine. Markdown on stdout.

`python -m benchmarks.policies [--part threads|memory|all] [--hold 75] [--repeats 3]`

- **threads**: the thread count right after another job ends. A 2-thread torch job runs for `--hold` seconds (the
  1-minute load average climbs towards 2), then stops; at once the count the load average gives
  (cores - load, the rule before the live sample) and the count a live /proc/stat sample gives
  (harness.config.free_cores_choice) are read, and the same workload (`attnlip analyze`'s core: MiniLM layer 0 on
  one 128-token text, after a warm-up) is timed with each count, alternating, each in a fresh process.
- **memory**: the runner's cells with and without `process.retain_freed_memory` (set by the worker before each
  cell, trimmed after it): quick-scale cells of a Lanczos-heavy experiment computed into empty temporary caches,
  serially, alternating, each run a fresh process; wall time of the cells, system time, minor page faults.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORK = """
import json, sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from benchmarks.bench_analyze import alice_text
from harness.analyze.core import analyze
text = alice_text()
analyze("minilm", text, max_tokens=16, layers=[0])
t0 = time.perf_counter()
analyze("minilm", text, max_tokens=128, layers=[0])
print(json.dumps({"threads": torch.get_num_threads(), "wall": time.perf_counter() - t0}))
"""

CELLS = """
import json, sys, time, resource
from pathlib import Path
from harness import process
if sys.argv[1] == "off":
    process.retain_freed_memory = lambda: False
    process.release_freed_memory = lambda: False
from harness import run as runner
root = Path(sys.argv[2])
cfg = runner.RunConfig(scale="quick", results_dir=root, cache_dir=root / "cache", executor="serial", progress=False,
                       figures=False, threads=int(sys.argv[4]))
r0 = resource.getrusage(resource.RUSAGE_SELF)
t0 = time.perf_counter()
res = runner.run([sys.argv[3]], cfg, echo=lambda *a: None)
wall = time.perf_counter() - t0
r1 = resource.getrusage(resource.RUSAGE_SELF)
man = json.loads((cfg.output_root / sys.argv[3] / "manifest.json").read_text())
print(json.dumps({"wall": wall, "cells_wall": sum(c.get("wall_s") or 0 for c in man["cells"]),
                  "sys": r1.ru_stime - r0.ru_stime, "faults": r1.ru_minflt - r0.ru_minflt,
                  "peak_rss_mb": max(c.get("peak_rss_mb") or 0 for c in man["cells"]), "ok": all(x.ok for x in res)}))
"""


def _child(code: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "ATTNLIP_THREADS")}
    r = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def threads_part(hold: float, repeats: int) -> None:
    from benchmarks.threads import background_job
    from harness import config

    cores = config.available_cores()
    with background_job():
        time.sleep(max(0.0, hold - 11))
    load = os.getloadavg()[0]
    by_load = max(1, min(cores, int(cores - load + 0.5)))
    live = config.free_cores_choice()
    print(f"### Thread count right after a job ({cores} cores, {time.strftime('%Y-%m-%d %H:%M')} UTC)\n")
    print(f"A 2-thread torch job ran {hold:.0f} s and stopped. At once: 1-minute load average {load:.2f}, so the "
          f"load-average rule gives {by_load} thread(s); the live sample: {live.count} ({live.detail}).\n")
    walls = {by_load: [], live.count: []}
    for _ in range(repeats):
        for n in dict.fromkeys([by_load, live.count]):
            walls[n].append(_child(WORK, str(n))["wall"])
    print("| rule | threads | MiniLM layer 0, 128 tokens (s), median | runs |")
    print("|---|---|---|---|")
    for name, n in (("load average (before)", by_load), ("live /proc/stat sample (now)", live.count)):
        print(f"| {name} | {n} | {statistics.median(walls[n]):.2f} | {', '.join(f'{w:.2f}' for w in walls[n])} |")
    print(f"\n1-minute load average at the end: {os.getloadavg()[0]:.2f}.\n")


def memory_part(exp: str, repeats: int, threads: int) -> None:
    rows = {"off": [], "on": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(repeats):
            for mode in ("off", "on"):
                rows[mode].append(_child(CELLS, mode, str(Path(tmp) / f"{mode}{i}"), exp, str(threads)))
    print(f"### Runner cells with and without freed memory kept ({exp}, quick scale, serial, {threads} thread(s))\n")
    print("| worker | cells wall (s), median | runs | system time (s) | minor faults | max cell peak RSS (MB) |")
    print("|---|---|---|---|---|---|")
    for mode, name in (("off", "glibc defaults (before)"), ("on", "retain + trim after each cell (now)")):
        r = rows[mode]
        print(f"| {name} | {statistics.median(x['cells_wall'] for x in r):.2f} | "
              f"{', '.join(format(x['cells_wall'], '.2f') for x in r)} | "
              f"{statistics.median(x['sys'] for x in r):.2f} | {statistics.median(x['faults'] for x in r):,.0f} | "
              f"{statistics.median(x['peak_rss_mb'] for x in r):.0f} |")
    print()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("threads", "memory", "all"), default="all")
    ap.add_argument("--hold", type=float, default=75.0, help="seconds the background job runs before the count")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--experiment", default="castin_sqrt_n_block", help="memory part: the experiment whose "
                    "quick cells are computed")
    ap.add_argument("--threads", type=int, default=2, help="memory part: torch threads of the cells")
    a = ap.parse_args(argv)
    print(f"Machine: {os.cpu_count()} logical cores; Python {sys.version.split()[0]}; "
          f"max RSS of this process {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB\n")
    if a.part in ("threads", "all"):
        threads_part(a.hold, a.repeats)
    if a.part in ("memory", "all"):
        memory_part(a.experiment, a.repeats, a.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
