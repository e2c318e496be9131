"""Models and tokenizers from the Hugging Face hub by their usual names, through huggingface_hub's own cache.

    offline() -> bool
        The user's environment forbids downloads (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE, as huggingface_hub
        reads them into huggingface_hub.constants).
    cached_snapshot(name, files=WEIGHT_FILES) -> folder or None
        The snapshot of `name` in the local cache (refs/main, else the only snapshot) holding one of `files`.
        Never touches the network.
    remote(name) -> Remote(name, sha, files, reason)
        What a download would fetch: the commit of the repository's main branch and its top-level files
        (huggingface_hub.model_info), or sha None with the reason (offline, unknown name, hub unreachable).
        Cached per process.
    download(rem, patterns) -> folder
        snapshot_download of the listed top-level files (safetensors weights, configs, tokenizer files) into the
        cache; the folder is the snapshot of that commit.

A model is labelled "<name>@<commit[:12]>" both when cached and when it would be downloaded, so a cell keyed
before the download finds its result again afterwards. Only safetensors weights are downloaded.
"""
from __future__ import annotations

import fnmatch
import functools
import os
from pathlib import Path
from typing import NamedTuple, Optional, Sequence, Tuple

from harness.data.hub import offline_reason
from harness.errors import DataNotFound

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model")
MODEL_PATTERNS = ("config.json", "preprocessor_config.json", "model.safetensors", "model-*.safetensors",
                  "model.safetensors.index.json", *TOKENIZER_FILES)
TOKENIZER_PATTERNS = ("config.json", *TOKENIZER_FILES)
CLI = "hf download"  # huggingface_hub's command line


class Remote(NamedTuple):
    name: str
    sha: Optional[str]  # commit a download would fetch, None when nothing can be downloaded
    files: Tuple[str, ...]  # top-level files of that commit
    reason: str  # why sha is None ("" otherwise)


def offline() -> bool:
    """True when HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE forbid downloads (huggingface_hub's reading of them)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return True
    return bool(constants.HF_HUB_OFFLINE)


def cache_dir() -> str:
    """The hub cache folder in use (HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants

    return str(constants.HF_HUB_CACHE)


def _repo_folder(name: str) -> Optional[Path]:
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    try:
        return Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=name, repo_type="model")
    except Exception:  # noqa: BLE001 - not a valid repo id: nothing cached under it
        return None


def cached_snapshot(name: str, files: Sequence[str] = WEIGHT_FILES) -> Optional[str]:
    """Snapshot folder of hub model `name` in the local cache that holds one of `files` (None if none)."""
    repo = _repo_folder(name)
    if repo is None or not (repo / "snapshots").is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        snaps = [repo / "snapshots" / ref.read_text().strip()]
    else:
        snaps = sorted((repo / "snapshots").iterdir())
    hits = [s for s in snaps if s.is_dir() and any((s / f).is_file() for f in files)]
    return str(hits[0]) if len(hits) == 1 else None


def has_tokenizer(folder: Optional[str]) -> bool:
    """True when `folder` holds tokenizer files AutoTokenizer can read."""
    return bool(folder) and any((Path(folder) / f).is_file() for f in TOKENIZER_FILES)


def remote(name: str) -> Remote:
    """The commit and files a download of `name` would fetch, or why nothing can be downloaded."""
    if offline():
        return Remote(name, None, (), f"downloads are off ({offline_reason() or 'HF_HUB_OFFLINE is set'})")
    return _remote(name)


@functools.lru_cache(maxsize=None)
def _remote(name: str) -> Remote:
    import huggingface_hub
    from huggingface_hub import errors

    try:
        info = huggingface_hub.model_info(name)
    except (errors.RepositoryNotFoundError, errors.HFValidationError) as e:
        return Remote(name, None, (), f"the hub has no model named {name!r} ({e.__class__.__name__})")
    except Exception as e:  # noqa: BLE001 - network errors of any kind: report, never raise from a lookup
        return Remote(name, None, (), f"the hub is unreachable ({e.__class__.__name__}: {str(e)[:200]})")
    files = tuple(s.rfilename for s in (info.siblings or ()) if "/" not in s.rfilename)
    return Remote(name, info.sha, files, "")


def wanted(rem: Remote, patterns: Sequence[str]) -> list:
    """The top-level files of `rem` matching `patterns`."""
    return [f for f in rem.files if any(fnmatch.fnmatch(f, p) for p in patterns)]


def download(rem: Remote, patterns: Sequence[str] = MODEL_PATTERNS) -> str:
    """Download the files of `rem` matching `patterns` into the hub cache; the snapshot folder."""
    import huggingface_hub

    files = wanted(rem, patterns)
    if not files:
        raise DataNotFound(f"hub model {rem.name!r} has none of the files {list(patterns)} "
                           f"(AttnLip downloads safetensors weights only)")
    try:
        return str(huggingface_hub.snapshot_download(rem.name, allow_patterns=files))
    except Exception as e:  # noqa: BLE001 - any download failure becomes one message with the fix
        raise DataNotFound(f"downloading {rem.name!r} from the Hugging Face hub failed "
                           f"({e.__class__.__name__}: {str(e)[:300]})", fix=f"{CLI} {rem.name}") from e


def not_found(what: str, name: str, rem: Remote, fetch: str = "") -> str:
    """One message for an absent model or tokenizer: where it was looked for and how to get it (`fetch`: the
    command that gets it, default `hf download NAME`)."""
    how = (f"run `{fetch or f'{CLI} {name}'}` (or any command here) with network access and HF_HUB_OFFLINE unset"
           if offline() else "check the name at https://huggingface.co/models")
    env = os.environ.get("HF_HOME") or os.environ.get("HF_HUB_CACHE")
    where = f"{cache_dir()}" + ("" if env else " (set HF_HOME or HF_HUB_CACHE to use another cache)")
    return f"{what} {name!r} is not in the Hugging Face cache {where} and {rem.reason}; {how}"
