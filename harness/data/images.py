"""Image datasets as float tensors in [0, 1]: Fashion-MNIST, CIFAR-10, CIFAR-100 (100 fine classes), SVHN (cropped
digits), sklearn digits, and the one synthetic learnable set for tests and test-scale runs. Decoded arrays are cached
in memory only.

Fashion-MNIST, CIFAR-10, CIFAR-100 and SVHN come from the source harness.data.resolve picks: an explicit `root`, the
$ATTNLIP_DATA mirror, ATTNLIP_FASHION_MNIST / ATTNLIP_CIFAR10 / ATTNLIP_CIFAR100, Debian's dataset-fashion-mnist, or
the Hugging Face hub through the `datasets` cache. Fashion-MNIST files are idx .gz; CIFAR files are python pickles,
read by a restricted unpickler that admits only numpy arrays and plain data; hub copies are Arrow files of PNG
images."""
from __future__ import annotations

import functools
import gzip
import os
import pickle
import zlib
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
import torch

from harness.data import hub, paths, resolve, sources

DATASETS = ("fashion_mnist", "digits", "cifar10", "cifar100", "svhn", "synthetic")
FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
                   "Ankle boot")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
CIFAR100_CLASSES = tuple("""apple aquarium_fish baby bear beaver bed bee beetle bicycle bottle bowl boy bridge bus
butterfly camel can castle caterpillar cattle chair chimpanzee clock cloud cockroach couch crab crocodile cup dinosaur
dolphin elephant flatfish forest fox girl hamster house kangaroo keyboard lamp lawn_mower leopard lion lizard lobster
man maple_tree motorcycle mountain mouse mushroom oak_tree orange orchid otter palm_tree pear pickup_truck pine_tree
plain plate poppy porcupine possum rabbit raccoon ray road rocket rose sea seal shark shrew skunk skyscraper snail
snake spider squirrel streetcar sunflower sweet_pepper table tank telephone television tiger tractor train trout tulip
turtle wardrobe whale willow_tree wolf woman worm""".split())  # the fine labels 0..99, as in the files' meta
# CIFAR pickle files: name -> (label, folder lookup, train files, test files, label key)
CIFAR_FILES = {
    "cifar10": ("CIFAR-10", paths.cifar10_dir, tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",),
                b"labels"),
    "cifar100": ("CIFAR-100", paths.cifar100_dir, ("train",), ("test",), b"fine_labels"),
}


