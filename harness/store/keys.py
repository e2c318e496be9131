"""Cell keys: sha256 of the canonical JSON of everything a cell's rows depend on."""
from __future__ import annotations

import functools
from importlib import metadata
from typing import Any, Dict, Mapping, Optional

from ..config import device_kind
from .atomic import canonical_json, sha256
from .cells import FORMAT

NUMERIC_LIBRARIES = ("torch", "transformers", "numpy", "scipy")  # their versions change numbers


@functools.lru_cache(maxsize=1)
def library_versions() -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {}
    for pkg in NUMERIC_LIBRARIES:
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            out[pkg] = None
    return out


def cell_key(experiment: str, cell: Mapping[str, Any], seed: int, dtype: str, device: str, code: str,
             scale: Optional[str] = None, model_source: Optional[str] = None,
             versions: Optional[Mapping[str, Optional[str]]] = None, plugins: Optional[list] = None,
             data_source: Optional[str] = None, data_identity: Optional[Mapping[str, str]] = None) -> str:
    """Key of one cell. `scale` only when the compute code reads ctx.scale (otherwise every scale-dependent
    parameter is a cell parameter, and equal cells of two scales share one computation). `model_source` and
    `data_source` name the weights and the data the cell reads (a hub revision, the mirror, ...); `data_identity`
    says what that data is: dataset -> sha256 of its local files (harness.data.identity), so an edited file gives
    a new key where its source's name stays the same."""
    body = {
        "experiment": experiment, "cell": dict(cell), "seed": int(seed), "dtype": str(dtype),
        "device": device_kind(device), "code": code, "format": FORMAT,
        "versions": dict(versions if versions is not None else library_versions()),
    }
    if scale is not None:
        body["scale"] = str(scale)
    if model_source is not None:
        body["model_source"] = str(model_source)
    if data_source is not None:
        body["data_source"] = str(data_source)
    if data_identity:
        body["data_identity"] = {str(k): str(v) for k, v in data_identity.items()}
    if plugins:
        body["plugins"] = list(plugins)
    return sha256(canonical_json(body))
