"""The kernels on an accelerator against the same kernels on the CPU, in one run: values and wall times.

    python -m benchmarks.device [--device cuda] [--sizes small,mid,vitb,big] [--repeats 3] [--out FILE]

Every quantity the registry computes at one input (||M_l|| of every head, zeta, the exact local constant of the
layer and of each head, and every registered bound, `registry.evaluate`) on random weights (std 1/sqrt(d)) and
unit-norm tokens, the sizes of benchmarks.cases. Three runs of each size: CPU float64 (the reference),
the device in float64, the device in float32. Reported per size and run: the median wall time of `repeats`
calls after one warm-up (device work synchronized before the clock stops) and the largest relative difference
of any value from the CPU float64 one. At the smallest size the CPU values are also checked against the dense
float64 matrices (benchmarks.cases' dense routes). Prints a markdown table; `--out` also writes it.

The kernels follow the input's device; nothing here is specific to CUDA beyond `torch.cuda.synchronize`.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from benchmarks.cases import SIZES, case, dense_m, dense_zeta
from benchmarks.timing import cpu_name
from harness.bounds import lofast as L
from harness.bounds import registry as R


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def quantities(X, w) -> dict:
    """name -> tensor of every exact quantity and registered local bound at (X, w)."""
    out = {"m_norms": L.m_norms(X, w), "zeta": L.zeta(X, w)}
    ev = R.evaluate(X, w)
    out.update({f"{name}/{scope}": v for (name, scope), v in ev.values.items()})
    return out


def timed(fn, device, repeats: int):
    fn()  # warm-up: kernels compiled or loaded, caches filled
    _sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        val = fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return val, statistics.median(times)


def rel_diff(a: dict, ref: dict) -> str:
    """The largest relative difference of any quantity from its reference, and which quantity it is."""
    worst, which = 0.0, ""
    for k, r in ref.items():
        v = a[k].detach().to("cpu", torch.float64)
        r = r.detach().to("cpu", torch.float64)
        finite = torch.isfinite(r)
        if not bool(finite.any()):
            continue
        d = ((v[finite] - r[finite]).abs() / r[finite].abs().clamp_min(1e-300)).max()
        if float(d) >= worst:
            worst, which = float(d), k
    return f"{worst:.1e} ({which})"


def run(device: str, sizes, repeats: int):
    dev = torch.device(device)
    rows = []
    for size in sizes:
        n, d, h = SIZES[size]
        X, w = case(size)
        ref, t_cpu = timed(lambda: quantities(X, w), torch.device("cpu"), repeats)
        dense = ""
        if size in ("tiny", "small"):
            dm, dz = dense_m(X, w), dense_zeta(X, w)
            err = max(float(((ref["m_norms"] - dm).abs() / dm).max()), float(((ref["zeta"] - dz).abs() / dz).max()))
            dense = f"{err:.1e}"
        rows.append((f"n={n} d={d} h={h}", "cpu float64", t_cpu, 1.0, "ref", dense))
        for dt in (torch.float64, torch.float32):
            Xd, wd = X.to(dev, dt), w.to(device=dev, dtype=dt)
            got, t = timed(lambda: quantities(Xd, wd), dev, repeats)
            rows.append((f"n={n} d={d} h={h}", f"{dev.type} {str(dt)[6:]}", t, t_cpu / t, rel_diff(got, ref),
                         ""))
    return rows


def machine(device: str) -> str:
    name = torch.cuda.get_device_name(0) if torch.device(device).type == "cuda" else "-"
    cpu = cpu_name()
    return (f"device {name}; CPU {cpu} with {torch.get_num_threads()} torch threads; torch {torch.__version__}; "
            f"TF32 matmul {'on' if torch.backends.cuda.matmul.allow_tf32 else 'off'}")


def table(rows, device: str) -> str:
    lines = [f"Measured: {machine(device)}", "",
             "| size | run | wall s (median) | speed-up vs CPU f64 | max rel. diff vs CPU f64 | CPU vs dense f64 |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {s} | {r} | {t:.3g} | {x:.2f}x | {e} | {dn} |" for s, r, t, x, e, dn in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sizes", default="small,mid,vitb,big")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out")
    a = p.parse_args(argv)
    sizes = [s for s in a.sizes.split(",") if s]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        p.error(f"unknown size(s) {unknown}; choose from {sorted(SIZES)}")
    text = table(run(a.device, sizes, a.repeats), a.device)
    print(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
