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


def available_bytes(device=None) -> int:
    """Memory available for new tensors on `device` (bytes)."""
    if device is not None and torch.device(device).type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


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
    storage: str  # "float64" (one float64 solve) or "float32" (mixed: a float32 certified phase, then float64)
    krylov: int  # basis size of the float64 solve
    krylov32: int  # basis size of the float32 phase (0 when storage is float64)
    vector_bytes: int  # one basis vector of the batch in float64

    def describe(self) -> str:
        if self.storage == "float64":
            return f"float64 basis of {self.krylov} vectors"
        return f"float32 basis of {self.krylov32} vectors, then float64 basis of {self.krylov} (mixed)"


def basis_plan(batch: int, N: int, steps: int, dtype=torch.float64, available: Optional[int] = None,
               mixed_ok: bool = True) -> BasisPlan:
    """The certified truth's basis for `batch` operators on N entries each, at least steps + 2 vectors in its
    certified cycle (module docstring). mixed_ok: whether the mixed-precision contract applies (float64 inputs, no
    TF32)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    vec = batch * N * itemsize
    budget = BASIS_MEMORY_FRACTION * (available_bytes() if available is None else available)
    need = int(steps) + 2
    usual = max(TRUTH_KRYLOV, need)
    fits = int(budget // vec) - 1  # vectors beyond the extra one the solver keeps
    if fits >= usual:
        return BasisPlan(str(dtype).replace("torch.", ""), usual, 0, vec)
    if fits >= need:
        return BasisPlan(str(dtype).replace("torch.", ""), fits, 0, vec)
    fits32 = int(budget // (vec // 2)) - 1
    if mixed_ok and fits32 >= need:
        return BasisPlan("float32", max(2, min(fits, usual)), min(fits32, usual), vec)
    raise ValueError(f"the certified truth's Lanczos basis needs {need + 1} vectors of {vec / 2**30:.2f} GiB "
                     f"({(need + 1) * vec / 2**30:.1f} GiB); {budget / 2**30:.1f} GiB may be used here "
                     f"(BASIS_MEMORY_FRACTION of the memory available): lower the steps or use a larger machine")
