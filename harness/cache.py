"""Transition shim: the cache is the `harness.store` package (atomic, codehash, keys, cells, claims, artifacts)."""
from .store.artifacts import artifact_path, cached_artifact, default_cache_dir, load_artifact, save_artifact  # noqa: F401
from .store.atomic import TMP_MARK, atomic_write_bytes, atomic_write_text, canonical_json, sha256  # noqa: F401
from .store.cells import CellCache, CorruptCell, load_cell  # noqa: F401
from .store.codehash import REPO_ROOT  # noqa: F401
