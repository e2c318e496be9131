"""A data file that is empty, cut off or not in its format, read inside a cell: one line naming the file and the fix
(`attnlip data fetch NAME`), the cell skipped as missing data, the other cells computed, the run failing at the
end with the file in its summary; never a traceback."""
from __future__ import annotations

import gzip
import pickle
import random

import numpy as np
import pytest

from harness import cli
from harness.data import images, text
from harness.errors import MissingData
from tests import _tiny_mirror as T
from tests._harness_fakes import registered_reader

FAKE = '''
from harness.catalog import Experiment, experiment


@experiment
class FakeReadsCorpus(Experiment):
    """Fake: how many texts a corpus has."""

    name = "_fake_reads_corpus"
    grid = {"corpus": ["alice", "brown"]}

    def run(self, cell, ctx):
        from harness.data import text

        return [{"texts": len(text.load_corpus(cell["corpus"]))}]
'''


@pytest.fixture
def mirror(tmp_path, monkeypatch):
    """A mirror with Alice and Brown, the only data source; the fake experiment registered."""
    root = tmp_path / "mirror"
    corpora = root / "nltk_data" / "corpora"
    (corpora / "gutenberg").mkdir(parents=True)
    (corpora / "gutenberg" / "carroll-alice.txt").write_text("One paragraph.\n\nAnother one.\n")
    brown = T.brown_files(random.Random(0))
    T._zip(corpora / "brown.zip", [(f"brown/{f}", t) for f, _, t in brown] +
           [("brown/cats.txt", "".join(f"{f} {c}\n" for f, c, _ in brown))])
    for _ in registered_reader(tmp_path, monkeypatch, root, "fake_corpus", FAKE, "_fake_reads_corpus"):
        yield corpora


def test_an_emptied_mirror_file_fails_its_cell_in_one_line(mirror, tmp_path, capsys):
    alice = mirror / "gutenberg" / "carroll-alice.txt"
    alice.write_text("")
    said = []
    rc = cli.main(["_fake_reads_corpus", "--results-dir", str(tmp_path / "r"), "--no-progress", "--no-figures"],
                  out=said.append)
    err = capsys.readouterr().err
    assert rc == 1 and "Traceback" not in err, err
    line = next(x for x in said if x.startswith("_fake_reads_corpus: "))
    assert "1 computed" in line and "1 missing data" in line, line  # brown computed, alice not
    assert f"{alice}: no text in it" in err and "attnlip data fetch alice" in err, err


@pytest.mark.parametrize("cut", [0, 200, -40])
def test_a_cut_off_nltk_zip_is_missing_data_naming_it(mirror, cut):
    z = mirror / "brown.zip"
    data = z.read_bytes()
    z.write_bytes(data[:cut] if cut >= 0 else data[:cut])
    with pytest.raises(MissingData, match=r"brown\.zip: .*attnlip data fetch brown") as e:
        text.load_corpus("brown")
    assert "\n" not in str(e.value) and "attnlip data fetch brown" in e.value.fix


def _idx(path, arr):
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(head + arr.astype(np.uint8).tobytes())


@pytest.mark.parametrize("damage", ["empty", "cut", "short"])
def test_damaged_fashion_mnist_files_are_missing_data(tmp_path, damage):
    imgs = tmp_path / "t10k-images-idx3-ubyte.gz"
    _idx(imgs, np.zeros((4, 28, 28)))
    _idx(tmp_path / "t10k-labels-idx1-ubyte.gz", np.arange(4))
    raw = imgs.read_bytes()
    imgs.write_bytes(b"" if damage == "empty" else raw[: len(raw) // 2] if damage == "cut" else b"")
    if damage == "short":  # a whole gzip file holding fewer values than its header says
        with gzip.open(imgs, "wb") as f:
            f.write(bytes([0, 0, 8, 3]) + b"".join(n.to_bytes(4, "big") for n in (4, 28, 28)) + b"\0" * 100)
    with pytest.raises(MissingData, match="t10k-images-idx3-ubyte.gz: .*attnlip data fetch fashion_mnist"):
        images.load_images("fashion_mnist", root=tmp_path, split="test")


def test_a_cut_off_cifar_batch_is_missing_data(tmp_path):
    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    batch = pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]})
    (d / "test_batch").write_bytes(batch[: len(batch) // 2])
    with pytest.raises(MissingData, match="test_batch: not a CIFAR-10 batch .*attnlip data fetch cifar10"):
        images.load_images("cifar10", root=tmp_path, split="test")
