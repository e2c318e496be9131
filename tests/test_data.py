"""Data loaders: shapes, dtypes, ranges, chunking, clear errors for missing data."""
import re

import pytest
import torch

from harness.data import paths, text
from tests.test_data_sources import SHA, build_hub_cache, env  # noqa: F401 - env: the offline fixture


class WordTok:
    """A tiny whitespace tokenizer with the HF call signature used by token_chunks."""

    def __init__(self):
        self.vocab = {}
        self.name_or_path = "wordtok"

    def __len__(self):
        return 1000

    def __call__(self, texts, add_special_tokens=False, verbose=False):
        one = isinstance(texts, str)
        rows = []
        for t in [texts] if one else texts:
            ids = [self.vocab.setdefault(w, len(self.vocab) + 2) for w in t.split()]
            rows.append(([0] + ids + [1]) if add_special_tokens else ids)
        return {"input_ids": rows[0] if one else rows}


def test_token_chunks_non_overlapping():
    tok, texts = WordTok(), text.synthetic_corpus()
    stream = text.token_stream(tok, texts)
    c = text.token_chunks(tok, texts, n=7, count=20, seed=0)
    assert c.shape == (20, 7) and c.dtype == torch.long
    starts = []
    for row in c:  # every chunk is a window of the stream at a multiple of n
        hits = [s for s in range(0, stream.numel() - 6, 7) if torch.equal(stream[s:s + 7], row)]
        assert hits
        starts.append(hits[0])
    assert len(set(starts)) == 20
    assert torch.equal(c, text.token_chunks(tok, texts, n=7, count=20, seed=0))
    assert not torch.equal(c, text.token_chunks(tok, texts, n=7, count=20, seed=1))


def test_token_chunks_special_and_errors():
    tok, texts = WordTok(), text.synthetic_corpus()
    c = text.token_chunks(tok, texts, n=6, count=3, add_special_tokens=True)
    assert c.shape == (3, 6) and (c[:, 0] == 0).all() and (c[:, -1] == 1).all()
    with pytest.raises(ValueError, match="fewer than count"):
        text.token_chunks(tok, texts, n=50, count=10 ** 6)
    with pytest.raises(ValueError):
        text.token_chunks(tok, texts, n=0, count=1)
    with pytest.raises(ValueError, match="unknown corpus"):
        text.load_corpus("nope")


