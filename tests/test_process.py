"""harness.process.retain_freed_memory: a Lanczos truth reuses freed memory instead of faulting fresh pages in (the
same value to the bit), children inherit the setting, and a user's own allocator variables win. Every case runs in a
fresh interpreter: the setting is process-wide."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import process

PROBE = """
import json, os, resource, subprocess, sys
from harness import process
on = process.retain_freed_memory() if sys.argv[1] == "on" else False
import torch
torch.set_num_threads(1)
from harness.kernels.attention import AttentionWeights
from harness.kernels.layer import truth
g = torch.Generator().manual_seed(0)
w = AttentionWeights.random(256, 8, generator=g)
X = torch.randn(128, 256, dtype=torch.float64, generator=g)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
value = float(truth(X, w, certify=dict(steps=24, delta=1e-9)).value)
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
child = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('MALLOC_MMAP_THRESHOLD_'))"],
                       capture_output=True, text=True).stdout.strip()
print(json.dumps(dict(on=on, faults=faults, value=value.hex(), child=child)))
"""


def _probe(mode: str, **env) -> dict:
    base = {k: v for k, v in os.environ.items() if k not in process.ENV}
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env={**base, **env},
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_memory_is_reused_with_the_same_value():
    off, on = _probe("off"), _probe("on")
    assert on["on"] is True and off["on"] is False
    assert on["value"] == off["value"]  # allocation never changes arithmetic
    # measured 30,000 -> 5,000 faults at this size (a Lanczos step frees and reallocates its MB-sized temporaries)
    assert on["faults"] * 3 < off["faults"], (on, off)
    assert on["child"] == str(process.MMAP_THRESHOLD) and off["child"] == "None"  # spawned workers start with it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_a_users_allocator_setting_wins():
    mine = _probe("on", MALLOC_TRIM_THRESHOLD_="131072")
    assert mine["on"] is False and mine["child"] == "None"  # nothing set beside the user's variable
