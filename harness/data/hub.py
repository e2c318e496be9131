"""Hugging Face hub datasets through `datasets`: find a prepared copy in its cache, read a split from it without
network, and download a dataset into that cache.

The cache folder is `datasets`' own: $HF_DATASETS_CACHE, else $HF_HOME/datasets, else
~/.cache/huggingface/datasets (read when called, so a changed environment takes effect). A prepared dataset lives
in <cache>/<namespace>___<name>/<config>/<version>/<revision>/ with one Arrow file per split (or per shard); reading
memory-maps those files (Arrow data only: nothing in them can run code).
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Optional

from harness.data.sources import Hub
from harness.errors import DataNotFound

TRUE = ("1", "true", "yes", "on")


def flag(name: str) -> bool:
    """True when the environment variable is set to 1 / true / yes / on (as huggingface_hub reads them)."""
    return os.environ.get(name, "").strip().lower() in TRUE


CHECKED = "ATTNLIP_OFFLINE_CHECKED"  # harness.network.CHECKED: the start-up probe set the offline variables


def offline_reason() -> Optional[str]:
    """Why hub downloads are off, or None: "no network reached (WHY; checked at start)" when the command's own
    network probe set the offline variables, else the variable the user set ("HF_HUB_OFFLINE=1")."""
    for v in ("ATTNLIP_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if flag(v):
            checked = os.environ.get(CHECKED)
            return f"no network reached ({checked}; checked at start)" if checked else f"{v}={os.environ[v]}"
    return None


def cache_dir() -> Path:
    """The `datasets` cache folder as the environment names it now."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "datasets"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "huggingface" / "datasets"


def _short_name(h: Hub) -> str:
    """The repository name as `datasets` names its cache folder (datasets.naming.camelcase_to_snakecase)."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", h.repo.split("/")[-1])
    return re.sub(r"([a-z\d])([A-Z])", r"\1_\2", name).lower()


def cached(h: Hub) -> Optional[Path]:
    """The newest prepared copy of the dataset (its revision folder) in the cache, or None."""
    ns, _, _ = h.repo.rpartition("/")
    base = cache_dir() / (f"{ns}___{_short_name(h)}" if ns else _short_name(h))
    hits = [p.parent for p in base.glob(f"{h.config or '*'}/*/*/dataset_info.json")]
    return max(hits, key=lambda p: p.stat().st_mtime) if hits else None


def source(h: Hub, where: Optional[Path]) -> str:
    """"hf:<repo>[/<config>]@<revision>" of a prepared copy (first 12 characters of the revision folder's name),
    or "hf:<repo>[/<config>]" for one still to download."""
    label = f"hf:{h.repo}" + (f"/{h.config}" if h.config else "")
    return f"{label}@{where.name[:12]}" if where is not None else label


def load_split(h: Hub, split: str, where: Path):
    """One split (hub name) of a prepared copy as a datasets.Dataset, read from its Arrow files."""
    import datasets

    name = _short_name(h)
    files = sorted(where.glob(f"{name}-{split}.arrow")) or sorted(where.glob(f"{name}-{split}-*-of-*.arrow"))
    if not files:
        have = sorted({f.name[len(name) + 1:].split(".")[0].split("-0")[0] for f in where.glob("*.arrow")})
        raise DataNotFound(f"{h.repo}: split {split!r} is not in the cached copy {where} (splits there: "
                           f"{', '.join(have) or 'none'}); fetch it again with `attnlip data fetch`",
                           fix="attnlip data fetch")
    parts = [datasets.Dataset.from_file(str(f)) for f in files]
    return parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)


def download(h: Hub) -> None:
    """Download and prepare every split of the dataset into the cache (datasets shows its progress bars)."""
    import datasets

    datasets.load_dataset(h.repo, h.config, cache_dir=str(cache_dir()))
