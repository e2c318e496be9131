"""castin_sqrt_n's `long` grid: the certified local constant of a Llama-2-7B-size self-attention layer (d = 4096,
32 heads of 128, RoPE theta 1e4, causal, random init std 0.02) as the sequence grows past the committed grids'
n <= 512: to n = 8192 on the CPU (`LONG`), to 32k on a GPU (`LONG_GPU`).

Declared and planned here, not run at full length: one certified truth at n = 8192 is ~30 Gram products of ~5e12
flop each (kernels.route.product_flops), an hour or more on 2 CPU cores. The measured map is
kernels.layer.truth(..., certify=CERT, rope=...) with the products streamed and the basis sized from the memory
available (kernels.route): `plan` says, for a grid and a memory size, what each cell would use and cost, and
whether it fits (tests/test_castin_sqrt_n_long.py plans both grids). The grids use castin_sqrt_n's cell fields
(model, pretrained, layer, masked, corpus, n, count) so a runner can take them as they are once the model exists.
"""
from __future__ import annotations

from typing import Any, Dict, List

from harness.kernels.route import plan_truth
from harness.settings import CERTIFY_STEPS, FAIL_PROB

MODEL = "llama-7b-size"
D, HEADS, ROPE_THETA, INIT_STD = 4096, 32, 1e4, 0.02
CERT = dict(steps=CERTIFY_STEPS, fail_prob=FAIL_PROB)  # as the certified truths elsewhere
N_LONG_CPU = [1024, 2048, 4096, 8192]
N_LONG_GPU = N_LONG_CPU + [16384, 32768]


def _long(ns, count=1):
    return {"model": [MODEL], "pretrained": [False], "layer": [0], "masked": [True], "corpus": ["alice"],
            "n": [ns], "count": [count]}


LONG = [_long(N_LONG_CPU)]
LONG_GPU = [_long(N_LONG_GPU)]


def plan(grid: List[Dict[str, Any]], available: int, flops_per_s: float) -> List[Dict[str, Any]]:
    """One row per (sub-grid, n): the products route, the basis plan, planned peak memory (operator + basis, bytes), the
    estimated seconds of steps + 6 products at `flops_per_s`, and whether it fits in `available` bytes."""
    rows = []
    for g in grid:
        for ns in g["n"]:
            for n in ns:
                p = plan_truth(int(n), D, HEADS, CERT["steps"], int(available))
                fits = p["plan"] is not None
                mem = p.get("peak_bytes", p["state_bytes"])
                rows.append(dict(n=int(n), count=int(g["count"][0]), route=p["route"], fits=fits,
                                 basis=p["plan"].describe() if fits else p["why"], memory=mem,
                                 seconds=(CERT["steps"] + 6) * p["flops"] / flops_per_s))
    return rows
