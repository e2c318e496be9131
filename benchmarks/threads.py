"""Thread policy measurements: torch's thread count and OpenMP wait policy, on an idle machine and beside another
2-thread torch job, for a Lanczos kernel and the analyze path. Markdown on stdout.

`python -m benchmarks.threads [--repeats 3] [--analyze-layers 0] [--analyze-tokens 128]`. Every configuration runs in a fresh child
process (OMP_WAIT_POLICY is read once, when libgomp loads with torch, so it has to be in the environment before
`import torch`), one after the other in one run, first idle, then beside a background job (a 2-thread torch
matmul loop with torch's defaults, standing for another user's job). Each row: median wall time of the kernel
(||M_l|| of all heads, n=128 d=256 h=8, float64) and of `harness.analyze.analyze` on MiniLM (one 128-token text,
the chosen layers), the child's CPU time / wall time (spinning threads burn CPU without progress), and the
background job's throughput while the child ran (what the choice costs the other job). The `late` rows set
OMP_WAIT_POLICY=PASSIVE after `import torch`, to show that it then has no effect.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

HOG = """
import sys, time, torch
torch.set_num_threads(2)
a = torch.randn(384, 384, dtype=torch.float64); n = 0; t0 = time.time()
while True:
    a = torch.tanh(a @ a); n += 1
    if n % 20 == 0:
        open(sys.argv[1], "w").write(f"{n} {time.time()}")
"""

CONFIGS = [  # name, threads (None: torch's default = cores), OMP_WAIT_POLICY set before torch, set after
    ("default (2 threads, active wait)", None, None, None),
    ("2 threads, PASSIVE", 2, "PASSIVE", None),
    ("2 threads, PASSIVE set late", 2, None, "PASSIVE"),
    ("1 thread", 1, None, None),
    ("1 thread, PASSIVE", 1, "PASSIVE", None),
    ("policy (harness.config.init_threads)", "policy", None, None),
]


def child(threads, late: str, repeats: int, layers, tokens: int) -> dict:
    if threads == "policy":  # as the entry points do: before torch is imported
        from harness import config

        config.init_threads()
    import torch

    if late:
        os.environ["OMP_WAIT_POLICY"] = late  # too late: libgomp read its environment when torch loaded
    if threads and threads != "policy":
        torch.set_num_threads(int(threads))
    from benchmarks.bench_analyze import alice_text
    from benchmarks.cases import case
    from harness.analyze.core import analyze
    from harness.bounds import lofast as L

    X, w = case("mid")
    text = alice_text()
    L.m_norms(X, w)
    analyze("minilm", text, max_tokens=16, layers=[0])  # warm-up: imports, model load
    out = {"threads": torch.get_num_threads()}
    for name, fn in (("kernel", lambda: L.m_norms(X, w)),
                     ("analyze", lambda: analyze("minilm", text, max_tokens=tokens, layers=layers))):
        walls, cpus = [], []
        for _ in range(repeats if name == "kernel" else max(1, repeats // 2)):
            c0, t0 = time.process_time(), time.perf_counter()
            fn()
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        out[name] = statistics.median(walls)
        out[name + "_cpu"] = sum(cpus) / sum(walls)
    return out


def hog_count(path: Path):
    try:
        n, t = path.read_text().split()
        return int(n), float(t)
    except (OSError, ValueError):
        return None


@contextlib.contextmanager
def background_job(hog_file: Optional[Path] = None):
    """Another user's job for the duration of the block: HOG (a 2-thread torch matmul loop, torch's defaults) in a
    child process, given 11 s to start; yields its rate alone (iterations / s), stops it on exit. It reports its
    progress to hog_file (a temporary file when None)."""
    tmp = None
    if hog_file is None:
        tmp = tempfile.TemporaryDirectory()
        hog_file = Path(tmp.name) / "hog"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS")}
    hog = subprocess.Popen([sys.executable, "-c", HOG, str(hog_file)], env=env)
    try:
        time.sleep(8)  # past its start-up; the load average follows within a minute
        h0 = hog_count(hog_file)
        time.sleep(3)
        h1 = hog_count(hog_file)
        if hog.poll() is not None or not (h0 and h1 and h1[1] > h0[1]):
            raise RuntimeError(f"the background job is not running (exit status {hog.poll()}): no busy measurement")
        yield (h1[0] - h0[0]) / (h1[1] - h0[1])
    finally:
        hog.terminate()
        hog.wait()
        if tmp is not None:
            tmp.cleanup()


def run_config(cfg, repeats: int, layers: str, tokens: int, hog_file) -> dict:
    name, threads, policy, late = cfg
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "ATTNLIP_THREADS")}
    if policy:
        env["OMP_WAIT_POLICY"] = policy
    args = [sys.executable, "-m", "benchmarks.threads", "--child", str(threads or ""), "--late", late or "",
            "--repeats", str(repeats), "--analyze-layers", layers, "--analyze-tokens", str(tokens)]
    h0 = hog_count(hog_file) if hog_file else None
    r = subprocess.run(args, env=env, capture_output=True, text=True)
    h1 = hog_count(hog_file) if hog_file else None
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    res = json.loads(r.stdout.strip().splitlines()[-1])
    if h0 and h1 and h1[1] > h0[1]:
        res["hog_rate"] = (h1[0] - h0[0]) / (h1[1] - h0[1])
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--analyze-layers", default="0", help="comma-separated MiniLM layers for the analyze rows")
    ap.add_argument("--analyze-tokens", type=int, default=128, help="tokens of the analyzed text")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--late", default="", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    layers = [int(x) for x in a.analyze_layers.split(",")]
    if a.child is not None:
        print(json.dumps(child(a.child or None, a.late, a.repeats, layers, a.analyze_tokens)))
        return
    print(f"Machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; kernel ||M_l|| n=128 "
          f"d=256 h=8 float64 (median of {a.repeats}); analyze MiniLM {a.analyze_tokens} tokens layers {a.analyze_layers}.\n")
    print("| machine | configuration | torch threads | kernel (ms) | kernel CPU/wall | analyze (s) | "
          "analyze CPU/wall | background job (iters/s) |")
    print("|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        hog_file = Path(tmp) / "hog"
        for phase in ("idle", "busy"):
            with (background_job(hog_file) if phase == "busy" else contextlib.nullcontext()) as alone:
                if alone is not None:
                    print(f"| busy | (background job alone) | - | - | - | - | - | {alone:.1f} |")
                for cfg in CONFIGS:
                    r = run_config(cfg, a.repeats, a.analyze_layers, a.analyze_tokens, hog_file if alone else None)
                    hr = f"{r['hog_rate']:.1f}" if "hog_rate" in r else "-"
                    print(f"| {phase} | {cfg[0]} | {r['threads']} | {1e3 * r['kernel']:.0f} | {r['kernel_cpu']:.2f} | "
                          f"{r['analyze']:.2f} | {r['analyze_cpu']:.2f} | {hr} |", flush=True)


if __name__ == "__main__":
    main()
