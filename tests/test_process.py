"""harness.process.retain_freed_memory: freed blocks stay mapped and are reused instead of faulted in afresh (a
Lanczos truth gives the same value to the bit); a user's own allocator setting wins; `attnlip analyze` applies it.
The allocator cases run in fresh interpreters: the setting is process-wide."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import entry, process

glibc = pytest.mark.skipif(process._mallopt() is None, reason="glibc's allocator only")

PROBE = """
import json, resource, sys
from harness import process
on = process.retain_freed_memory() if sys.argv[1] == "on" else False
import torch
torch.set_num_threads(1)
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
rss = lambda: int(open("/proc/self/statm").read().split()[1]) * 4096
torch.ones(1)
r0 = rss(); x = torch.ones(2 ** 21, dtype=torch.float64); del x; kept = rss() - r0  # 16 MiB written, then freed
f0 = faults(); x = torch.ones(2 ** 21 - 2 ** 16, dtype=torch.float64); del x; again = faults() - f0  # fits in it
from harness.kernels.attention import AttentionWeights
from harness.kernels.layer import truth
g = torch.Generator().manual_seed(0)
w = AttentionWeights.random(256, 8, generator=g)
X = torch.randn(128, 256, dtype=torch.float64, generator=g)
value = float(truth(X, w, certify=dict(steps=24, fail_prob=1e-9)).value)
print(json.dumps(dict(on=on, kept_mib=kept / 2 ** 20, again=again, value=value.hex())))
"""


def _probe(mode: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in (*process.USER_SETTINGS, "GLIBC_TUNABLES")}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env={**base, **env},
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc
def test_freed_memory_is_reused_with_the_same_value():
    """A freed 16 MiB block stays mapped and the next block of that size reuses its pages (glibc by default unmaps
    it, and the next one faults ~4,000 fresh pages in); a Lanczos truth gives the same value to the bit."""
    off, on = _probe("off"), _probe("on")
    assert on["on"] is True and off["on"] is False
    assert on["kept_mib"] > 12 and off["kept_mib"] < 4, (on, off)
    assert on["again"] < 200 and off["again"] > 3000, (on, off)
    assert on["value"] == off["value"]  # allocation never changes arithmetic


@glibc
@pytest.mark.parametrize("env", [dict(MALLOC_TRIM_THRESHOLD_="131072"), dict(MALLOC_MMAP_THRESHOLD_="65536"),
                                 dict(GLIBC_TUNABLES="glibc.malloc.trim_threshold=131072")])
def test_a_users_allocator_setting_wins(env):
    assert _probe("on", **env)["on"] is False


def test_attnlip_analyze_applies_it(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(process, "retain_freed_memory", lambda: calls.append(1) or True)
    assert entry.main(["analyze", "--model", "minilm", "--text", "x", "--eps", "-1"]) == 2  # a usage error
    assert calls == [1]
    assert "--eps" in capsys.readouterr().err


CELLS = '''
import time
from harness.catalog import Experiment, experiment

def _rss_mib():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2 ** 20

@experiment
class MemoryCells(Experiment):
    name = "_fake_memory"
    grid = {"i": [0, 1]}

    def run(self, cell, ctx):
        import torch
        start = _rss_mib()
        if cell["i"] == 0:  # 48 blocks of 8 MiB: under the 32 MiB mmap threshold, so they come from the heap
            blocks = [torch.ones(2 ** 20, dtype=torch.float64) for _ in range(48)]
            del blocks
        return [{"start_mib": start, "kept_mib": _rss_mib() - start, "t": time.time()}]
'''

RUNNER = """
import json, sys
from pathlib import Path
from harness import process, catalog
from harness.run import discovery
from harness import run as runner
if sys.argv[2] == "no-trim":
    process.release_freed_memory = lambda: False
discovery.load_module_file(sys.argv[1])
root = Path(sys.argv[3])
cfg = runner.RunConfig(scale="full", results_dir=root, cache_dir=root / "cache", executor="serial", progress=False,
                       figures=False)
runner.run(["_fake_memory"], cfg, echo=lambda *a: None)
man = json.loads((root / "_fake_memory" / "manifest.json").read_text())
import pandas as pd
rows = pd.read_parquet(root / "_fake_memory" / "table.parquet").sort_values("i").to_dict("records")
print(json.dumps({"peak": [c["peak_rss_mb"] for c in sorted(man["cells"], key=lambda c: c["params"]["i"])],
                  "rows": rows}))
"""


def _cells(tmp_path, mode):
    mod = tmp_path / "fake_memory_cells.py"
    mod.write_text(CELLS)
    base = {k: v for k, v in os.environ.items() if k not in (*process.USER_SETTINGS, "GLIBC_TUNABLES")}
    r = subprocess.run([sys.executable, "-c", RUNNER, str(mod), mode, str(tmp_path / mode)], capture_output=True,
                       text=True, env=base, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@glibc
def test_the_runner_keeps_freed_memory_and_each_cells_peak_is_its_own(tmp_path):
    """A cell's freed blocks stay in its process while it runs (reused, not faulted in afresh), and are given back
    after it: the next cell's peak RSS does not carry the first cell's 384 MiB. Without the release after each cell
    (the control run) it does, so the check can fail."""
    got = _cells(tmp_path, "trim")
    big, small = got["rows"]
    assert big["t"] < small["t"]  # the big cell ran first, in the same process
    assert big["kept_mib"] > 300  # retained within the cell (glibc alone would trim the heap top)
    assert got["peak"][0] > 380 and got["peak"][1] < got["peak"][0] - 300, got
    assert small["start_mib"] < big["start_mib"] + 100
    control = _cells(tmp_path, "no-trim")
    assert control["peak"][1] > control["peak"][0] - 50, control  # the high-water mark carried into the next cell