def test_missing_data_errors_name_path_and_env(monkeypatch, tmp_path):
    monkeypatch.setenv("ATTNLIP_DATA", str(tmp_path / "absent"))
    with pytest.raises(FileNotFoundError, match="ATTNLIP_DATA"):
        paths.data_root()
    monkeypatch.setenv("ATTNLIP_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"sst2.*ATTNLIP_DATA"):
        paths.data_path("sst2", "train.tsv")
    with pytest.raises(FileNotFoundError, match="ATTNLIP_CIFAR10"):
        paths.cifar10_dir(tmp_path)


def _rows(path, header):
    """Data rows of a mirror file whose first line is `header` (the loaders must read every one)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == header
    return len([ln for ln in lines[1:] if ln.strip()])


def test_mirror_corpora(shared_data):
    """Every row of the mirror's SST-2 and AG_NEWS files, with its label in the loaders' range."""
    import csv

    ag, (t, y) = text.load_corpus("ag_news"), text.load_labeled("sst2", "dev")
    with open(shared_data / "ag_news" / "test.csv", newline="", encoding="utf-8") as f:
        assert len(ag) == len(list(csv.DictReader(f))) > 0 and all(isinstance(a, str) and a for a in ag)
    assert set(text.load_labeled("ag_news")[1]) == {0, 1, 2, 3}
    assert len(text.load_corpus("sst2")) == _rows(shared_data / "sst2" / "train.tsv", "label\tsentence")
    assert len(t) == _rows(shared_data / "sst2" / "dev.tsv", "label\tcontent") and set(y) == {0, 1}
    assert text.load_corpus("sst2", "dev") == list(t)


AG_HEAD = "label,title,description\n1,Talks Resume,\"The minister said, talks (World).\"\n"


@pytest.mark.parametrize("name, file, content, where", [
    ("ag_news", "ag_news/test.csv", AG_HEAD + "3,Fears for T N", "line 3: 2 field(s)"),  # cut mid-row
    ("ag_news", "ag_news/test.csv", AG_HEAD + '3,Fears for Pension,"Unions representing wor', "line 3: not CSV"),
    ("ag_news", "ag_news/test.csv", AG_HEAD + "7,Title,Text\n", "line 3: 3 field(s) ['7'"),
    ("ag_news", "ag_news/test.csv", "label,title\n1,T\n", "line 1: header"),
    ("sst2", "sst2/train.tsv", "label\tsentence\n1\ta fine film\n0\n", "line 3: '0' where"),
    ("sst2", "sst2/train.tsv", "label\tsentence\n1\ta fine film\n0\ta dull fi", "line 3: the last row has no newline"),
    ("sst2", "sst2/train.tsv", "label\tsentence\n1\ta fine film\nx\tdull\n", "line 3: 'x\\tdull'"),
])
def test_a_damaged_mirror_file_is_named_not_read(tmp_path, monkeypatch, name, file, content, where):
    """A mirror file cut off mid-row (or otherwise not in its format) is an error naming the file, the line and
    the fix, never a text made of what is left ("Fears for T N None") or a traceback."""
    from harness.errors import MissingData

    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "dev.tsv").write_text("label\tcontent\n1\ta good film\n")  # the mirror needs both splits
    (tmp_path / file).parent.mkdir(exist_ok=True)
    (tmp_path / file).write_text(content, encoding="utf-8")
    monkeypatch.setenv("ATTNLIP_DATA", str(tmp_path))
    with pytest.raises(MissingData, match="truncated or damaged") as e:
        text.load_corpus(name)
    assert str(e.value).startswith(f"{tmp_path / file}: {where}"), str(e.value)
    assert "copy " + file + " into the mirror again" in e.value.fix


def test_real_corpora_sizes(real_mirror):
    assert len(text.load_corpus("ag_news")) == 7600
    assert len(text.load_corpus("sst2")) == 67349 and len(text.load_corpus("sst2", "dev")) == 872
    assert len(" ".join(text.load_corpus("alice")).split()) > 25000


def test_alice_via_nltk(shared_data):
    """Alice through NLTK's reader: one string per paragraph (blank-line blocks), whitespace squashed."""
    raw = (shared_data / "nltk_data" / "corpora" / "gutenberg" / "carroll-alice.txt").read_text(encoding="latin1")
    alice = text.load_corpus("alice")
    assert "Alice" in alice[0] and len(alice) == len([b for b in re.split(r"\n\s*\n", raw) if b.strip()])
    assert all("\n" not in p and "  " not in p for p in alice)
    assert " ".join(alice).split() == raw.split()


def test_load_sst2_ids(shared_data):
    from harness.models.text import bert_tokenizer

    with pytest.raises(ValueError, match="needs a tokenizer"):
        text.load_sst2("dev", max_len=16)
    n = len(text.load_corpus("sst2", "dev"))
    ids, y, mask = text.load_sst2("dev", max_len=16, tokenizer=bert_tokenizer(), return_mask=True)
    assert ids.shape == (n, 16) and ids.dtype == torch.long and y.shape == (n,)
    assert (ids[:, 0] == 101).all() and (mask.sum(1) >= 3).all()
    assert y.tolist() == text.load_labeled("sst2", "dev")[1]


# ---- images -----------------------------------------------------------------------------------------------
from harness.data.images import load_images  # noqa: E402


def _check_images(X, y, info, shape, n_classes):
    assert X.dtype == torch.float32 and y.dtype == torch.long and X.shape[1:] == shape and len(X) == len(y)
    assert X.min() >= 0 and X.max() <= 1 and y.min() >= 0 and y.max() < n_classes
    assert info["n_classes"] == n_classes and len(info["classes"]) == n_classes and info["source"]


def test_synthetic_and_digits():
    X, y, info = load_images("synthetic", split="test", limit=50)
    _check_images(X, y, info, (1, 28, 28), 10)
    assert len(X) == 50
    X2, _, _ = load_images("synthetic", split="test", limit=50)
    assert torch.equal(X, X2)
    X2[0] = 7  # callers get copies, the in-memory cache stays intact
    assert torch.equal(load_images("synthetic", split="test", limit=50)[0], X)
    Xd, yd, info = load_images("digits", split="train")
    _check_images(Xd, yd, info, (1, 8, 8), 10)
    Xt, _, _ = load_images("digits", split="test")
    assert len(Xd) + len(Xt) == 1797


def test_fashion_mnist():
    from harness.data import paths as P

    try:
        P.fashion_mnist_dir()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    X, y, info = load_images("fashion_mnist", split="test", limit=100)
    _check_images(X, y, info, (1, 28, 28), 10)
    assert info["classes"][9] == "Ankle boot" and y[:3].tolist() == [9, 2, 1]


def test_image_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="ATTNLIP_CIFAR10"):
        load_images("cifar10", root=tmp_path)
    with pytest.raises(FileNotFoundError, match="ATTNLIP_FASHION_MNIST"):
        load_images("fashion_mnist", root=tmp_path / "none")
    with pytest.raises(ValueError, match="unknown image dataset"):
        load_images("mnist")
    with pytest.raises(ValueError, match="split"):
        load_images("synthetic", split="val")


