"""Scales, dtypes, device resolution and thread ownership: defined once, used by the CLI, runner and tests."""
from __future__ import annotations

import os
from typing import Optional

SCALES = ("full", "quick", "test")
DTYPES = ("float64", "float32", "float16", "bfloat16")
THREADS_ENV = "ATTNLIP_THREADS"


def check_scale(scale: str) -> str:
    if scale not in SCALES:
        raise ValueError(f"unknown scale {scale!r}: use {', '.join(SCALES)}")
    return scale


def check_dtype(dtype: str) -> str:
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}: use {', '.join(DTYPES)}")
    return dtype


def resolve_device(device: str) -> str:
    """'auto' -> 'cuda' when available else 'cpu'; 'cuda' without a GPU -> ValueError."""
    device = str(device)
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise ValueError(f"unknown device {device!r}: use cpu, cuda, cuda:N or auto")
    if device == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda" if device == "auto" else device
    if device == "auto":
        return "cpu"
    raise ValueError(f"device {device!r} requested but torch.cuda.is_available() is False")


def device_kind(device: str) -> str:
    """'cuda:1' -> 'cuda': results depend on the kind of device, not on which one."""
    return str(device).split(":")[0]


def apply_threads(threads: Optional[int]) -> int:
    """The one place that sets torch's intra-op thread count (runner and workers call it; experiments never do).

    threads None: $ATTNLIP_THREADS if set, else torch's default. Returns the count in effect."""
    import torch

    if threads is None:
        env = os.environ.get(THREADS_ENV)
        threads = int(env) if env else None
    if threads is not None:
        if int(threads) < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()
