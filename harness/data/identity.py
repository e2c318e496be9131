"""What a dataset's local copy holds, as a content hash: the identity of the data a cell reads, for its key.

    files(name) -> [Path]               the files the loaders read from the source harness.data.resolve picks
    digest(name, memo_dir) -> str|None  sha256 over those files' names and contents; None when the source names its
                                        own version (a hub revision) or nothing local has the dataset

A source's name ("mirror:alice") says where the data is, not what it is: an edited, shuffled or replaced file keeps
the name. Hashing the files does, and each file's hash is kept in `<memo_dir>/file_digests.json` (and in memory)
under its path, size, mtime, ctime and inode, so planning rehashes only files that changed on disk. This module only
names inputs for cell keys (harness.boundary lists it as infrastructure); it changes no number.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from harness.data import resolve, sources
from harness.errors import DataNotFound
from harness.store.atomic import atomic_write_text, canonical_json, sha256

MEMO_FILE = "file_digests.json"
_MEMO: Dict[str, Tuple[list, str]] = {}  # path -> (stamp, sha256), this process's share of the memo


def _nltk_files(root: Path, d: sources.Dataset) -> List[Path]:
    """What NLTK's reader opens under `root`: the resource's file or folder, else its package zip."""
    res = root / d.nltk_resource
    if res.is_file():
        return [res]
    if res.is_dir():
        return _tree(res)
    zipped = root / Path(*d.nltk_resource.split("/")[:2]).with_suffix(".zip")
    return [zipped] if zipped.is_file() else []


def _tree(folder: Path) -> List[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith("."))


def files(name: str) -> List[Path]:
    """The files a loader reads for dataset `name` from the source resolve.locate(name) picks: the NLTK resource
    (mirror or NLTK's data path), the dataset's own mirror folders (sst2/, ag_news/, fashion-mnist/, ...), the
    folder of its variable or Debian's package; none for a hub copy (its revision is in the source) or a dataset
    nothing local has."""
    d = sources.get(name)
    try:
        r = resolve.locate(name)
    except DataNotFound:  # a broken mirror setting: the cell reports it (harness.run.preflight)
        return []
    if r.kind == "mirror":
        if d.nltk:
            return _nltk_files(r.path / "nltk_data", d)
        folders = sorted({(r.path / f).parent for f in d.mirror})
        return [p for folder in folders for p in _tree(folder)]
    if r.kind == "nltk":
        return _nltk_files(r.path, d)
    if r.kind in ("local", "debian") and r.path is not None and r.path.is_dir():
        return _tree(r.path)
    return []


def _stamp(path: Path) -> list:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 24), b""):
            h.update(block)
    return h.hexdigest()


def _known(got, stamp: list) -> Optional[str]:
    """The digest of a memo entry [stamp, sha256] made for this stamp, else None."""
    if isinstance(got, (list, tuple)) and len(got) == 2 and list(got[0]) == stamp and isinstance(got[1], str):
        return got[1]
    return None


def file_digests(paths: List[Path], memo_dir: Optional[Path] = None) -> List[str]:
    """sha256 of each file's bytes, reused from this process's memo or `<memo_dir>/file_digests.json` while the
    file's stamp (size, mtime, ctime, inode) is unchanged; the memo file is read and rewritten only on a miss."""
    out: List[str] = []
    memo: Optional[Dict[str, list]] = None
    for p in paths:
        key, stamp = str(p.resolve()), _stamp(p)
        got = _known(_MEMO.get(key), stamp)
        if got is None:
            memo = _read_memo(memo_dir) if memo is None else memo
            got = _known(memo.get(key), stamp) or _sha256_file(p)
            memo[key] = [stamp, got]
        _MEMO[key] = (stamp, got)
        out.append(got)
    if memo is not None and memo_dir is not None:  # a read-only or full cache only costs rehashing next time
        with contextlib.suppress(OSError):
            atomic_write_text(Path(memo_dir) / MEMO_FILE, canonical_json(memo))
    return out


def _read_memo(memo_dir: Optional[Path]) -> Dict[str, list]:
    if memo_dir is None:
        return {}
    with contextlib.suppress(OSError, ValueError):
        got = json.loads((Path(memo_dir) / MEMO_FILE).read_text())
        if isinstance(got, dict):
            return got
    return {}


def digest(name: str, memo_dir: Optional[Path] = None) -> Optional[str]:
    """sha256 of the dataset's local files (their names relative to their common folder, and their contents), or
    None when there are none to hash (hub copies, absent datasets)."""
    return files_digest(files(name), memo_dir)


def folder_digest(folder: Optional[Path], memo_dir: Optional[Path] = None) -> Optional[str]:
    """sha256 of the files under `folder` (a tokenizer's folder, ...), as digest does for a dataset's."""
    return files_digest(_tree(Path(folder)) if folder is not None and Path(folder).is_dir() else [], memo_dir)


def files_digest(paths: List[Path], memo_dir: Optional[Path] = None) -> Optional[str]:
    if not paths:
        return None
    base = Path(os.path.commonpath([str(p.parent) for p in paths]))
    try:
        sums = file_digests(paths, memo_dir)
    except OSError as e:  # the cell fails reading it, with the cause; its key matches no cell computed from data
        return f"unreadable:{e.__class__.__name__}"
    return sha256(canonical_json([[str(p.relative_to(base)), s] for p, s in zip(paths, sums)]))


def digests(names: List[str], memo_dir: Optional[Path] = None) -> Optional[Dict[str, str]]:
    """name -> digest of every dataset among `names` (harness.data.sources names) that has local files; None when
    none has."""
    out = {}
    for n in names:
        if n in sources.DATASETS:
            got = digest(n, memo_dir)
            if got is not None:
                out[n] = got
    return out or None
