"""Shared pytest fixtures: `shared_data` (../shared/data or $ATTNLIP_DATA, skip if absent); 1 torch thread;
headless matplotlib; offline Hugging Face."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("MPLBACKEND", "Agg")
for _k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE"):
    os.environ.setdefault(_k, "1")

REPO = Path(__file__).resolve().parent.parent


def shared_data_dir() -> Path:
    """$ATTNLIP_DATA if set, else ../shared/data next to the repository."""
    env = os.environ.get("ATTNLIP_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """Path to the shared offline data folder; skips the test (with the reason) when it is absent."""
    p = shared_data_dir()
    if not p.is_dir():
        pytest.skip(f"shared data not found at {p} (set ATTNLIP_DATA to the folder from ../shared/data)")
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
