"""Shared pytest fixtures: `data_mirror` (the data mirror every test reads: $ATTNLIP_DATA, else a tiny synthetic one
built for the session), `shared_data` (a test that reads the mirror), `real_mirror` (a test that needs the real
corpora's contents); 1 torch thread; headless matplotlib; offline Hugging Face and NLTK (no test downloads)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import config as _config

# Before anything imports torch: pin its CPU kernels as run_all.py and attnlip do (config.portable_numerics), so that
# tests comparing with committed numbers compute them the way they were committed. The user's own values and
# ATTNLIP_NATIVE_ISA=1 are honoured; tests that need the committed kernels skip, saying why, when those differ
# (committed_kernels below), and test_threads checks that this process really holds the pin.
PINNED = _config.portable_numerics()
TORCH_LOADED_BEFORE_PIN = _config.torch_already_loaded()

# Every experiment registers before a test module reads the registry (harness.catalog lists what is imported;
# harness.run.discovery imports the experiments package and $ATTNLIP_EXPERIMENTS_PATH).
from harness.run import discovery as _discovery  # noqa: E402

_discovery.load_all()

os.environ.setdefault("MPLBACKEND", "Agg")
for _k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "ATTNLIP_OFFLINE"):
    os.environ.setdefault(_k, "1")

REPO = Path(__file__).resolve().parent.parent
# $ATTNLIP_DATA as the user set it, read before data_mirror may point it at the tiny mirror
USER_MIRROR = os.environ.get("ATTNLIP_DATA") or None


def shared_data_dir() -> Path | None:
    """The data mirror the user set ($ATTNLIP_DATA), or None when it is unset."""
    return Path(USER_MIRROR) if USER_MIRROR else None


@pytest.fixture(autouse=True, scope="session")
def data_mirror(tmp_path_factory):
    """The data mirror of the session. $ATTNLIP_DATA when set (CI sets the real one; NLTK_DATA defaults to its
    nltk_data/). Unset: a tiny synthetic mirror with the same layout (tests/_tiny_mirror.py) is built in a session
    temp folder and ATTNLIP_DATA / NLTK_DATA point at it for the session, so tests and the experiment runs they
    start read text corpora and the GPT-2 tokenizer on any machine, offline."""
    p = shared_data_dir()
    with pytest.MonkeyPatch.context() as mp:
        if p is not None:
            if p.is_dir() and not os.environ.get("NLTK_DATA"):
                mp.setenv("NLTK_DATA", str(p / "nltk_data"))
        else:
            from tests._tiny_mirror import build

            p = build(tmp_path_factory.mktemp("tiny_mirror"))
            mp.setenv("ATTNLIP_DATA", str(p))
            mp.setenv("NLTK_DATA", os.pathsep.join(filter(None, (str(p / "nltk_data"), os.environ.get("NLTK_DATA")))))
        yield p


@pytest.fixture(scope="session")
def shared_data(data_mirror) -> Path:
    """The session's data mirror (real or tiny, see data_mirror); skips the test, with the reason, when
    $ATTNLIP_DATA is set to something that is not a folder."""
    if not data_mirror.is_dir():
        pytest.skip(f"ATTNLIP_DATA={data_mirror} is not a folder: unset it (the tests then build a tiny mirror) "
                    f"or point it at a folder laid out as `attnlip data list` shows")
    return data_mirror


@pytest.fixture(scope="session")
def real_mirror(shared_data) -> Path:
    """The user's data mirror with the real corpora, for tests that check numbers only they give (row counts,
    the GPT-2 vocabulary); skips, with the reason, when the session runs on the tiny mirror."""
    if USER_MIRROR is None:
        pytest.skip("needs the real data mirror (the test checks what only the real corpora give): set "
                    "ATTNLIP_DATA to a folder laid out as `attnlip data list` shows; without it the tests run on a "
                    "tiny synthetic mirror")
    return shared_data


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


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """Nothing reachable: hub downloads off, an empty `datasets` cache, no mirror; the substitutes' resolver forgets
    earlier answers before and after. Yields tmp_path."""
    from harness.run import substitutes

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "ds_cache"))
    for v in ("ATTNLIP_DATA", "ATTNLIP_CIFAR10"):
        monkeypatch.delenv(v, raising=False)
    substitutes.clear_cache()
    yield tmp_path
    substitutes.clear_cache()


@pytest.fixture
def committed_kernels():
    """For tests that recompute committed numbers in this process: skips, with the reason, when torch runs other
    CPU kernels than the committed results were computed with (config.COMMITTED_CAPABILITY on x86-64: the AVX2
    pin), i.e. when the user exported another ATEN_CPU_CAPABILITY or ATTNLIP_NATIVE_ISA=1. Rounding then differs
    in the last bits, and statistics of those bits are not the committed ones."""
    why = _config.committed_kernels_differ()
    if why:
        pytest.skip(why)
