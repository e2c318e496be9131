"""Experiment registry (timm's register_model pattern): experiments register at import under their name.

An experiment is a class deriving from `Experiment` and decorated with `@experiment`:

    @experiment
    class CastinSqrtN(Experiment):
        name = "castin_sqrt_n"
        figures_ref = ["Castin et al. 2024, Fig. 1"]
        VERSION = "1"                       # optional: pins the code hash for cosmetic edits
        grid = {"model": ["minilm"], "n": list(range(2, 101, 2))}   # full scale (product of the lists)
        quick = {"n": [2, 10, 50]}          # overrides of `grid` for --quick
        test = {"n": [2, 4]}                # overrides for the smoke test (seconds)
        paired = []                         # optional: tuples of keys that vary together (zip, not product)
        def run(self, cell: dict, ctx: "Context") -> list[dict]: ...     # tidy rows for one grid cell
        def figures(self, table: "pd.DataFrame", outdir: Path) -> list[Path]: ...  # from the table only
        def summary(self, table) -> str: ...  # markdown: key numbers + what differs from the paper

`cell` holds the grid parameters (JSON-serializable scalars); `ctx` gives device, dtype, seed, scale, a
progress-bar factory and an artifact store for things several experiments reuse (trained models).
"""
from __future__ import annotations

import fnmatch
import importlib
import pkgutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

_REGISTRY: Dict[str, "Experiment"] = {}
_LOADED = False


@dataclass
class Context:
    """What a cell's run() may use besides its parameters. Pass parameters, not tensors, between processes."""

    device: str = "cpu"
    dtype: str = "float64"
    seed: int = 0
    scale: str = "full"  # "full" | "quick" | "test"
    cache_dir: Path = field(default_factory=lambda: Path("results/cache"))
    progress: bool = True

    @property
    def torch_dtype(self):
        import torch

        return getattr(torch, self.dtype)

    @property
    def torch_device(self):
        import torch

        return torch.device(self.device)

    def pbar(self, iterable=None, **kw):
        """A tqdm progress bar inside a long cell (disabled when progress is off)."""
        from tqdm.auto import tqdm

        return tqdm(iterable, disable=not self.progress, leave=False, dynamic_ncols=True, **kw)

    @property
    def artifacts(self) -> Path:
        """Directory for cached artifacts shared across cells/experiments (e.g. trained model weights)."""
        p = Path(self.cache_dir) / "artifacts"
        p.mkdir(parents=True, exist_ok=True)
        return p


class Experiment:
    """Base class; see the module docstring for the fields a subclass declares."""

    name: str = ""
    figures_ref: List[str] = []
    VERSION: Optional[str] = None
    grid: Dict[str, List[Any]] = {}
    quick: Dict[str, List[Any]] = {}
    test: Dict[str, List[Any]] = {}
    paired: List[tuple] = []
    description: str = ""

    def grid_for(self, scale: str) -> Dict[str, List[Any]]:
        """The parameter grid at a scale: full `grid`, overridden by `quick` or `test` (test falls back to quick)."""
        if scale not in ("full", "quick", "test"):
            raise ValueError(f"unknown scale {scale!r}: use 'full', 'quick' or 'test'")
        g = dict(self.grid)
        if scale in ("quick", "test"):
            g.update(self.quick)
        if scale == "test":
            g.update(self.test)
        return g

    def run(self, cell: Dict[str, Any], ctx: Context) -> List[Dict[str, Any]]:
        raise NotImplementedError

    def figures(self, table, outdir: Path) -> List[Path]:
        return []

    def summary(self, table) -> str:
        return ""

    @property
    def module(self):
        return importlib.import_module(type(self).__module__)


def experiment(cls=None, **overrides):
    """Class decorator registering an Experiment subclass (instantiated once) under `cls.name`."""

    def register(c):
        for k, v in overrides.items():
            setattr(c, k, v)
        inst = c()
        if not inst.name:
            raise ValueError(f"experiment class {c.__name__} has no name")
        prev = _REGISTRY.get(inst.name)
        if prev is not None and type(prev).__qualname__ != c.__qualname__:
            raise ValueError(f"experiment name {inst.name!r} registered twice ({type(prev).__name__}, {c.__name__})")
        _REGISTRY[inst.name] = inst
        return c

    return register(cls) if cls is not None else register


def load_all() -> None:
    """Import every module of the `experiments` package so their experiments register."""
    global _LOADED
    if _LOADED:
        return
    import experiments

    for m in sorted(pkgutil.iter_modules(experiments.__path__), key=lambda m: m.name):
        if not m.name.startswith("_"):
            importlib.import_module(f"experiments.{m.name}")
    _LOADED = True


def list_experiments(pattern: str = "*") -> List[str]:
    """Names of registered experiments matching a glob pattern, sorted."""
    load_all()
    return sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pattern))


def get_experiment(name: str) -> Experiment:
    """The registered experiment `name`; a clear error listing close names otherwise."""
    load_all()
    if name not in _REGISTRY:
        import difflib

        close = difflib.get_close_matches(name, _REGISTRY.keys(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown experiment {name!r}.{hint} Known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
