"""Text corpora (Alice, AG_NEWS, SST-2, Brown) and non-overlapping token chunks (Castin et al. Fig. 1).

Each corpus comes from the source harness.data.resolve picks (the $ATTNLIP_DATA mirror, NLTK's data path, the
`datasets` cache, or a download) and is cached in memory per source. Every source gives the same shapes: Alice
and Brown one string per paragraph, AG_NEWS 'title description' with labels 0..3, SST-2 'train' and 'dev' (the
hub's validation split) with labels 0/1.
"""
from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import io
import random
import re
import zipfile
import zlib
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

import torch

from harness.data import hub, paths, resolve, sources
from harness.errors import MissingData

CORPORA = ("alice", "ag_news", "sst2", "brown", "synthetic")


def _squash(s: str) -> str:
    return re.sub(r"\s+", " ", s).strip()


def _nltk_root(r: resolve.Resolved) -> Path:
    return r.path / "nltk_data" if r.kind == "mirror" else r.path


def _nltk_stamp(root: Path, package: str) -> Tuple[tuple, ...]:
    return paths.stamp(root / "corpora" / package, root / "corpora" / f"{package}.zip")


def _alice() -> Tuple[str, ...]:
    """Alice in Wonderland (NLTK Gutenberg carroll-alice.txt), one string per paragraph."""
    root = _nltk_root(resolve.require("alice"))
    return _alice_at(root, paths.stamp(root / "corpora" / "gutenberg" / "carroll-alice.txt",
                                       root / "corpora" / "gutenberg.zip"))


@functools.lru_cache(maxsize=None)
def _alice_at(root: Path, stamp: tuple = ()) -> Tuple[str, ...]:
    from nltk.corpus.reader import PlaintextCorpusReader

    with _readable(root, "gutenberg", "alice"):
        raw = resolve.nltk_reader(root, "gutenberg", PlaintextCorpusReader, r"(?!\.).*\.txt",
                                  encoding="latin1").raw("carroll-alice.txt")
    return _nonempty(tuple(p for p in (_squash(b) for b in re.split(r"\n\s*\n", raw)) if p), root, "gutenberg",
                     "alice")


def _brown() -> Tuple[str, ...]:
    """NLTK Brown corpus, one string per paragraph (words joined by spaces)."""
    root = _nltk_root(resolve.require("brown"))
    return _brown_at(root, _nltk_stamp(root, "brown"))


@functools.lru_cache(maxsize=None)
def _brown_at(root: Path, stamp: tuple = ()) -> Tuple[str, ...]:
    from nltk.corpus.reader import CategorizedTaggedCorpusReader

    with _readable(root, "brown", "brown"):
        reader = resolve.nltk_reader(root, "brown", CategorizedTaggedCorpusReader, r"c[a-z]\d\d",
                                     cat_file="cats.txt", tagset="brown", encoding="ascii")
        paras = tuple(" ".join(w for s in p for w in s) for p in reader.paras())
    return _nonempty(paras, root, "brown", "brown")


@contextlib.contextmanager
def _readable(root: Path, package: str, name: str):
    """An NLTK package that cannot be read (a cut-off or empty zip, an undecodable file) is paths.damaged."""
    try:
        yield
    except (zipfile.BadZipFile, EOFError, zlib.error, UnicodeDecodeError, ValueError) as e:
        why = (str(e).strip().splitlines() or [""])[0][:160]
        raise paths.damaged(_package_file(root, package), f"unreadable ({e.__class__.__name__}: {why})", name) from None


def _nonempty(texts: Tuple[str, ...], root: Path, package: str, name: str) -> Tuple[str, ...]:
    if not texts:
        raise paths.damaged(_package_file(root, package), "no text in it (an empty file?)", name)
    return texts


