"""The experiment catalog (timm's register_model pattern): experiments register at import under their name.

An experiment is a class deriving from `Experiment` and decorated with `@experiment`:

    @experiment
    class CastinSqrtN(Experiment):
        name = "castin_sqrt_n"
        figures_ref = ["Castin et al. 2024, Fig. 1"]
        grid = {"model": ["minilm"], "n": list(range(2, 101, 2))}   # full scale (product of the lists)
        quick = {"n": [2, 10, 50]}          # overrides of `grid` for --quick
        test = {"n": [2, 4]}                # overrides for the smoke test (seconds)
        paired = []                         # optional: tuples of keys that vary together (zip, not product)
        dtypes = ("float64", "float32")     # what run() honours; others are refused before computing
        def run(self, cell: dict, ctx: "Context") -> list[dict]: ...     # compute: tidy rows for one grid cell
        def figures(self, table: "pd.DataFrame", outdir: Path) -> list[Path]: ...  # present: from the table only
        def summary(self, table) -> str: ...  # present: markdown, key numbers + what differs from the paper

Every scale-dependent parameter belongs in grid/quick/test (the cell key covers cell parameters, the compute
code of run() and what it imports, dtype, device kind, seed, model source and library versions; see
harness/store/codehash.py). Presentation (figures, summary) is hashed separately: editing it re-renders
without recomputing. run() computes in ctx.torch_dtype on ctx.torch_device and never sets torch threads.

`cell` holds the grid parameters (JSON values); `ctx` gives device, dtype, seed, scale, threads, a progress-bar
factory and an artifact folder (harness.store.artifacts) for things several cells reuse (trained models).

Extensions (compatible): `grid` may also be a list of dicts (union of sub-grids, see harness.grid), and
`quick`/`test` then override the keys of every sub-grid holding them (a list replaces the grid outright).
`raise MissingData("...")` from run() when an optional input (shared data, weights) is absent: the smoke
test turns it into a skip and the runner reports the cell as skipped-missing-data (still a failure exit).
Discovery (importing every module of the `experiments` package, and the files or folders named by
$ATTNLIP_EXPERIMENTS_PATH, os.pathsep-separated) is harness.run.discovery, beside the runner: this module is the
registry the experiments import, and imports none of them.
"""
from __future__ import annotations

import fnmatch
import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Dict, List, Optional

_REGISTRY: Dict[str, "Experiment"] = {}

# The values a grid parameter can take, by name, for every experiment using that name (one name, one meaning); an
# experiment's `ranges` adds or overrides entries (a name whose range depends on the experiment, like a grid's
# resolution, is declared there only). "--set" values are typed and checked against these once, when the run is
# planned (harness.run.plan.typed_overrides), with the range, instead of failing inside a cell. ">=1": a whole count; ">0": a positive size or scale; for list
# parameters (eps values, l2 radii) the rule applies to each element.
PARAM_RANGES: Dict[str, str] = {
    **dict.fromkeys(("n", "count", "heads", "points", "samples", "test_size", "train_size", "vit_d", "vit_depth",
                     "vit_heads", "patch", "reps", "radius_count", "radius_n", "n_eval", "n_heat", "n_jac",
                     "full_map_max_n", "hist_bins", "lanczos_iters", "pgd_restarts", "a", "b"), ">=1"),
    **dict.fromkeys(("epochs", "pgd_steps", "train_steps", "k", "tokens", "n_aa", "train_seed", "lam", "eps",
                     "rel_sizes"), ">=0"),
    **dict.fromkeys(("lr", "temperature", "extent", "r_min", "r_max", "gr2_min", "gr2_max", "settle", "input_scale",
                     "x_scale", "radius_factor", "vo_norm", "l2", "linf_255"), ">0"),
}


