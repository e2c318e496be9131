"""Mixed precision at tol 1e-10: a measured prototype (docs/notes/kernels.md "Mixed precision at tol 1e-10").

`python -m benchmarks.mixed_refine [--sizes mid,vitb] [--tol32 1e-5] [--threads 2] [--repeats 3]`: zeta and
||M_l|| (all heads) at each size of benchmarks.cases, float64 (lofast's default route) against a prototype
of float64 results from float32 iterations:
1. float32 Lanczos from the seeded Gaussian start to --tol32 (as `mixed=True` does);
2. Lanczos from its Ritz vector with float64 vectors and orthogonalization, the first product in float64 (the
   residual of that vector, which sets the direction of the correction) and the others in float32;
3. float64 Lanczos from the result (full reorthogonalization) until the explicit float64 residual of the
   normalized vector, ||M y - theta y|| / theta, is below tol; the value is its float64 Rayleigh quotient.
Prints the products of each phase, the explicit residual after each, the times (medians, the two routes taking turns
in one process: benchmarks.timing.measure_alternating) and the largest relative difference from the float64 values.
Nothing in harness uses this route: on this CPU it gained at most about 1.2x (the restart from one vector costs more
products than the float32 ones save).
"""
from __future__ import annotations

import argparse
import contextlib

import torch

from benchmarks.cases import case
from benchmarks.timing import machine, measure_alternating, set_threads
from harness.bounds import lofast
from harness.kernels import mixed
from harness.kernels.krylov import GramOperator, lanczos

MAX_ROUNDS = 3  # float64 Lanczos runs in phase 3 before the prototype gives up (never needed in the measurements)


class FirstExact(GramOperator):
    """Gram products in float64 for the first call, then through the float32 operator (vectors stay float64)."""

    def __init__(self, op, op32, first: bool = True):
        self.op, self.op32, self.first, self.dim, self.scale = op, op32, first, op.dim, op.scale

    def gram(self, V):
        if self.first:
            self.first = False
            return self.op.gram(V)
        return self.op32.gram(V.to(torch.float32)).to(V.dtype)

    def select(self, keep):
        return FirstExact(self.op.select(keep), self.op32.select(keep), self.first)


def explicit(op, y):
    """(unit y, float64 Rayleigh quotient, explicit relative residual) of the scaled Gram operator op, per row."""
    y = y / y.norm(dim=-1, keepdim=True)
    w = op.gram(y)
    theta = (w * y).sum(-1)
    return y, theta, (w - theta[:, None] * y).norm(dim=-1) / theta


def prototype(log: list, tol32: float):
    """A replacement for kernels.mixed.lanczos_mixed running the three phases above; appends a line per call."""
    def run(op, op32, x0, fail_prob, iters, tol, krylov, min_steps=1, check_every=3):
        r32 = lanczos(op32, x0.to(torch.float32), fail_prob=fail_prob, iters=iters, tol=max(tol, tol32),
                      krylov=krylov, min_steps=min_steps, check_every=check_every)
        r = lanczos(FirstExact(op, op32), r32.vector.to(x0.dtype), iters=iters, tol=tol, krylov=krylov,
                    reorth="full", check_every=check_every)
        n64, n32 = 2, r32.products + r.products - 1  # phase 2's first product and the residual check
        y, theta, rel = explicit(op, r.vector)
        line = [f"float32 {r32.products}, first-exact {r.products}: residual {float(rel.max()):.1e}"]
        for _ in range(MAX_ROUNDS):
            if bool((rel < tol).all()):
                break
            r = lanczos(op, y, iters=iters, tol=tol, krylov=krylov, reorth="full", check_every=check_every)
            y, theta, rel = explicit(op, r.vector)
            n64 += r.products + 1
            line.append(f"float64 {r.products}: residual {float(rel.max()):.1e}")
        log.append("; ".join(line) + f" (in all {n32} float32 + {n64} float64 products)")
        r.value, r.vector, r.rel = theta.sqrt() * op.scale.to(theta.dtype), y, rel
        r.converged = rel < tol
        r.upper = mixed._padded(r32.upper, r.value)
        return r, n32
    return run


@contextlib.contextmanager
def prototype_route(log: list, tol32: float):
    """lofast's mixed=True runs the prototype inside the block."""
    saved = lofast.lanczos_mixed
    lofast.lanczos_mixed = prototype(log, tol32)
    try:
        yield
    finally:
        lofast.lanczos_mixed = saved


def compare(size: str, tol32: float = 1e-5, repeats: int = 3, tol: float = 1e-10):
    """Rows (quantity, float64 s, prototype s, largest relative difference, products line) at one size."""
    X, w = case(size)
    rows = []
    for name, f in (("zeta", lofast.zeta), ("‖M_l‖ all heads", lofast.m_norms)):
        log: list = []

        def proto(f=f):
            with prototype_route(log, tol32):
                return f(X, w, tol=tol, mixed=True)
        timed = measure_alternating({"f64": lambda f=f: f(X, w, tol=tol), "proto": proto}, repeats)
        (v64, t64), (vp, tp) = timed["f64"], timed["proto"]
        rows.append((name, t64, tp, float(((vp - v64).abs() / v64).max()), log[-1]))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="mid,vitb", help="benchmarks.cases sizes (default mid,vitb)")
    ap.add_argument("--tol32", type=float, default=1e-5, help="where the float32 phase stops (default 1e-5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
    set_threads(a.threads)
    print(machine() + f", float32 phase to {a.tol32:g}, tol 1e-10\n")
    print("| size | quantity | float64 (s) | prototype (s) | float64 / prototype | rel. diff | products |")
    print("|---|---|---|---|---|---|---|")
    for size in a.sizes.split(","):
        for name, t64, tp, diff, line in compare(size, a.tol32, a.repeats):
            print(f"| {size} | {name} | {t64:.3g} | {tp:.3g} | {t64 / tp:.2f}x | {diff:.1e} | {line} |", flush=True)


if __name__ == "__main__":
    main()