def _read_idx(path: Path) -> np.ndarray:
    """Decode a gzipped idx file (big-endian header: magic, dims) into a uint8 array; an empty, cut-off or
    malformed file is paths.damaged."""
    try:
        with gzip.open(path, "rb") as f:
            data = f.read()
    except (EOFError, OSError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise paths.damaged(path, f"not a complete gzip file ({e.__class__.__name__}: {e})", "fashion_mnist") from None
    magic = int.from_bytes(data[:4], "big")
    if len(data) < 4 or magic >> 8 != 0x08:  # 0x0000 08 nd: unsigned byte
        raise paths.damaged(path, f"not an unsigned-byte idx file (magic {magic:#x})", "fashion_mnist")
    nd = magic & 0xFF
    dims = [int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(nd)]
    arr = np.frombuffer(data, dtype=np.uint8, offset=min(4 + 4 * nd, len(data)))
    if len(data) < 4 + 4 * nd or arr.size != int(np.prod(dims)) or not arr.size:
        raise paths.damaged(path, f"a truncated idx file ({arr.size} values, header says {dims})", "fashion_mnist")
    return arr.reshape(dims)


@functools.lru_cache(maxsize=None)
def _hub_images(name: str, where: Path, split: str) -> Tuple[np.ndarray, np.ndarray, str]:
    """A hub copy's split as uint8 (N, C, H, W) and int64 labels; grayscale sets keep one channel."""
    h = sources.get(name).hub
    ds = hub.load_split(h, h.split(split), where)
    mode = "L" if name == "fashion_mnist" else "RGB"
    X = np.stack([np.asarray(im.convert(mode), dtype=np.uint8) for im in ds[h.image]])
    X = X[:, None] if X.ndim == 3 else X.transpose(0, 3, 1, 2)
    return X, np.asarray(ds[h.label], dtype=np.int64), hub.source(h, where)


def _fashion(root: Optional[str], split: str) -> Tuple[np.ndarray, np.ndarray, str]:
    if root is not None:
        d = paths.fashion_mnist_dir(root)
        return _fashion_idx(str(d), split, paths.stamp(d))
    r = resolve.require("fashion_mnist")
    if r.kind == "hf":
        return _hub_images("fashion_mnist", r.path, split)
    d = r.path / "fashion-mnist" if r.kind == "mirror" else r.path
    return _fashion_idx(str(d), split, paths.stamp(d))


@functools.lru_cache(maxsize=None)
def _fashion_idx(folder: str, split: str, stamp: tuple = ()) -> Tuple[np.ndarray, np.ndarray, str]:
    d = Path(folder)
    stem = "train" if split == "train" else "t10k"
    files = [d / f"{stem}-images-idx3-ubyte.gz", d / f"{stem}-labels-idx1-ubyte.gz"]
    for f in files:
        if not f.is_file():
            raise paths.DataNotFound(f"missing Fashion-MNIST file {f} (pass root=..., set {paths.FASHION_ENV} to "
                                     f"a folder holding the four idx .gz files, or unset it)", fix=paths.FIX_FASHION)
    X = _read_idx(files[0])[:, None]  # (N, 1, 28, 28) uint8
    y = _read_idx(files[1]).astype(np.int64)
    if len(X) != len(y):
        raise paths.damaged(files[1], f"{len(y)} labels for the {len(X)} images of {files[0].name}", "fashion_mnist")
    return X, y, str(d)


@functools.lru_cache(maxsize=None)
def _digits(split: str) -> Tuple[np.ndarray, np.ndarray, str]:
    """sklearn's 8x8 digits (1,797 images, values 0..16); a fixed seeded 80/20 train/test split."""
    from sklearn.datasets import load_digits

    b = load_digits()
    perm = np.random.RandomState(0).permutation(len(b.target))
    n_test = len(perm) // 5
    idx = perm[n_test:] if split == "train" else perm[:n_test]
    X = (b.images[idx] / 16.0)[:, None].astype(np.float32)  # (N, 1, 8, 8) in [0, 1]
    return X, b.target[idx].astype(np.int64), "sklearn.datasets.load_digits (seeded 80/20 split)"


class Refused(pickle.UnpicklingError):
    """A pickle that names a callable the safe unpickler does not admit: planted, never run (not damage)."""


class _SafeUnpickler(pickle.Unpickler):
    """Admits dicts/lists/bytes/str/int/float and numpy arrays only: a planted pickle cannot run code."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
               ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise Refused(f"refusing to load {module}.{name} from a CIFAR batch (only arrays and plain data are "
                      "allowed)")


def safe_pickle_load(fh):
    """pickle.load restricted to numpy arrays and plain data (bytes keys decoded as in encoding='bytes')."""
    return _SafeUnpickler(fh, encoding="bytes").load()


def _cifar(name: str, root: Optional[str], split: str) -> Tuple[np.ndarray, np.ndarray, str]:
    """CIFAR-10 or CIFAR-100 (fine labels): from `root`, else the source harness.data.resolve picks."""
    folder = CIFAR_FILES[name][1]
    if root is not None:
        return _cifar_pickles(name, str(folder(root)), split, paths.stamp(folder(root)))
    r = resolve.require(name)
    if r.kind == "hf":
        return _hub_images(name, r.path, split)
    return _cifar_pickles(name, str(folder(r.path)), split, paths.stamp(folder(r.path)))


@functools.lru_cache(maxsize=None)
def _cifar_pickles(name: str, folder: str, split: str, stamp: tuple = ()) -> Tuple[np.ndarray, np.ndarray, str]:
    """The split's pickle files in `folder` (dicts with b"data" (N, 3072) uint8 and the label key) as uint8
    (N, 3, 32, 32) and int64 labels, read by safe_pickle_load."""
    d, (label, _, train, test, label_key) = Path(folder), CIFAR_FILES[name]
    xs, ys = [], []
    for nm in train if split == "train" else test:
        f = d / nm
        if not f.is_file():
            raise paths.DataNotFound(f"missing {label} file {f} (python pickle format, "
                                     f"{paths.CIFAR_FOLDERS[name][0]})", fix=f"attnlip data fetch {name}")
        try:
            with open(f, "rb") as fh:
                batch = safe_pickle_load(fh)
            xs.append(np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(batch[label_key], dtype=np.int64))
            if not len(xs[-1]) or len(xs[-1]) != len(ys[-1]):
                raise ValueError(f"{len(xs[-1])} images, {len(ys[-1])} labels")
        except Refused:
            raise
        except (pickle.UnpicklingError, EOFError, KeyError, TypeError, ValueError) as e:
            raise paths.damaged(f, f"not a {label} batch ({e.__class__.__name__}: {e})", name) from None
    return np.concatenate(xs), np.concatenate(ys), str(d)


@functools.lru_cache(maxsize=None)
def _synthetic(split: str, size: int, channels: int, n_classes: int, n: int) -> Tuple[np.ndarray, np.ndarray, str]:
    """Class prototypes (smooth random blobs, seed 0) plus noise (seed by split), clipped to [0, 1]."""
    proto_rng = np.random.RandomState(0)
    coarse = proto_rng.rand(n_classes, channels, 4, 4)
    protos = coarse.repeat(-(-size // 4), axis=2).repeat(-(-size // 4), axis=3)[:, :, :size, :size]
    rng = np.random.RandomState(1 if split == "train" else 2)
    y = rng.randint(0, n_classes, size=n)
    X = np.clip(protos[y] + 0.15 * rng.randn(n, channels, size, size), 0, 1).astype(np.float32)
    return X, y.astype(np.int64), "synthetic prototypes + noise"


def load_images(name: str = "fashion_mnist", root: Optional[str | os.PathLike] = None, split: str = "train",
                limit: Optional[int] = None, size: int = 28, channels: int = 1, n_classes: int = 10,
                n_synthetic: Optional[int] = None):
    """(X (N, C, H, W) float32 in [0, 1], y (N,) long, info) for fashion_mnist | digits | cifar10 | cifar100 | svhn |
    synthetic (cifar100: the 100 fine labels).

    limit keeps the first `limit` examples (file order; digits/synthetic are already shuffled). size,
    channels, n_classes, n_synthetic only shape the synthetic set (default 1x28x28, 10 classes, 1000/200).
    info: name, split, classes, n_classes, shape (C, H, W), source.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if limit is not None and limit < 1:
        raise ValueError(f"limit must be a positive int or None, got {limit}")
    root_s = None if root is None else str(root)
    if name == "fashion_mnist":
        X, y, src = _fashion(root_s, split)
        classes = FASHION_CLASSES
    elif name == "digits":
        X, y, src = _digits(split)
        classes = tuple(str(i) for i in range(10))
    elif name in CIFAR_FILES:
        X, y, src = _cifar(name, root_s, split)
        classes = CIFAR10_CLASSES if name == "cifar10" else CIFAR100_CLASSES
    elif name == "svhn":
        X, y, src = _hub_images("svhn", resolve.require("svhn").path, split)
        classes = tuple(str(i) for i in range(10))
    elif name == "synthetic":
        n = n_synthetic or (1000 if split == "train" else 200)
        X, y, src = _synthetic(split, size, channels, n_classes, n)
        classes = tuple(f"class{i}" for i in range(n_classes))
    else:
        raise ValueError(f"unknown image dataset {name!r}; choose one of {DATASETS}")
    if limit is not None:
        X, y = X[:limit], y[:limit]
    Xt = torch.from_numpy(np.array(X))  # a private copy: the cached array stays untouched
    Xt = Xt.float() / 255.0 if Xt.dtype == torch.uint8 else Xt.float()  # (N, C, H, W)
    info = {"name": name, "split": split, "classes": list(classes), "n_classes": len(classes),
            "shape": tuple(Xt.shape[1:]), "source": src}
    return Xt, torch.from_numpy(np.array(y)).long(), info
