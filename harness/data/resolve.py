"""Which source a dataset comes from, without loading it, and obtaining it when allowed.

    source(name) -> str          "mirror:sst2", "nltk:gutenberg", "debian:dataset-fashion-mnist",
                                 "hf:stanfordnlp/sst2@<revision>", "hf:<repo>" (to download), "missing:<name>";
                                 for cell keys and manifests
    locate(name) -> Resolved     the same, with the folder it points at
    missing_error(name)          the DataNotFound require would raise (None when a source or a download may have it)
    require(name) -> Resolved    locate, downloading first when nothing local has it and the network is allowed;
                                 else one DataNotFound naming `attnlip data fetch <name>` and the mirror layout
    fetch(name) -> (ok, message) download into the library's own cache (NLTK's data folder, the `datasets` cache)

Order: the mirror ($ATTNLIP_DATA) when set and holding the dataset's files; a folder named by the dataset's own
variable (ATTNLIP_FASHION_MNIST, ATTNLIP_CIFAR10, ATTNLIP_CIFAR100); NLTK's data path; Debian's package; the
`datasets` cache; a download. Downloads are off when ATTNLIP_OFFLINE is set (NLTK and hub) or HF_HUB_OFFLINE /
HF_DATASETS_OFFLINE (hub).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import List, NamedTuple, Optional, Tuple

from harness.data import hub, paths, sources
from harness.errors import DataNotFound


class Resolved(NamedTuple):
    kind: str              # mirror | local | nltk | debian | hf | download | missing
    path: Optional[Path]   # mirror root, NLTK data root, image folder or cached hub copy
    source: str


# ---- NLTK --------------------------------------------------------------------------------------------------------
def nltk_paths() -> List[Path]:
    """NLTK's data path as the environment names it now: $NLTK_DATA's folders, then nltk.data.path."""
    out: List[Path] = [Path(p) for p in os.environ.get(paths.NLTK_ENV, "").split(os.pathsep) if p]
    try:
        import nltk

        out += [Path(p) for p in nltk.data.path if isinstance(p, str)]
    except ImportError:  # pragma: no cover - nltk is a dependency
        pass
    seen, uniq = set(), []
    for p in out:
        if str(p) not in seen:
            seen.add(str(p))
            uniq.append(p)
    return uniq


def nltk_has(root: Path, resource: str) -> bool:
    """root holds the resource, unpacked or as NLTK's zip (corpora/<package>.zip)."""
    package_zip = Path(*resource.split("/")[:2]).with_suffix(".zip")
    return (root / resource).exists() or (root / package_zip).is_file()


def nltk_root(d: sources.Dataset) -> Optional[Path]:
    return next((p for p in nltk_paths() if p.is_dir() and nltk_has(p, d.nltk_resource)), None)


def nltk_download_dir() -> Path:
    """Where fetch puts NLTK packages: the first folder of $NLTK_DATA, else NLTK's default (~/nltk_data, ...)."""
    env = [p for p in os.environ.get(paths.NLTK_ENV, "").split(os.pathsep) if p]
    if env:
        return Path(env[0])
    from nltk.downloader import Downloader

    return Path(Downloader().default_download_dir())


def nltk_reader(root: Path, package: str, reader_cls, *args, **kwargs):
    """An NLTK corpus reader over <root>/corpora/<package> (folder or zip). root goes first on nltk.data.path:
    NLTK refuses readers outside it."""
    import nltk

    if str(root) not in nltk.data.path:
        nltk.data.path.insert(0, str(root))
    try:
        ptr = nltk.data.find(f"corpora/{package}", paths=[str(root)])
    except LookupError:
        ptr = nltk.data.find(f"corpora/{package}.zip/{package}/", paths=[str(root)])
    return reader_cls(ptr, *args, **kwargs)


# ---- resolution --------------------------------------------------------------------------------------------------
def _debian_dir() -> Optional[Path]:
    for p in (paths.LOCAL_FASHION_MNIST, paths.DEFAULT_FASHION_MNIST):
        if (p / "t10k-images-idx3-ubyte.gz").is_file():
            return p
    return None


