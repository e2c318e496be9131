"""What a cell computes under: the context its run() receives, the RNG reset before it, and the deterministic
thread blocks of training. This module is compute code (harness.boundary.ALWAYS): its source is part of every cell's
key, because everything here can change a number. The runner and the worker (infrastructure) only call it."""
from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional


@dataclass
class Context:
    """What a cell's run() may use besides its parameters. Pass parameters, not tensors, between processes."""

    device: str = "cpu"
    dtype: str = "float64"
    seed: int = 0
    scale: str = "full"  # "full" | "quick" | "test" | "paper"
    cache_dir: Path = field(default_factory=lambda: Path("results/cache"))
    progress: bool = True
    threads: Optional[int] = None  # torch intra-op threads the runner set (experiments never set them)

    @property
    def torch_dtype(self):
        from harness.settings import torch_dtype

        return torch_dtype(self.dtype)

    @property
    def torch_device(self):
        import torch

        return torch.device(self.device)

    def pbar(self, iterable=None, **kw):
        """A tqdm progress bar inside a long cell (disabled when progress is off)."""
        from tqdm.auto import tqdm

        return tqdm(iterable, disable=not self.progress, leave=False, dynamic_ncols=True, **kw)

    def generator(self, offset: int = 0):
        """A torch.Generator on ctx.device seeded with seed + offset (use it instead of global RNG state)."""
        import torch

        g = torch.Generator(device=self.torch_device)
        g.manual_seed(int(self.seed) + int(offset))
        return g

    @property
    def artifacts(self) -> Path:
        """Directory for cached artifacts shared across cells/experiments (e.g. trained model weights)."""
        p = Path(self.cache_dir) / "artifacts"
        p.mkdir(parents=True, exist_ok=True)
        return p


def seed_everything(seed: int) -> None:
    """Reset global RNGs before every cell so a cell's result does not depend on execution order."""
    import random

    random.seed(seed)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2**32)
    import torch

    torch.manual_seed(seed)


@contextlib.contextmanager
def fixed_threads(threads: int) -> Iterator[None]:
    """Compute a block with exactly `threads` torch intra-op threads and torch's deterministic algorithms, then
    restore both. For computations whose numbers must not depend on the machine or on `--threads`/`-j`: a
    parallel reduction splits its sums by thread count, and the rounding of those splits compounds over
    training steps (harness.models.train runs its loop and its accuracy under this with TRAIN_THREADS)."""
    import torch

    before, det, warn = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled(), \
        torch.is_deterministic_algorithms_warn_only_enabled()
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # cuBLAS's condition for deterministic matmuls
    torch.set_num_threads(int(threads))
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        torch.use_deterministic_algorithms(det, warn_only=warn)
