"""AttnLip's ball-change certificates against CROWN (linear bound propagation, auto_LiRPA) on one attention layer:
bounds on sup_{||X' - X||_F <= eps} ||F(X') - F(X)||_F / eps, with PGD below them (docs/notes/bounds-lofast.md).

auto_LiRPA is not a dependency of AttnLip (its PyPI release is old; install its GitHub snapshot with
`pip install --no-deps`, plus appdirs, sortedcontainers and graphviz). Cases: "random:n:d:h:seed" (random weights,
Gaussian X) or "minilm:n:layer" (all-MiniLM-L6-v2 at SST-2 tokens, bias-free, unit rows). One JSON line per case.

    python -m benchmarks.crown_compare random:16:32:2:0 minilm:16:0
"""
import json
import math
import sys
import time

import torch
import torch.nn as nn

from harness.bounds import lofast_pgd, registry
from harness.bounds.input_state import InputState
from harness.kernels.attention import AttentionWeights

try:
    from auto_LiRPA import BoundedModule, BoundedTensor, PerturbationLpNorm
except ImportError:  # pragma: no cover - depends on the machine
    BoundedModule = None



class MHA(nn.Module):
    """The bias-free multi-head layer F(X) = sum_l softmax(X wq_l (X wk_l)^T / sqrt(dh)) X wv_l wo_l, as modules
    auto_LiRPA can trace."""

    def __init__(self, w):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Parameter(t.clone(), requires_grad=False) for t in (w.wq, w.wk, w.wv, w.wo))
        self.h, self.dh = w.wq.shape[0], w.wq.shape[2]

    def forward(self, X):  # X (1, n, d)
        out = 0
        for l in range(self.h):
            q = X @ self.wq[l]
            k = X @ self.wk[l]
            v = X @ self.wv[l]
            S = q @ k.transpose(-1, -2) / math.sqrt(self.dh)
            P = torch.softmax(S, dim=-1)
            out = out + (P @ v) @ self.wo[l]
        return out


def case(n, d, h, seed):
    """Random weights (AttentionWeights.random) and a Gaussian input (1, n, d), float64."""
    g = torch.Generator().manual_seed(seed)
    w = AttentionWeights.random(d=d, h=h, generator=g)
    X = torch.randn(1, n, d, generator=g)
    return w, X


def crown_change(model, X, eps):
    """CROWN's bound on ||F(X') - F(X)||_F over the l2 ball: the Frobenius norm of the largest per-output deviation."""
    bm = BoundedModule(model, torch.zeros_like(X), device="cpu", verbose=0)
    xb = BoundedTensor(X, PerturbationLpNorm(norm=2, eps=eps))
    lb, ub = bm.compute_bounds(x=(xb,), method="CROWN")
    F0 = model(X)
    dev = torch.maximum(ub - F0, F0 - lb)
    return float(dev.detach().norm())


def load(spec):
    """(w, X) of a case string (see the module docstring)."""
    kind, *a = spec.split(":")
    if kind == "random":
        n, d, h, seed = map(int, a)
        return case(n, d, h, seed)
    from harness.models.lofast_eval import minilm_layer  # trained: MiniLM layer at SST-2 tokens, unit rows
    n, layer = map(int, a)
    w, X, _ = minilm_layer(1, n, layer)
    return w, X


def main(argv) -> int:
    from harness.kernels.krylov import kw_steps

    if BoundedModule is None:
        print("benchmarks.crown_compare needs auto_LiRPA (not an AttnLip dependency): install its GitHub snapshot "
              "with pip install --no-deps", file=sys.stderr)
        return 2
    torch.set_default_dtype(torch.float64)
    for spec in argv:
        w, X = load(spec)
        model = MHA(w).eval()
        steps = kw_steps(X.shape[-1] * X.shape[-2], 1e-2, 1e-9)  # KW relative eps 1e-2 on ||J||^2, as certification
        s = InputState(X, w, certify=dict(steps=steps, fail_prob=1e-9))
        out = dict(case=spec, n=X.shape[-2], d=w.d, h=w.h, truth=float(s.truth_layer[0]),
                   truth_upper=float(s.upper["layer"][0]), rows=[])
        for eps in (1e-4, 1e-3, 1e-2, 5e-2, 1e-1):
            ch = registry.ball_changes(s, eps)
            t0 = time.perf_counter()
            try:
                cr = crown_change(model, X, eps)
            except Exception as e:  # noqa: BLE001
                cr = float("nan")
                print("CROWN failed:", type(e).__name__, e, file=sys.stderr)
            tc = time.perf_counter() - t0
            pg = float(lofast_pgd.pgd_sensitivity(X, w, eps, residual=False, steps=50, restarts=4)[0])
            out["rows"].append(dict(eps=eps, pgd=pg / eps, crown=cr / eps, crown_s=tc,
                                    **{k: float(v[0]) / eps for k, v in ch.items()}))
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