def locate(name: str) -> Resolved:
    """The source `require(name)` would use, without downloading or loading anything."""
    d = sources.get(name)
    m = paths.mirror_root()
    if m is not None and d.mirror and all((m / f).exists() for f in d.mirror):
        return Resolved("mirror", m, f"mirror:{name}")
    if d.env and os.environ.get(d.env):
        return Resolved("local", Path(os.environ[d.env]).expanduser(), f"local:{d.env}")
    if d.nltk:
        root = nltk_root(d)
        if root is not None:
            return Resolved("nltk", root, f"nltk:{d.nltk}")
    if d.debian:
        deb = _debian_dir()
        if deb is not None:
            return Resolved("debian", deb, f"debian:{d.debian}")
    if d.hub:
        got = hub.cached(d.hub)
        if got is not None:
            return Resolved("hf", got, hub.source(d.hub, got))
    if d.nltk and not hub.flag("ATTNLIP_OFFLINE"):
        return Resolved("download", None, f"nltk:{d.nltk}")
    if d.hub and hub.offline_reason() is None:
        return Resolved("download", None, hub.source(d.hub, None))
    return Resolved("missing", None, f"missing:{name}")


def source(name: str) -> str:
    """The source string of locate(name); "missing:<name>" when the mirror setting itself is broken."""
    try:
        return locate(name).source
    except DataNotFound:
        return f"missing:{name}"


def not_found(name: str, why: str) -> DataNotFound:
    """The one error for an unavailable dataset: why, the download command, the sources, the dataset's own folder
    variable (ATTNLIP_CIFAR100, ...) and the mirror files."""
    d = sources.get(name)
    mirror = (f"or set ATTNLIP_DATA to a mirror holding {', '.join(d.mirror)} (`attnlip data list` prints the "
              f"whole layout)") if d.mirror else "(no mirror layout: it comes from its source only)"
    local = f"set {d.env} to a folder holding its files, " if d.env else ""
    return DataNotFound(f"dataset {name!r} is not available: {why}. Download it with `attnlip data fetch {name}` "
                        f"(from {', '.join(d.sources)}) on a machine with network, {local}{mirror}",
                        fix=f"attnlip data fetch {name}")


def missing_error(name: str) -> Optional[DataNotFound]:
    """The DataNotFound that require(name) would raise now when nothing local has the dataset and no download is
    allowed; None when a local source has it or a download may get it. Loads and downloads nothing."""
    try:
        if locate(name).kind != "missing":
            return None
    except DataNotFound as e:  # a broken mirror setting: its own message and fix
        return e
    return not_found(name, _why_missing(sources.get(name)))


def _why_missing(d: sources.Dataset) -> str:
    bits = []
    if d.nltk:
        bits.append(f"no {d.nltk_resource} on NLTK's data path ({', '.join(map(str, nltk_paths())) or 'empty'})")
    if d.hub:
        bits.append(f"no cached {d.hub.repo} in {hub.cache_dir()}")
    off = hub.offline_reason()
    if off:
        bits.append(f"downloads are off ({off})")
    return "; ".join(bits) or "no source found"


def fetch(name: str) -> Tuple[bool, str]:
    """Download a dataset into its library's cache unless something local already has it: (ok, what happened)."""
    d = sources.get(name)
    r = locate(name)
    if r.kind not in ("download", "missing"):
        return True, f"{name}: already available ({r.source})"
    errors = []
    if d.nltk:
        if hub.flag("ATTNLIP_OFFLINE"):
            errors.append(f"NLTK download off ({hub.offline_reason()})")
        else:
            import nltk

            dest = nltk_download_dir()
            dest.mkdir(parents=True, exist_ok=True)
            if nltk.download(d.nltk, download_dir=str(dest), quiet=True) and nltk_has(dest, d.nltk_resource):
                return True, f"{name}: downloaded nltk:{d.nltk} into {dest}"
            errors.append(f"nltk.download({d.nltk!r}) into {dest} failed (no network?)")
    if d.hub:
        off = hub.offline_reason()
        if off:
            errors.append(f"hub download off ({off})")
        else:
            try:
                hub.download(d.hub)
            except Exception as e:  # noqa: BLE001 - reported with its cause
                errors.append(f"datasets.load_dataset({d.hub.repo!r}) failed: {e.__class__.__name__}: "
                              f"{str(e).strip().splitlines()[0] if str(e).strip() else ''}")
            else:
                got = hub.cached(d.hub)
                if got is not None:
                    return True, f"{name}: downloaded {hub.source(d.hub, got)} into {hub.cache_dir()}"
                errors.append(f"{d.hub.repo} downloaded but no prepared copy in {hub.cache_dir()}")
    return False, f"{name}: " + "; ".join(errors or [_why_missing(d)])


def require(name: str, download: bool = True) -> Resolved:
    """locate(name), downloading first when that is the only way (and `download`); else not_found(...)."""
    r = locate(name)
    if r.kind == "download" and download:
        ok, msg = fetch(name)
        r = locate(name) if ok else r
        if r.kind in ("download", "missing"):
            raise not_found(name, msg.split(": ", 1)[-1])
    if r.kind in ("download", "missing"):
        raise not_found(name, _why_missing(sources.get(name)))
    return r
