"""Where the layer Jacobian's products run and how large its Lanczos basis may be: the one size and memory rule
(docs/notes/kernels.md, "Long contexts").

- Products (`products_route`): "materialised" (kernels.layer.layer_operator keeps the h x n x n maps P and P^T and
  makes n x n temporaries per product: 4 maps in all) while those 4 maps take at most MAPS_MEMORY_FRACTION of the
  memory available; "streamed" (kernels.streamed, nothing n x n kept) beyond. Callers may force either.
- Basis (`basis_plan`): the certified truth's Lanczos basis (krylov + 1 vectors of B n d entries) may take
  BASIS_MEMORY_FRACTION of the memory available. In order: the usual float64 basis (TRUTH_KRYLOV vectors, the
  numbers of every earlier run); a smaller float64 basis that still holds the certificate's unrestarted first cycle
  (steps + 2 vectors) and restarts more often; float32 storage through the mixed-precision contract (docs/math.md
  §4: the float32 phase's certificate padded by MIXED_SLACK, the value from a float64 phase with a basis from
  what is left, restarted as often as it needs); else a ValueError naming the memory needed.
Available memory: psutil's `available` on the CPU, the free device memory on CUDA.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from harness.settings import BASIS_MEMORY_FRACTION, MAPS_MEMORY_FRACTION, TRUTH_KRYLOV

ROUTES = ("auto", "materialised", "streamed")


_CAP = {"bytes": None}


def set_memory_cap(nbytes: Optional[int]) -> None:
    """Plan as if at most `nbytes` were available (a benchmark's memory target; None: no cap)."""
    _CAP["bytes"] = None if nbytes is None else int(nbytes)


def available_bytes(device=None) -> int:
    """Memory available for new tensors on `device` (bytes); under a cap (set_memory_cap) at most the cap less
    what this process already holds (its RSS)."""
    if device is not None and torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    avail = int(psutil.virtual_memory().available)
    if _CAP["bytes"] is None:
        return avail
    return max(0, min(avail, _CAP["bytes"] - psutil.Process().memory_info().rss))


def product_flops(n: int, d: int, inner: int, causal: bool) -> float:
    """Flops of one Gram product (jvp then vjp) of the layer Jacobian by the streamed route: the projections
    (3 d x inner in and inner x d out, both ways: 16 n d inner) and per (query, key) pair 10 inner flops each way
    (scores recomputed, score differential, the three value / probability products); causal: the pairs at or
    below the diagonal. inner = h dh."""
    pairs = n * (n + 1) / 2 if causal else n * n
    return 16.0 * n * d * inner + 20.0 * pairs * inner


def state_bytes(n: int, d: int, inner: int, itemsize: int) -> int:
    """Bytes the streamed operator keeps besides the Lanczos basis: the weights (4 d inner and their fused
    copies), q, k, v, O (4 n inner), a product's projections, rotations, accumulators and output (~10 n inner +
    3 n d), rounded up: a planning figure, not a measurement (benchmarks.report --part long --probe measures it)."""
    return itemsize * (8 * d * inner + 14 * n * inner + 3 * n * d)


def maps_bytes(batch: int, h: int, n: int, itemsize: int) -> int:
    """Bytes of the materialised route's maps and n x n product temporaries (4 maps of batch x h x n x n)."""
    return 4 * batch * h * n * n * itemsize


def products_route(batch: int, h: int, n: int, itemsize: int, route: str = "auto",
                   available: Optional[int] = None) -> str:
    """"materialised" or "streamed" for a layer of h heads at n tokens (module docstring); route forces one."""
    if route not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {route!r}")
    if route != "auto":
        return route
    avail = available_bytes() if available is None else available
    return "materialised" if maps_bytes(batch, h, n, itemsize) <= MAPS_MEMORY_FRACTION * avail else "streamed"


@dataclass(frozen=True)
class BasisPlan:
    storage: str  # the basis dtype: the input's (one solve), or "float32" for a float64 input with krylov32 > 0
    krylov: int  # basis size of the solve in the input's dtype (planned; fixed by basis_vectors once built)
    krylov32: int  # basis size of the float32 phase of a mixed plan (0: one solve in the input's dtype)
    vector_bytes: int  # one basis vector of the batch in the input's dtype

    def describe(self) -> str:
        if not self.krylov32:
            return f"{self.storage} basis of {self.krylov} vectors"
        return f"float32 basis of {self.krylov32} vectors, then float64 basis of {self.krylov} (mixed)"


def product_bytes(n: int, d: int, inner: int, itemsize: int) -> int:
    """Bytes one Gram product's temporaries take beside the operator's state (the projections of the vector,
    rotated copies, accumulators and the output: ~8 n inner + 3 n d), a planning figure; the 7B-size probe
    (benchmarks.report --part long --probe) measured 1.6-2.5 GiB of them at n = 8192 in float64."""
    return itemsize * (8 * n * inner + 3 * n * d)


def basis_vectors(vec_bytes: int, lo: int, hi: int, available: Optional[int] = None, reserve: int = 0) -> int:
    """Basis size between lo and hi vectors (plus the solver's extra one) in BASIS_MEMORY_FRACTION of the memory
    available now (after the operator is built), less `reserve` (a product's temporaries, product_bytes)."""
    avail = (available_bytes() if available is None else available) - reserve
    return min(hi, max(lo, int(BASIS_MEMORY_FRACTION * max(avail, 0) // vec_bytes) - 1))


def basis_plan(batch: int, N: int, steps: int, dtype=torch.float64, available: Optional[int] = None,
               mixed_ok: bool = True, reserved=(0, 0)) -> BasisPlan:
    """The certified truth's basis for `batch` operators on N entries each, at least steps + 2 vectors in its
    certified cycle (module docstring). mixed_ok: whether the mixed-precision contract applies (float64 inputs, no
    TF32). reserved: bytes the operator will hold in the input's dtype and in float32 (kernels.route.state_bytes),
    taken from the memory available before the basis gets its fraction."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    vec = batch * N * itemsize
    avail = available_bytes() if available is None else available
    need = int(steps) + 2
    usual = max(TRUTH_KRYLOV, need)
    fits = int(BASIS_MEMORY_FRACTION * max(avail - reserved[0], 0) // vec) - 1
    name = str(dtype).replace("torch.", "")
    if fits >= need:
        return BasisPlan(name, min(fits, usual), 0, vec)
    fits32 = int(BASIS_MEMORY_FRACTION * max(avail - reserved[1], 0) // (vec // 2)) - 1
    if mixed_ok and fits32 >= need:
        return BasisPlan("float32", max(2, min(fits, usual)), min(fits32, usual), vec)
    raise ValueError(f"the certified truth's Lanczos basis needs {need + 1} vectors of {vec / 2**30:.2f} GiB "
                     f"({(need + 1) * vec / 2**30:.1f} GiB) beside the operator's {reserved[0] / 2**30:.1f} GiB; "
                     f"{avail / 2**30:.1f} GiB is available here: lower the steps or use a larger machine")


def plan_truth(n: int, d: int, h: int, steps: int, available: int, causal: bool = True, inner: Optional[int] = None,
               batch: int = 1) -> dict:
    """What the certified truth of one layer (d features, h heads of inner / h dims) at n tokens would do with
    `available` bytes, before computing: products route, basis plan (None where it does not fit, with the reason),
    the operator's planned state, the basis bytes, the planned peak (operator + basis; the float32 and float64
    phases of a mixed plan one after the other) and the flops per Gram product."""
    inner = d if inner is None else inner
    route = products_route(batch, h, n, 8, available=available)
    st = tuple(batch * (state_bytes(n, d, inner, size) + n * d * 8) for size in (8, 4))
    out = dict(n=n, route=route, state_bytes=st[0], flops=product_flops(n, d, inner, causal), plan=None, why="")
    try:
        plan = basis_plan(batch, n * d, steps, torch.float64, available=available, reserved=st)
    except ValueError as e:
        out["why"] = str(e)
        return out
    out["plan"] = plan
    b64 = (plan.krylov + 1) * plan.vector_bytes
    if plan.krylov32:  # the phases run one after the other, each beside its own operator
        b32 = (plan.krylov32 + 1) * plan.vector_bytes // 2
        out["basis_bytes"], out["peak_bytes"] = b32, max(st[1] + b32, st[0] + b64)
    else:
        out["basis_bytes"], out["peak_bytes"] = b64, st[0] + b64
    return out
