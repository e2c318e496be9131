"""Where offline data lives: ATTNLIP_DATA (else ../shared/data next to the repo), NLTK data, image folders.

Every lookup fails with a FileNotFoundError that names the missing path and the environment variable to set.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from harness.errors import DataNotFound, MissingData  # noqa: F401 - re-exported

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_ENV = "ATTNLIP_DATA"
NLTK_ENV = "NLTK_DATA"
FASHION_ENV = "ATTNLIP_FASHION_MNIST"
CIFAR_ENV = "ATTNLIP_CIFAR10"
DEFAULT_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
# `make data` (part of `make install`) unpacks Debian's dataset-fashion-mnist here, without root
LOCAL_FASHION_MNIST = REPO_ROOT / ".data" / "fashion-mnist" / "usr" / "share" / "datasets" / "fashion-mnist"
FIX_FASHION = "make data   (downloads Debian's dataset-fashion-mnist and unpacks it into .data/, no root needed)"


def data_root() -> Path:
    """The shared data folder: $ATTNLIP_DATA, else <repo>/../shared/data."""
    env = os.environ.get(DATA_ENV)
    root = Path(env).expanduser() if env else REPO_ROOT.parent / "shared" / "data"
    if not root.is_dir():
        how = f"${DATA_ENV}={env}" if env else f"default {root} (${DATA_ENV} is unset)"
        raise DataNotFound(f"shared data folder not found: {how}; set {DATA_ENV} to the folder holding "
                                f"sst2/, ag_news/, nltk_data/, gpt2_tokenizer/")
    return root


def data_path(*parts: str) -> Path:
    """<data_root>/<parts...>, which must exist."""
    p = data_root().joinpath(*parts)
    if not p.exists():
        raise DataNotFound(f"missing shared data file {p} (data root from ${DATA_ENV}; "
                                f"see {data_root() / 'README.md'} for what belongs there)")
    return p


def has_shared_data(*parts: str) -> bool:
    """True when data_path(*parts) would succeed (for skipping tests)."""
    try:
        data_path(*parts)
        return True
    except FileNotFoundError:
        return False


def nltk_data_dir() -> Path:
    """NLTK's data folder: $NLTK_DATA if it exists, else <data_root>/nltk_data."""
    env = os.environ.get(NLTK_ENV)
    if env:
        for part in env.split(os.pathsep):
            if part and Path(part).is_dir():
                return Path(part)
    try:
        p = data_root() / "nltk_data"
    except FileNotFoundError as e:
        raise DataNotFound(f"no NLTK data: ${NLTK_ENV}={env!r} is not a folder and {e}") from None
    if not p.is_dir():
        raise DataNotFound(f"no NLTK data folder: ${NLTK_ENV}={env!r} and {p} does not exist; "
                                f"set {NLTK_ENV} or {DATA_ENV}")
    return p


def fashion_mnist_dir(root: Optional[str | os.PathLike] = None) -> Path:
    """Folder with the four Fashion-MNIST idx .gz files: root, else $ATTNLIP_FASHION_MNIST, else the copy
    `make data` unpacked into <repo>/.data, else the Debian path."""
    env = os.environ.get(FASHION_ENV)
    if root is not None or env:
        p = Path(root) if root is not None else Path(env)
    else:
        p = LOCAL_FASHION_MNIST if LOCAL_FASHION_MNIST.is_dir() else DEFAULT_FASHION_MNIST
    if not p.is_dir():
        raise DataNotFound(f"Fashion-MNIST folder {p} not found (also looked in {LOCAL_FASHION_MNIST}): run "
                           f"`make data`, pass root=... or set {FASHION_ENV}", fix=FIX_FASHION)
    return p


def cifar10_dir(root: Optional[str | os.PathLike] = None) -> Path:
    """Folder cifar-10-batches-py (python pickle format): root (or root/cifar-10-batches-py), else $ATTNLIP_CIFAR10,
    else <data_root>/cifar-10-batches-py."""
    env = os.environ.get(CIFAR_ENV)
    if root is not None:
        cands = [Path(root), Path(root) / "cifar-10-batches-py"]
    elif env:
        cands = [Path(env), Path(env) / "cifar-10-batches-py"]
    else:
        try:
            cands = [data_root() / "cifar-10-batches-py"]
        except FileNotFoundError:
            cands = [REPO_ROOT.parent / "shared" / "data" / "cifar-10-batches-py"]
    for c in cands:
        if (c / "test_batch").is_file():
            return c
    raise DataNotFound(f"CIFAR-10 not found at {', '.join(map(str, cands))} (need data_batch_1..5 and "
                            f"test_batch in python pickle format): pass root=... or set {CIFAR_ENV}; "
                            f"it cannot be downloaded offline")
