"""A soundness run of the ball-change certificates larger than the test suite holds (tests/test_second_order.py is
its bounded version): random multi-head layers from uniform to near-one-hot attention, large weights, biases and
causal masks; for each, the second-order and best certificates against (a) PGD on the change over the eps-ball,
(b) the exact change along the dense Jacobian's top right singular vector on small balls (with the certified
upper estimate of ||J||, as certification uses it), and (c) the curvature
bound K(eps) against autodiff second derivatives at random points of the ball. Prints one JSON line: layers,
checks and violations per kind (all must be 0), the smallest ratio certificate / lower bound seen, and where best
fell below the exact change at all (within the registry's tolerance for Lanczos values), which member gave it.

    python -m benchmarks.fuzz_certificates --layers 10000 --seed 0
"""
from __future__ import annotations

import argparse
import json
import math
import time

import torch
from torch.func import jvp

from harness.bounds import registry, second_order
from harness.bounds.input_state import InputState
from harness.bounds.lofast_pgd import pgd_sensitivity
from harness.kernels.attention import AttentionWeights, attention_unchecked
from harness.kernels.power import dense_jacobian

D64 = torch.float64
ROUNDOFF = 16 * torch.finfo(D64).eps  # per unit of ||F||: the error of a difference of two computed outputs
CERTIFY = dict(steps=64, fail_prob=1e-9)  # as a certificate uses the truth: its Kuczynski-Wozniakowski upper estimate


def _layer(g: torch.Generator):
    """One random layer and 4 inputs: n 2..8, d 4 or 8, h 1 or 2, weight scale 1e-3 (uniform attention) to 30
    (near-one-hot), token scale 1 to 30, biases and causal masks in a third of the cases each, eps 1e-4 .. 1."""
    n = int(torch.randint(2, 9, (1,), generator=g))
    d = (4, 8)[int(torch.randint(0, 2, (1,), generator=g))]
    h = (1, 2)[int(torch.randint(0, 2, (1,), generator=g))]
    wscale = 10 ** float(torch.rand(1, generator=g) * 4.5 - 3)
    bias, causal = bool(torch.rand(1, generator=g) < 1 / 3), bool(torch.rand(1, generator=g) < 1 / 3)
    w = AttentionWeights.random(d=d, h=h, scale=wscale, generator=g, bias=bias)
    X = torch.randn(4, n, d, generator=g, dtype=D64) * 10 ** (torch.rand(4, 1, 1, generator=g, dtype=D64) * 1.5)
    eps = 10 ** (torch.rand(4, generator=g, dtype=D64) * 4 - 4)
    return w, X, eps, causal


def run(layers: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    kinds = ("pgd", "exact_second_order", "exact_best", "curvature")
    out = dict(layers=layers, seed=seed, checks=dict.fromkeys(kinds, 0), violations=dict.fromkeys(kinds, 0),
               min_ratio=dict.fromkeys(kinds, math.inf), below_exact=[])
    t0 = time.perf_counter()

    def record(kind, bound, lower, rtol=1e-9):
        ok = bound >= lower * (1 - rtol) - 1e-300
        out["checks"][kind] += int(ok.numel())
        out["violations"][kind] += int((~ok).sum())
        pos = lower > 0
        if bool(pos.any()):
            out["min_ratio"][kind] = min(out["min_ratio"][kind], float((bound[pos] / lower[pos]).min()))

    for _ in range(layers):
        w, X, eps, causal = _layer(g)
        F = lambda Z: attention_unchecked(Z, w, residual=False, causal=causal)  # noqa: E731
        s = InputState(X, w, causal=causal)
        so, best = (registry.get(b, "layer").fn(s, eps) for b in ("second_order", "best"))
        if not causal:  # lofast_pgd's PGD is for the unmasked map
            lower = pgd_sensitivity(X, w, eps, residual=False, steps=10, restarts=1)
            record("pgd", torch.minimum(so, best), lower, registry.SOUND_RTOL)
        J = dense_jacobian(F, X[0])
        v = torch.linalg.svd(J).Vh[0].reshape(X[0].shape)
        small = torch.tensor([1e-4, float(eps[0])], dtype=D64)
        change = torch.stack([torch.stack([(F(X[0] + sg * e * v) - F(X[0])).norm() for sg in (1.0, -1.0)]).amax()
                              for e in small])
        # the difference of two rounded outputs is known to within a few units of roundoff of ||F||: allow it
        fl = ROUNDOFF * torch.stack([F(X[0] + e * v).norm() + F(X[0]).norm() for e in small])
        s0 = InputState(X[:1].expand(2, -1, -1), w, causal=causal, certify=CERTIFY)  # U: the KW upper estimate
        record("exact_second_order", registry.get("second_order", "layer").fn(s0, small) + fl, change)
        ch = registry.ball_changes(s0, small)
        best = ch.pop("best")
        # best's Theorem 1 members read Lanczos values of zeta and ||M_l||, which approach the norms from below to
        # the solver's tolerance: the registry judges them with its soundness rule (registry.SOUND_RTOL)
        record("exact_best", best + fl, change, registry.SOUND_RTOL)
        below = best < change
        if bool(below.any()):
            won = min(ch, key=lambda k: float(ch[k][below][0]))
            out["below_exact"].append(dict(won=won, rel=float(1 - (best / change)[below].min()),
                                           gap_over_roundoff=float(((change - best) / fl)[below].max())))
        K = second_order.curvature(second_order.curvature_terms(X, w, s.m_fine, causal), eps)
        U, E = torch.randn(X.shape, generator=g, dtype=D64), torch.randn(X.shape, generator=g, dtype=D64)
        Z = X + eps[:, None, None] * U / U.norm(dim=(-1, -2), keepdim=True)
        E = E / E.norm(dim=(-1, -2), keepdim=True)
        second = jvp(lambda Y: jvp(F, (Y,), (E,))[1], (Z,), (E,))[1].norm(dim=(-1, -2))
        record("curvature", K, second)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["below_exact"] = out["below_exact"][:20]  # the first few: which member gave best there, how far below
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=10_000)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    res = run(a.layers, a.seed)
    print(json.dumps(res))
    return 1 if any(res["violations"].values()) else 0


if __name__ == "__main__":
    raise SystemExit(main())
