"""Shared pytest fixtures: `shared_data` (the data mirror $ATTNLIP_DATA, skip when unset); 1 torch thread;
headless matplotlib; offline Hugging Face and NLTK (no test downloads)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
for _k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "ATTNLIP_OFFLINE"):
    os.environ.setdefault(_k, "1")

REPO = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path | None:
    """The data mirror $ATTNLIP_DATA, or None when it is unset."""
    env = os.environ.get("ATTNLIP_DATA")
    return Path(env) if env else None


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to the data mirror ($ATTNLIP_DATA, layout in `attnlip data list`); skips the test (with the reason)
    when it is unset or absent."""
    p = shared_data_dir()
    if p is None or not p.is_dir():
        pytest.skip("needs the data mirror: set ATTNLIP_DATA to a folder laid out as `attnlip data list` shows"
                    + (f" ({p} is not a folder)" if p is not None else ""))
    os.environ.setdefault("ATTNLIP_DATA", str(p))
    os.environ.setdefault("NLTK_DATA", str(p / "nltk_data"))
    return p


@pytest.fixture(autouse=True, scope="session")
def _torch_threads():
    """Keep the suite polite on a shared 2-core machine."""
    try:
        import torch
    except ImportError:  # pragma: no cover
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # small tensors: 1 thread is up to 7x faster here
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def experiment_cache(tmp_path_factory):
    """One cell/artifact cache for every test that runs registered experiments (smoke and contract tests share
    cells, so the float64 test-scale run is computed once, and trained models are built once)."""
    return tmp_path_factory.mktemp("experiment_cache")
