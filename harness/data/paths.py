"""Where local data lives: the optional mirror folder $ATTNLIP_DATA, and explicit image folders.

The mirror is one folder laid out as harness.data.sources.MIRROR_LAYOUT describes; it is optional (the libraries'
own caches and downloads are the other sources, see harness.data.resolve). Every lookup that cannot succeed raises
harness.errors.DataNotFound naming the missing path and the setting that provides it.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Tuple

from harness.errors import DataNotFound, MissingData  # noqa: F401 - re-exported

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_ENV = "ATTNLIP_DATA"
NLTK_ENV = "NLTK_DATA"
FASHION_ENV = "ATTNLIP_FASHION_MNIST"
CIFAR_ENV = "ATTNLIP_CIFAR10"
CIFAR100_ENV = "ATTNLIP_CIFAR100"
DEFAULT_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
# `make data` unpacks Debian's dataset-fashion-mnist here, without root
LOCAL_FASHION_MNIST = REPO_ROOT / ".data" / "fashion-mnist" / "usr" / "share" / "datasets" / "fashion-mnist"
FIX_FASHION = "attnlip data fetch fashion_mnist   (or `make data`, which also unpacks Debian's dataset-fashion-mnist)"


def stamp(*paths: Path) -> Tuple[tuple, ...]:
    """(path, size, mtime) of each file among `paths` (a folder: the files in it). The loaders' in-memory caches
    take it as part of their key, so a file edited on disk is read again."""
    files = [f for p in paths for f in ([p] if p.is_file() else sorted(p.rglob("*")) if p.is_dir() else [])]
    return tuple((str(f), st.st_size, st.st_mtime_ns) for f in files if f.is_file() for st in [f.stat()])


def damaged(path: Path, what: str, name: str, fix: str = "") -> MissingData:
    """The error for a data file that is empty, cut off or not in its format (one line: the file, what is wrong,
    the fix). Raised inside a cell, it skips the cell as missing data; the run goes on and fails at the end."""
    fix = fix or f"replace it with a good copy, or delete it and run `attnlip data fetch {name}`"
    return MissingData(f"{path}: {what}; the copy is truncated or damaged. Fix: {fix}", fix=fix)


def mirror_root() -> Optional[Path]:
    """The mirror folder $ATTNLIP_DATA, or None when it is unset. A set value that is not a folder is an error."""
    env = os.environ.get(DATA_ENV)
    if not env:
        return None
    root = Path(env).expanduser()
    if not root.is_dir():
        raise DataNotFound(f"${DATA_ENV}={env} is not a folder; unset it or point it at a data mirror",
                           fix=f"unset {DATA_ENV}")
    return root


def data_root() -> Path:
    """The mirror folder $ATTNLIP_DATA, which must be set and exist."""
    root = mirror_root()
    if root is None:
        raise DataNotFound(f"no data mirror: ${DATA_ENV} is unset (it is optional; `attnlip data fetch` fills the "
                           f"libraries' own caches instead)", fix="attnlip data fetch")
    return root


def data_path(*parts: str) -> Path:
    """<mirror>/<parts...>, which must exist."""
    p = data_root().joinpath(*parts)
    if not p.exists():
        raise DataNotFound(f"missing mirror file {p} (mirror from ${DATA_ENV}); `attnlip data list` shows the "
                           f"mirror layout", fix="attnlip data fetch")
    return p


def has_shared_data(*parts: str) -> bool:
    """True when the mirror is set and holds <parts...> (for skipping tests)."""
    try:
        data_path(*parts)
        return True
    except FileNotFoundError:
        return False


def mirror_file(*parts: str) -> Optional[Path]:
    """<mirror>/<parts...> when the mirror is set and holds it, else None."""
    root = mirror_root()
    if root is None:
        return None
    p = root.joinpath(*parts)
    return p if p.exists() else None


def nltk_data_dir() -> Path:
    """The first folder of $NLTK_DATA that exists, else <mirror>/nltk_data."""
    env = os.environ.get(NLTK_ENV)
    if env:
        for part in env.split(os.pathsep):
            if part and Path(part).is_dir():
                return Path(part)
    p = mirror_file("nltk_data")
    if p is None:
        raise DataNotFound(f"no NLTK data folder: ${NLTK_ENV}={env!r} and no {DATA_ENV}/nltk_data",
                           fix="attnlip data fetch")
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


# CIFAR folders in python pickle format: name -> (folder, variable, the file that marks it, what, the files needed)
CIFAR_FOLDERS = {
    "cifar10": ("cifar-10-batches-py", CIFAR_ENV, "test_batch", "CIFAR-10 batches", "data_batch_1..5 and test_batch"),
    "cifar100": ("cifar-100-python", CIFAR100_ENV, "test", "CIFAR-100 files", "train and test"),
}


def _cifar_dir(name: str, root: Optional[str | os.PathLike]) -> Path:
    """The folder of CIFAR_FOLDERS[name]: root (or root/<folder>), else $<variable> (or $<variable>/<folder>), else
    <mirror>/<folder>; else DataNotFound naming the places looked at, the variable and `attnlip data fetch name`."""
    folder, var, probe, what, need = CIFAR_FOLDERS[name]
    env = os.environ.get(var)
    if root is not None:
        cands = [Path(root), Path(root) / folder]
    elif env:
        cands = [Path(env), Path(env) / folder]
    else:
        m = mirror_root()
        cands = [m / folder] if m is not None else []
    for c in cands:
        if (c / probe).is_file():
            return c
    where = ", ".join(map(str, cands)) or f"nowhere (${DATA_ENV} and ${var} are unset)"
    raise DataNotFound(f"{what} not found at {where} (need {need} in python pickle format): pass root=... or set "
                       f"{var}", fix=f"attnlip data fetch {name}")


def cifar10_dir(root: Optional[str | os.PathLike] = None) -> Path:
    """Folder cifar-10-batches-py (python pickle format): root (or root/cifar-10-batches-py), else $ATTNLIP_CIFAR10,
    else <mirror>/cifar-10-batches-py."""
    return _cifar_dir("cifar10", root)


def cifar100_dir(root: Optional[str | os.PathLike] = None) -> Path:
    """Folder cifar-100-python (train, test, meta; python pickle format): root (or root/cifar-100-python), else
    $ATTNLIP_CIFAR100, else <mirror>/cifar-100-python."""
    return _cifar_dir("cifar100", root)