def _package_file(root: Path, package: str) -> Path:
    """The file or folder of an NLTK package under root, for messages."""
    zipped = root / "corpora" / f"{package}.zip"
    if package == "gutenberg" and (root / "corpora" / "gutenberg" / "carroll-alice.txt").is_file():
        return root / "corpora" / "gutenberg" / "carroll-alice.txt"
    return zipped if zipped.is_file() and not (root / "corpora" / package).is_dir() else root / "corpora" / package


def _ag_news() -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
    """AG_NEWS test split: texts 'title description' (as torchtext and the hub join them) and labels 0..3."""
    r = resolve.require("ag_news")
    return _ag_news_at(r.kind, r.path, paths.stamp(r.path / "ag_news" / "test.csv") if r.kind != "hf" else ())


@functools.lru_cache(maxsize=None)
def _ag_news_at(kind: str, where: Path, stamp: tuple = ()) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
    if kind == "hf":
        h = sources.get("ag_news").hub
        ds = hub.load_split(h, h.split("test"), where)
        return tuple(_squash(t) for t in ds[h.text[0]]), tuple(int(y) for y in ds[h.label])
    texts, labels = [], []
    p = where / "ag_news" / "test.csv"
    with io.StringIO(_utf8(p), newline="") as f:
        rows = csv.reader(f, strict=True)
        try:
            header = next(rows, None)
            if header != ["label", "title", "description"]:
                raise _damaged(p, 1, f"header {header}, expected label,title,description")
            for row in rows:
                if len(row) != 3 or row[0] not in ("1", "2", "3", "4"):
                    raise _damaged(p, rows.line_num, f"{len(row)} field(s) {row[:3]} where a label 1-4, a title and "
                                                     "a description belong")
                texts.append(_squash(f"{row[1]} {row[2]}"))
                labels.append(int(row[0]) - 1)
        except csv.Error as e:  # an unclosed quote at the end, a stray NUL: cut off or damaged
            raise _damaged(p, rows.line_num, f"not CSV ({e})") from None
    return tuple(texts), tuple(labels)