def out_of_range(rule: str, value: Any) -> bool:
    """Whether a number (or any element of a list of numbers) breaks a PARAM_RANGES rule (">=1", ">0", ...)."""
    if isinstance(value, list):
        return any(out_of_range(rule, v) for v in value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False  # types are checked elsewhere
    op, bound = (rule[:2], float(rule[2:])) if rule[1] == "=" else (rule[:1], float(rule[1:]))
    ok = {">=": value >= bound, ">": value > bound, "<=": value <= bound, "<": value < bound}[op]
    return not ok or value != value or value in (float("inf"), float("-inf"))


from .context import Context  # noqa: E402,F401 - re-exported for experiments (compute code: harness/context.py)
from .errors import MissingData, UnsupportedContext  # noqa: E402,F401 - re-exported for experiments
from .settings import COMPUTE_DTYPES  # noqa: E402


class NoPaperScale(ValueError):
    """--scale paper for an experiment that declares no `paper` grid."""


@dataclass(frozen=True)
class Substitute:
    """The paper's value of a grid key and the stand-in used when the paper's cannot be obtained.

    key "dataset" / "corpus": `paper` is a dataset of harness.data.sources, obtainable when it resolves (mirror,
    cache, or a download that the hub answers). key "model": `paper` is a hub model, obtainable when its
    pretrained weights are cached or downloadable; `use` None keeps the name and runs it from random init (the
    cell's pretrained "auto"). `also`: other grid keys that change with it, {key: {paper value: substitute value}}
    (a patch size that divides the substitute's image size)."""

    key: str
    paper: Any
    use: Any = None
    label: str = ""                 # how messages name the paper's item ("CIFAR-10"); default its value
    use_label: str = ""             # how they name the substitute ("Fashion-MNIST", "random init")
    also: Dict[str, Dict[Any, Any]] = field(default_factory=dict)


class Experiment:
    """Base class; see the module docstring for the fields a subclass declares."""

    # What a cell's key leaves out of the class's code (harness.store.codehash): the declarative fields below,
    # whose values reach the key as cell parameters or decide nothing about a number, and the presentation
    # methods, which read result tables only. A test keeps DECLARATIONS equal to the fields declared here.
    DECLARATIONS: ClassVar[frozenset] = frozenset({
        "name", "figures_ref", "grid", "quick", "test", "paired", "description", "dtypes", "devices", "verify_tol",
        "paper", "substitutes", "dtype_note", "ranges", "float32_exempt", "paper_cost", "accepts_bounds"})
    PRESENTATION: ClassVar[frozenset] = frozenset({"figures", "summary"})

    name: str = ""
    figures_ref: List[str] = []
    grid: Dict[str, List[Any]] = {}
    quick: Dict[str, List[Any]] = {}
    test: Dict[str, List[Any]] = {}
    paired: List[tuple] = []
    description: str = ""
    # What the compute function honours. The runner refuses anything else before computing (UnsupportedContext).
    dtypes: tuple = COMPUTE_DTYPES
    devices: tuple = ("cpu", "cuda")
    # `run_all.py --verify` (harness.run.verify): per-column tolerance of a recomputed value against the committed
    # table, |now - committed| <= tol * max(1, |committed|); keys are column names or globs, "default" the rest,
    # None leaves a column out (timings). Exact quantities reproduce to rounding; a trained model's to what
    # determinism gives (bitwise: harness.models.train computes with a fixed thread count).
    verify_tol: Dict[str, Optional[float]] = {"default": 1e-9}
    # The papers' own sizes (models, data, epochs, number of inputs), overriding `grid` for --scale paper (a GPU
    # machine with network); None: the experiment refuses that scale (NoPaperScale).
    paper: Any = None
    # The paper's data / models and their stand-ins (harness.run.substitutes): a cell naming the paper's value
    # runs it when it can be obtained, else the substitute, recorded per cell and printed once per run.
    substitutes: tuple = ()
    # Why a dtype is refused, appended to the UnsupportedContext message ("" adds nothing).
    dtype_note: str = ""
    # Ranges of this experiment's grid parameters beyond (or instead of) PARAM_RANGES, e.g. {"layer": ">=0"}.
    ranges: Dict[str, str] = {}
    # Columns a float32 run may change beyond rounding (attack outcomes, timings): the dtype check skips them.
    float32_exempt: tuple = ()
    # --scale paper cost estimate: this factor times the committed full run's cell time; None: no estimate.
    paper_cost: Optional[float] = None
    # True: the worker registers the run's --bound plug-ins before run() (for experiments that evaluate every
    # registered bound without a `plugins` grid key); False: plug-ins reach it only through that key.
    accepts_bounds: bool = False

    def model_source(self, cell: Dict[str, Any]) -> Optional[str]:
        """What weights the cell uses (hub / package / random init), named without loading them: part of its key;
        "unavailable:..." makes the planner skip the cell with the command that gets them. Default: the cell's
        "model" (and "pretrained") as harness.models.text resolves them; None without one."""
        if "model" not in cell:
            return None
        try:
            from .models.text import model_source
        except ImportError:  # transformers absent: such a cell fails when it runs, with the loader's message
            return None
        try:
            return model_source(cell["model"], cell.get("pretrained"))
        except Exception as e:  # noqa: BLE001 - an unknown model fails in its cell, with the loader's message
            return f"unresolved:{e.__class__.__name__}"

    def data_names(self, cell: Dict[str, Any]) -> List[str]:
        """The datasets the cell reads, by harness.data.sources name: their sources join its key, and the planner
        skips the cell, naming each absent one with its fix, before running (harness.run.preflight). Default: the
        cell's "corpus" and "dataset" values; override it when run() reads data no such key names."""
        return [cell[k] for k in ("corpus", "dataset") if isinstance(cell.get(k), str)]

    def check_context(self, dtype: str, device: str) -> None:
        """Raise UnsupportedContext (clear, before computing) if this experiment cannot run in dtype/device."""
        kind = str(device).split(":")[0]
        if dtype not in self.dtypes:
            raise UnsupportedContext(
                f"experiment {self.name!r} does not run in {dtype}: it supports {', '.join(self.dtypes)}"
                + (f" ({self.dtype_note})" if self.dtype_note else "")
                + f"; rerun with --dtype {self.dtypes[0]}")
        if kind not in self.devices:
            raise UnsupportedContext(f"experiment {self.name!r} does not run on {kind}: it supports "
                                     f"{', '.join(self.devices)}; rerun with --device {self.devices[0]}")

    def grid_for(self, scale: str):
        """The parameter grid at a scale: full `grid`, overridden by `quick` or `test` (test falls back to quick)
        or `paper` (NoPaperScale when the experiment declares none).

        A dict grid gives a dict; a list-of-dicts grid gives a list (overrides apply to each sub-grid)."""
        from . import config as _config
        from . import grid as _grid

        _config.check_scale(scale)
        if scale == "paper" and not self.paper:
            raise NoPaperScale(f"experiment {self.name!r} declares no paper scale (`paper = {{...}}`: the papers' "
                               f"own sizes); run it at --scale full, or select experiments that declare one "
                               f"(run_all.py --scale paper with no names selects them)")

        g = self.grid
        layers = [self.quick] if scale == "quick" else [self.quick, self.test] if scale == "test" else \
            [self.paper] if scale == "paper" else []
        for ov in layers:
            if isinstance(ov, (list, tuple)):
                g = [dict(x) for x in ov]
            elif ov:
                g = _grid.override(g, {k: (list(v) if isinstance(v, (list, tuple, range)) else [v])
                                       for k, v in ov.items()}, strict=False)
                if isinstance(g, dict):  # keys only in the override still count (dict grids, as before)
                    for k, v in ov.items():
                        g.setdefault(k, list(v) if isinstance(v, (list, tuple, range)) else [v])
        return dict(g) if isinstance(g, dict) else [dict(x) for x in g]

    def cells(self, scale: str = "full", overrides: Optional[Dict[str, List[Any]]] = None) -> List[Dict[str, Any]]:
        """The grid cells at a scale, after --set overrides (ValueError on a key the grid does not have)."""
        from . import grid as _grid

        g = self.grid_for(scale)
        if overrides:
            g = _grid.override(g, overrides, strict=True)
        return _grid.expand(g, self.paired)

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
            if k == "figures" and not callable(v):  # @experiment(name=..., figures=[paper refs]) style
                k = "figures_ref"
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


def unregister(name: str) -> None:
    """Remove an experiment (tests registering throw-away experiments clean up with this)."""
    _REGISTRY.pop(name, None)


def list_experiments(pattern: str = "*") -> List[str]:
    """Names of the registered experiments matching a glob pattern, sorted. Registered: imported so far; the
    experiments package and $ATTNLIP_EXPERIMENTS_PATH are imported by harness.run.discovery (whose
    list_experiments loads them first)."""
    return sorted(n for n in _REGISTRY if fnmatch.fnmatchcase(n, pattern))


def get_experiment(name: str) -> Experiment:
    """The registered experiment `name`; a KeyError naming close names otherwise (harness.run.discovery's
    get_experiment imports the experiment modules first)."""
    if name not in _REGISTRY:
        import difflib

        close = difflib.get_close_matches(name, _REGISTRY.keys(), n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"unknown experiment {name!r}.{hint} Known: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