def test_cifar10_pickle_format(tmp_path):
    import pickle

    import numpy as np

    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    rng = np.random.RandomState(0)
    for nm in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        with open(d / nm, "wb") as f:
            pickle.dump({b"data": rng.randint(0, 256, (4, 3072), dtype=np.uint8), b"labels": list(range(4))}, f)
    X, y, info = load_images("cifar10", root=tmp_path, split="train")
    _check_images(X, y, info, (3, 32, 32), 10)
    assert len(X) == 20
    raw = pickle.load(open(d / "data_batch_1", "rb"))[b"data"][0]
    assert torch.allclose(X[0, 0, 0, :3], torch.tensor(raw[:3] / 255.0, dtype=torch.float32))


class _Boom:
    def __reduce__(self):
        import os

        return (os.system, ("echo planted > /dev/null",))


def test_cifar10_planted_pickle_is_refused(tmp_path):
    """A CIFAR batch whose pickle names any callable beyond numpy's array reconstruction is refused, never run."""
    import pickle

    d = tmp_path / "cifar-10-batches-py"
    d.mkdir()
    with open(d / "test_batch", "wb") as f:
        pickle.dump({b"data": _Boom(), b"labels": [0]}, f)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        load_images("cifar10", root=tmp_path, split="test")


def _fake_cifar100(parent, n_train=6, n_test=4):
    """parent/cifar-100-python as the python version ships it: train and test, dicts of b"data" (N, 3072) uint8,
    b"fine_labels" (0..99) and b"coarse_labels" (no meta: the class names are the loader's own)."""
    import pickle

    import numpy as np

    d = parent / "cifar-100-python"
    d.mkdir(parents=True)
    rng = np.random.RandomState(0)
    for nm, n in (("train", n_train), ("test", n_test)):
        fine = [99, 0] + rng.randint(1, 99, n - 2).tolist()
        with open(d / nm, "wb") as f:
            pickle.dump({b"data": rng.randint(0, 256, (n, 3072), dtype=np.uint8), b"fine_labels": fine,
                         b"coarse_labels": [lab // 5 for lab in fine], b"filenames": [b"x.png"] * n}, f)
    return d


def test_cifar100_pickle_format(tmp_path):
    import pickle

    d = _fake_cifar100(tmp_path)
    for split, n in (("train", 6), ("test", 4)):
        X, y, info = load_images("cifar100", root=tmp_path, split=split)
        _check_images(X, y, info, (3, 32, 32), 100)
        with open(d / split, "rb") as f:
            raw = pickle.load(f)  # the file this test wrote
        assert len(X) == n and y.tolist() == raw[b"fine_labels"] and y.max() == 99  # fine labels, not coarse
        assert torch.allclose(X.reshape(n, -1), torch.tensor(raw[b"data"] / 255.0, dtype=torch.float32))
    assert info["classes"][:3] == ["apple", "aquarium_fish", "baby"] and info["classes"][99] == "worm"
    assert info["source"] == str(d) and load_images("cifar100", root=d, split="test")[1].tolist() == y.tolist()


def test_cifar100_from_its_variable_and_the_mirror(tmp_path, monkeypatch):
    from harness.data import resolve

    monkeypatch.delenv("ATTNLIP_DATA", raising=False)
    local = _fake_cifar100(tmp_path / "local")
    for value in (local, local.parent):  # the folder itself or the one holding cifar-100-python
        monkeypatch.setenv("ATTNLIP_CIFAR100", str(value))
        assert resolve.source("cifar100") == "local:ATTNLIP_CIFAR100"
        X, y, info = load_images("cifar100", split="test")
        _check_images(X, y, info, (3, 32, 32), 100)
        assert len(X) == 4 and info["source"] == str(local)
    mirror = _fake_cifar100(tmp_path / "mirror")
    monkeypatch.setenv("ATTNLIP_DATA", str(mirror.parent))  # the mirror comes first
    assert resolve.source("cifar100") == "mirror:cifar100"
    X, y, info = load_images("cifar100", split="train")
    _check_images(X, y, info, (3, 32, 32), 100)
    assert len(X) == 6 and info["source"] == str(mirror)


def test_cifar100_missing_names_its_variable_and_the_fetch(tmp_path, monkeypatch):
    from harness.errors import DataNotFound

    monkeypatch.delenv("ATTNLIP_DATA", raising=False)
    monkeypatch.setenv("ATTNLIP_CIFAR100", str(tmp_path / "empty"))
    for call in (lambda: paths.cifar100_dir(tmp_path), lambda: load_images("cifar100", root=tmp_path),
                 lambda: load_images("cifar100", split="test")):  # the last through $ATTNLIP_CIFAR100
        with pytest.raises(DataNotFound, match="ATTNLIP_CIFAR100") as e:
            call()
        assert "cifar-100-python" in str(e.value) and e.value.fix == "attnlip data fetch cifar100"
    d = _fake_cifar100(tmp_path / "half")
    (d / "train").unlink()
    with pytest.raises(DataNotFound, match="missing CIFAR-100 file .*train") as e:
        load_images("cifar100", root=d, split="train")
    assert e.value.fix == "attnlip data fetch cifar100"


def test_cifar100_planted_pickle_is_refused(tmp_path):
    """A planted CIFAR-100 file is refused by the same restricted unpickler as CIFAR-10's: nothing runs."""
    import os
    import pickle

    class Planted:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path / 'ran'}",))

    d = _fake_cifar100(tmp_path)
    with open(d / "test", "wb") as f:
        pickle.dump({b"data": Planted(), b"fine_labels": [0]}, f)
    with pytest.raises(pickle.UnpicklingError, match="refusing to load .* from a CIFAR batch"):
        load_images("cifar100", root=tmp_path, split="test")
    assert not (tmp_path / "ran").exists()


def test_cifar100_hub_copy_reads_the_fine_labels(env, capsys):
    """The hub route (uoft-cs/cifar100 in the `datasets` cache): images from `img`, labels from `fine_label`."""
    import datasets
    import numpy as np
    from PIL import Image

    from harness.data import cli, resolve

    assert cli.cmd_fetch(["cifar100"]) == 1 and "cifar100: hub download off" in capsys.readouterr().err
    arrs = [np.random.RandomState(i).randint(0, 256, (32, 32, 3), dtype=np.uint8) for i in range(3)]
    feats = datasets.Features({"img": datasets.Image(), "fine_label": datasets.Value("int64"),
                               "coarse_label": datasets.Value("int64")})
    build_hub_cache("cifar100", {"test": {"img": [Image.fromarray(a) for a in arrs], "fine_label": [99, 0, 42],
                                          "coarse_label": [13, 4, 8]}}, features=feats)
    X, y, info = load_images("cifar100", split="test")
    _check_images(X, y, info, (3, 32, 32), 100)
    assert y.tolist() == [99, 0, 42] and info["source"] == f"hf:uoft-cs/cifar100@{SHA[:12]}"
    assert np.allclose(X[0].numpy(), arrs[0].transpose(2, 0, 1) / 255.0)
    assert resolve.fetch("cifar100") == (True, f"cifar100: already available (hf:uoft-cs/cifar100@{SHA[:12]})")
    assert cli.cmd_list() == 0
    out = capsys.readouterr().out
    assert "hf:uoft-cs/cifar100" in out and "cifar-100-python/train, test, meta" in out


def test_synthetic_labeled_ids():
    ids, y, vocab = text.synthetic_labeled_ids("train", 8, limit=10)
    assert ids.shape == (10, 8) and y.shape == (10,) and vocab == 200
    assert torch.equal(ids[:, 1], 1 + y) and ids.max() < vocab
    assert torch.equal(text.synthetic_labeled_ids("train", 8, limit=10)[0], ids)
    assert not torch.equal(text.synthetic_labeled_ids("test", 8, limit=10)[0], ids)