def _utf8(path: Path) -> str:
    """The text of a mirror file, or the damage error at the line of its first byte that is not UTF-8."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise _damaged(path, data.count(b"\n", 0, e.start) + 1, f"byte {data[e.start]:#04x} is not UTF-8") from None


def _damaged(path: Path, line: int, what: str) -> MissingData:
    """The error for a mirror file that is truncated or damaged (one line: the file, the place, the fix)."""
    fix = (f"copy {path.parent.name}/{path.name} into the mirror again, or unset {paths.DATA_ENV} to read another "
           "source (`attnlip data list` shows them)")
    return paths.damaged(path, f"line {line}: {what}", path.parent.name, fix=fix)


def _sst2(split: str) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
    """GLUE SST-2 'train' or 'dev': (sentences, labels 0/1)."""
    if split not in ("train", "dev"):
        raise ValueError(f"SST-2 split must be 'train' or 'dev' (the test split has no labels), got {split!r}")
    r = resolve.require("sst2")
    return _sst2_at(r.kind, r.path, split, paths.stamp(r.path / "sst2" / f"{split}.tsv") if r.kind != "hf" else ())


@functools.lru_cache(maxsize=None)
def _sst2_at(kind: str, where: Path, split: str, stamp: tuple = ()) -> Tuple[Tuple[str, ...], Tuple[int, ...]]:
    if kind == "hf":
        h = sources.get("sst2").hub
        ds = hub.load_split(h, h.split(split), where)
        return tuple(t.strip() for t in ds[h.text[0]]), tuple(int(y) for y in ds[h.label])
    p = where / "sst2" / f"{split}.tsv"  # train's header is label/sentence, dev's label/content
    texts, labels = [], []
    raw = _utf8(p)
    if raw and not raw.endswith("\n"):  # GLUE's TSVs end every row with a newline: this one was cut mid-row
        raise _damaged(p, raw.count("\n") + 1, "the last row has no newline at its end (the file is cut off)")
    f = io.StringIO(raw, newline=None)
    header = f.readline().rstrip("\r\n").split("\t")
    if len(header) != 2 or header[0] != "label":
        raise _damaged(p, 1, f"header {header}, expected label<TAB>sentence (train) or label<TAB>content (dev)")
    for i, line in enumerate(f, 2):
        line = line.rstrip("\r\n")
        if not line:
            continue
        lab, tab, text = line.partition("\t")
        if not tab or lab not in ("0", "1") or not text.strip():
            raise _damaged(p, i, f"{line[:60]!r} where a label 0/1, a tab and a sentence belong")
        texts.append(text.strip())
        labels.append(int(lab))
    return tuple(texts), tuple(labels)


def data_source(name: str) -> Optional[str]:
    """Where load_corpus(name) would read from, without loading (resolve.source); None for 'synthetic'."""
    return resolve.source(name) if name in sources.DATASETS else None


def synthetic_corpus(n_texts: int = 200, seed: int = 0) -> List[str]:
    """Deterministic English-like sentences for tests and test-scale runs (no corpus needed)."""
    words = ("the a cat dog queen rabbit garden tea party said went into very curious little large time "
             "down hole door key table bottle drink cake eat grew small tall alice thought herself").split()
    rng = random.Random(seed)
    out = []
    for _ in range(n_texts):
        k = rng.randint(5, 20)
        out.append(" ".join(rng.choice(words) for _ in range(k)).capitalize() + ".")
    return out


def load_corpus(name: str, split: Optional[str] = None) -> List[str]:
    """Texts of a corpus: 'alice' | 'ag_news' (test) | 'sst2' (split 'train' default or 'dev') | 'brown' | 'synthetic'."""
    if name == "alice":
        return list(_alice())
    if name == "ag_news":
        return list(_ag_news()[0])
    if name == "sst2":
        return list(_sst2(split or "train")[0])
    if name == "brown":
        return list(_brown())
    if name == "synthetic":
        return synthetic_corpus()
    raise ValueError(f"unknown corpus {name!r}; choose one of {CORPORA}")


def load_labeled(name: str, split: Optional[str] = None) -> Tuple[List[str], List[int]]:
    """(texts, labels) for a labeled corpus: 'sst2' (labels 0/1) or 'ag_news' (labels 0..3)."""
    if name == "sst2":
        t, y = _sst2(split or "train")
    elif name == "ag_news":
        t, y = _ag_news()
    else:
        raise ValueError(f"corpus {name!r} has no labels; use 'sst2' or 'ag_news'")
    return list(t), list(y)


def _tok_key(tokenizer) -> str:
    return f"{type(tokenizer).__name__}:{getattr(tokenizer, 'name_or_path', '')}:{len(tokenizer)}"


_TOKEN_CACHE: dict = {}


def token_stream(tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """The texts joined by spaces, tokenized without special tokens: LongTensor (T,). Cached in memory."""
    if len(texts) == 0:
        raise ValueError("token_stream needs at least one text")
    h = hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()
    key = (_tok_key(tokenizer), h)
    if key not in _TOKEN_CACHE:
        # texts after the first get a leading space, so boundaries tokenize like ordinary word boundaries
        # (matters for byte-level BPE); a batch call is much faster than one huge string
        batch = [texts[0]] + [" " + t for t in texts[1:]]
        enc = tokenizer(batch, add_special_tokens=False, verbose=False)["input_ids"]
        _TOKEN_CACHE[key] = torch.tensor([t for ids in enc for t in ids], dtype=torch.long)
    return _TOKEN_CACHE[key]


def special_affixes(tokenizer) -> Tuple[List[int], List[int]]:
    """The special tokens a tokenizer puts before and after one sequence, e.g. ([CLS], [SEP]) or ([], [])."""
    probe = "hello"
    content = tokenizer(probe, add_special_tokens=False)["input_ids"]
    full = tokenizer(probe, add_special_tokens=True)["input_ids"]
    for i in range(len(full) - len(content) + 1):
        if full[i:i + len(content)] == content:
            return list(full[:i]), list(full[i + len(content):])
    raise ValueError(f"cannot locate the content tokens inside the special-token template of {type(tokenizer).__name__}")


def token_chunks(tokenizer, texts: Sequence[str], n: int, count: int, seed: int = 0,
                 add_special_tokens: bool = False) -> torch.Tensor:
    """`count` non-overlapping length-n windows of the concatenated token stream: LongTensor (count, n).

    Windows start at multiples of the content length (n, or n minus the tokenizer's special tokens when
    add_special_tokens, e.g. [CLS] ... [SEP] for BERT); a seeded random choice of distinct windows.
    """
    if n < 1 or count < 1:
        raise ValueError(f"token_chunks needs n >= 1 and count >= 1, got n={n}, count={count}")
    prefix, suffix = special_affixes(tokenizer) if add_special_tokens else ([], [])
    n_special = len(prefix) + len(suffix)
    m = n - n_special
    if m < 1:
        raise ValueError(f"n = {n} leaves no room for content after {n_special} special tokens")
    stream = token_stream(tokenizer, texts)  # (T,)
    avail = stream.numel() // m
    if count > avail:
        raise ValueError(f"corpus has {stream.numel()} tokens = {avail} non-overlapping chunks of {m}, "
                         f"fewer than count = {count}")
    g = torch.Generator().manual_seed(seed)
    starts = torch.randperm(avail, generator=g)[:count].sort().values * m  # (count,)
    chunks = stream[starts[:, None] + torch.arange(m)]  # (count, m)
    if n_special:
        pre = torch.tensor(prefix, dtype=torch.long).expand(count, -1)
        suf = torch.tensor(suffix, dtype=torch.long).expand(count, -1)
        chunks = torch.cat([pre, chunks, suf], dim=1)  # (count, n)
    return chunks


def load_sst2(split: str = "train", max_len: int = 32, tokenizer=None, limit: Optional[int] = None,
              return_mask: bool = False):
    """SST-2 for classification: ids LongTensor (N, max_len) ([CLS] ... [SEP] padded/truncated), labels (N,).

    tokenizer: a Hugging Face tokenizer, passed in (e.g. harness.models.text.bert_tokenizer(), BERT uncased
    WordPiece); this layer never loads one. With return_mask, also the (N, max_len) mask.
    """
    if max_len < 2:
        raise ValueError(f"max_len must be >= 2, got {max_len}")
    if tokenizer is None:
        raise ValueError("load_sst2 needs a tokenizer (e.g. harness.models.text.bert_tokenizer())")
    texts, labels = _sst2(split)
    if limit is not None:
        texts, labels = texts[:limit], labels[:limit]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    enc = tokenizer(list(texts), add_special_tokens=True, truncation=True, max_length=max_len, verbose=False)
    ids = torch.full((len(texts), max_len), pad_id, dtype=torch.long)
    mask = torch.zeros(len(texts), max_len, dtype=torch.long)
    for i, row in enumerate(enc["input_ids"]):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    y = torch.tensor(labels, dtype=torch.long)
    return (ids, y, mask) if return_mask else (ids, y)


def synthetic_labeled_ids(split: str, n: int, limit: Optional[int] = None, vocab: int = 200):
    """A learnable stand-in for SST-2 in tests: random ids in [5, vocab) with the label written as token 1 + y at
    position 1. Returns ids (N, n), labels (N,) in {0, 1}, vocab; N = limit or 256; seeded by split."""
    if split not in ("train", "test", "dev"):
        raise ValueError(f"split must be 'train', 'dev' or 'test', got {split!r}")
    if n < 2:
        raise ValueError(f"n must be >= 2, got {n}")
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    N = limit or 256
    ids = torch.randint(5, vocab, (N, n), generator=g)
    y = torch.randint(0, 2, (N,), generator=g)
    ids[:, 1] = 1 + y  # the label token
    return ids, y, vocab
