"""Planning a run: which experiments, which cells (grid at a scale, type-checked --set overrides), their keys,
their cache state, and where the outputs of this kind of run go (scales and overrides never share a folder)."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

from .. import config as _config
from .. import grid as _grid
from ..catalog import Experiment
from ..store import keys as _keys
from ..store.atomic import folder_problem
from ..store.cells import CellCache, CorruptCell, column_conflicts, null_conflicts, record_problem
from ..store.codehash import REPO_ROOT, experiment_code, repo_module_hash
from . import changes as _changes
from . import discovery as _discovery
from . import overrides as _ov
from .overrides import _declared, _fmt, check_value, typed_overrides  # noqa: F401 - the --set checks, re-exported
from .preflight import missing as missing_items
from .substitutes import apply as apply_substitutes

EXECUTORS = ("serial", "process", "submitit")


@dataclass
class RunConfig:
    """Everything that selects and keys a run (CLI flags map 1:1 onto these)."""

    scale: str = "full"
    seed: int = 0
    dtype: str = "float64"
    device: str = "cpu"  # resolved: cpu | cuda | cuda:N
    results_dir: Path = field(default_factory=lambda: REPO_ROOT / "results")
    cache_dir: Optional[Path] = None  # default results_dir/cache
    executor: str = "serial"
    jobs: int = 1
    force: bool = False
    overrides: Dict[str, List[Any]] = field(default_factory=dict)
    progress: bool = True
    figures: bool = True
    cluster: Optional[str] = None  # submitit: None -> slurm if sbatch exists else local
    executor_params: Dict[str, Any] = field(default_factory=dict)
    timeout_min: int = 60
    fresh_workers: bool = False  # process executor: one cell per worker process
    threads: Optional[int] = None  # torch threads per worker; None: cores // jobs (pools) or torch's default
    bounds: List[str] = field(default_factory=list)  # plug-in bounds "module:function" (--bound)
    # typed_overrides' answers, per experiment and settings: --set values are typed and range-checked once a run
    _typed: Dict[tuple, Dict[str, List[Any]]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self):
        self.results_dir = Path(self.results_dir)
        self.cache_dir = Path(self.cache_dir) if self.cache_dir else self.results_dir / "cache"
        for flag, folder in (("--results-dir", self.results_dir), ("--cache-dir", self.cache_dir)):
            why = folder_problem(folder)
            if why:
                raise ValueError(f"{flag} {why}")
        if self.executor not in EXECUTORS:
            raise ValueError(f"unknown executor {self.executor!r}: use {', '.join(EXECUTORS)}")
        _config.check_scale(self.scale)
        _config.check_dtype(self.dtype)
        _config.check_seed(self.seed)
        if self.jobs < 1:
            raise ValueError(f"--jobs must be >= 1, got {self.jobs}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {self.threads}")

    @property
    def variant(self) -> str:
        """'' for the canonical run (full scale, no --set, seed 0, float64, cpu), else a folder name that says
        what differs, e.g. 'quick', 'custom/full__n=2,4,8', 'custom/quick__dtype=float32'."""
        extra = []
        if self.overrides:
            extra += [f"{k}={','.join(_fmt(v) for v in vs)}" for k, vs in sorted(self.overrides.items())]
        if self.dtype != "float64":
            extra.append(f"dtype={self.dtype}")
        if self.seed != 0:
            extra.append(f"seed={self.seed}")
        extra += [f"bound={b}" for b in self.bounds]
        if _config.device_kind(self.device) != "cpu":
            extra.append(f"device={_config.device_kind(self.device)}")
        if not extra:
            return "" if self.scale == "full" else self.scale
        slug = re.sub(r"[^A-Za-z0-9=,._+-]", "_", "__".join(extra))
        if len(slug) > 80:
            from ..store.atomic import sha256

            slug = slug[:70] + "-" + sha256(slug)[:8]
        return f"custom/{self.scale}__{slug}"

    @property
    def output_root(self) -> Path:
        """Where this run's tables, figures, manifests and README go."""
        return self.results_dir / self.variant if self.variant else self.results_dir


def compute_command(names: Sequence[str], cfg: RunConfig) -> str:
    """The run_all.py command line that computes the cells `cfg` plans for `names` (cached ones are skipped) and
    writes their outputs: the same scale, overrides, dtype, seed, device, plug-ins and folders."""
    import json
    import shlex

    parts = ["run_all.py", *names]
    if cfg.scale != "full":
        parts += ["--scale", cfg.scale]
    for k, vs in sorted(cfg.overrides.items()):
        one = len(vs) == 1 and not isinstance(vs[0], list)  # n=8 rather than n=[8]
        parts += ["--set", f"{k}={json.dumps(vs[0] if one else vs)}"]
    if cfg.dtype != "float64":
        parts += ["--dtype", cfg.dtype]
    if cfg.seed != 0:
        parts += ["--seed", str(cfg.seed)]
    if _config.device_kind(cfg.device) != "cpu":
        parts += ["--device", cfg.device]
    for b in cfg.bounds:
        parts += ["--bound", b]
    if cfg.results_dir.resolve() != (REPO_ROOT / "results").resolve():
        parts += ["--results-dir", str(cfg.results_dir)]
    if cfg.cache_dir.resolve() != (cfg.results_dir / "cache").resolve():
        parts += ["--cache-dir", str(cfg.cache_dir)]
    return " ".join(shlex.quote(x) for x in parts)


@dataclass
class CellTask:
    experiment: str
    cell: Dict[str, Any]
    key: str
    label: str
    state: str = "missing"  # cached | missing | corrupt
    note: str = ""
    model_source: Optional[str] = None
    data_source: Optional[str] = None
    data_identity: Optional[Dict[str, str]] = None  # dataset -> sha256 of its files (harness.data.identity)
    why: str = ""  # not cached: what differs from the last run's record of this cell (harness.run.changes)
    used: Optional[str] = None  # data / model used where the experiment declares substitutes (data_used column)
    missing: List[Dict[str, str]] = field(default_factory=list)  # external items it needs that are absent (preflight)


@dataclass
class ExpPlan:
    exp: Experiment
    code: str
    tasks: List[CellTask]
    reads_scale: bool = False
    substituted: List[tuple] = field(default_factory=list)  # [(Substitute, why)]: used, or needed at paper scale
    overrides: Dict[str, List[Any]] = field(default_factory=dict)  # the --set values it runs with (typed_overrides)


def select(names: Sequence[str] = (), only: Sequence[str] = ()) -> List[str]:
    """Experiment names from exact names and/or globs (positional and --only); all when none given."""
    pats = [p for item in list(names) + list(only) for p in str(item).split(",") if p.strip()]
    if not pats:
        return _discovery.list_experiments()
    out: List[str] = []
    for p in pats:
        p = p.strip()
        if any(ch in p for ch in "*?["):
            hits = _discovery.list_experiments(p)
            if not hits:
                raise KeyError(f"pattern {p!r} matches no experiment. Known: "
                               f"{', '.join(_discovery.list_experiments()) or '(none)'}")
        else:
            hits = [_discovery.get_experiment(p).name]  # KeyError with close matches
        out += [h for h in hits if h not in out]
    return out


PLUGIN_KEY = _ov.PLUGIN_KEY  # grid key of experiments that evaluate every registered bound (bound_leaderboard)


def accepts_bounds(exp: Experiment) -> bool:
    """Whether --bound plug-ins reach this experiment: a `plugins` grid key, or `accepts_bounds = True` (the
    worker then registers them before run())."""
    return exp.accepts_bounds or PLUGIN_KEY in _grid.keys(exp.grid)


def plugin_sources(exp: Experiment, cfg: RunConfig, cell: Optional[Dict[str, Any]] = None
                   ) -> Optional[List[Dict[str, str]]]:
    """The plug-ins a cell evaluates (--bound, and the specs of its `plugins` grid key), each with the hash of its
    code, for the cell key (editing a plug-in recomputes the cells that evaluated it; the code hash does not see
    them: they are loaded by name through harness.plugins). A plug-in inside this repository (harness.*,
    experiments.*) is keyed by its import closure, like an experiment, so helpers it imports count too; any other
    by the sha256 of its own source file."""
    specs = list(cfg.bounds) if cfg.bounds and accepts_bounds(exp) else []
    specs += [s for s in ((cell or {}).get(PLUGIN_KEY) or []) if s not in specs]
    if not specs:
        return None
    import importlib.util

    from ..store.atomic import sha256

    out = []
    for b in specs:
        mod = b.partition(":")[0]
        digest = repo_module_hash(mod)
        if digest is not None:
            out.append({"bound": b, "source": digest})
            continue
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):  # the cell says what is wrong when it loads the plug-in
            spec = None
        origin = getattr(spec, "origin", None)
        out.append({"bound": b, "source": sha256(Path(origin).read_bytes()) if origin and Path(origin).is_file()
                    else "unknown"})
    return out


def check_bounds(names: Sequence[str], cfg: RunConfig) -> None:
    """--bound: each plug-in must load ('module:function', a callable) and some selected experiment must use it."""
    if not cfg.bounds:
        return
    from ..plugins import load_function

    for b in cfg.bounds:
        try:
            fn = load_function(b)
        except (ImportError, AttributeError, ValueError) as e:
            raise ValueError(f"--bound {b}: cannot load it ({e.__class__.__name__}: {e}); expected 'module:function' "
                             f"importable from here (PYTHONPATH)") from None
        if not callable(fn):
            raise ValueError(f"--bound {b}: {type(fn).__name__} is not callable")
    users = [n for n in names if accepts_bounds(_discovery.get_experiment(n))]
    if not users:
        raise ValueError("--bound: none of the selected experiments evaluates plug-in bounds; "
                         "use it with bound_leaderboard (or `attnlip analyze --bound`)")


def check_overrides(names: Sequence[str], cfg: RunConfig) -> None:
    """Every --set key must belong to a selected experiment's grid, with a value of the declared type; the
    context (dtype, device) must be one every selected experiment runs in (UnsupportedContext otherwise)."""
    known = set()
    for n in names:
        exp = _discovery.get_experiment(n)
        known.update(_grid.keys(exp.grid_for(cfg.scale)))
        typed_overrides(exp, cfg)
        exp.check_context(cfg.dtype, cfg.device)
    check_bounds(names, cfg)
    bad = [k for k in cfg.overrides if k not in known]
    if bad:
        raise ValueError(f"--set {', '.join(bad)}: no selected experiment has such a grid parameter; "
                         f"known: {', '.join(sorted(known)) or '(none)'}")


def model_source(exp: Experiment, cell: Dict[str, Any]) -> Optional[str]:
    """What weights a cell would use (hub / package / random init), without loading them: part of the key
    (Experiment.model_source)."""
    return exp.model_source(cell)


def data_source(exp: Experiment, cell: Dict[str, Any]) -> Optional[str]:
    """Where a cell's datasets come from (mirror / NLTK / hub revision / download), without loading them: part of
    the key. The datasets are exp.data_names(cell) that name a dataset of harness.data.sources (synthetic data has
    no source)."""
    names = list(exp.data_names(cell))
    from ..data import resolve, sources

    got = [resolve.source(n) for n in names if n in sources.DATASETS]
    return "+".join(got) or None


def data_identity(exp: Experiment, cell: Dict[str, Any], memo_dir: Optional[Path] = None,
                  model: Optional[str] = None) -> Optional[Dict[str, str]]:
    """What a cell's datasets are: name -> sha256 of the local files their source holds (harness.data.identity,
    memoized in `memo_dir`), for the key; None when no dataset it reads has local files (hub copies carry their
    revision in the source). A model whose source (`model`) reads the GPT-2 tokenizer adds its folder's files."""
    from ..data import identity

    out = identity.digests(list(exp.data_names(cell)), memo_dir) or {}
    if model and "gpt2" in model:
        from ..models import text as models_text

        if models_text.reads_gpt2_tokenizer(model):
            tok = identity.folder_digest(models_text.gpt2_tokenizer_folder(), memo_dir)
            if tok is not None:
                out["gpt2_tokenizer"] = tok
    return out or None


def _always_set(folder: Path) -> List[str]:
    """The columns the committed table in `folder` fills in every row (none when there is no readable table)."""
    path = folder / "table.parquet"
    if not path.is_file():
        return []
    try:
        import pandas as pd

        table = pd.read_parquet(path)
    except Exception:  # noqa: BLE001 - a damaged table is reported by the run or --verify, not here
        return []
    return [c for c in table.columns if not table[c].isna().any()]


def plan(name: str, cfg: RunConfig, verify: bool = True) -> ExpPlan:
    """Cells of one experiment with their keys and cache state (verify: load each file to detect corruption)."""
    exp = _discovery.get_experiment(name)
    code = experiment_code(exp)
    store = CellCache(cfg.cache_dir)
    tasks, events, memo = [], [], {}
    loaded: List[tuple] = []  # (task, record) of the cells read from the cache, checked against each other below
    overrides = typed_overrides(exp, cfg)
    for cell in exp.cells(cfg.scale, overrides):
        cell, used, subs = apply_substitutes(exp, cell, cfg.scale, fixed=overrides)
        events += [e for e in subs if e not in events]
        src, data = model_source(exp, cell), data_source(exp, cell)
        ident = data_identity(exp, cell, cfg.cache_dir, src)
        plugins = plugin_sources(exp, cfg, cell)
        key = _keys.cell_key(name, cell, cfg.seed, cfg.dtype, cfg.device, code["hash"],
                             scale=cfg.scale if code["reads_scale"] else None, model_source=src, plugins=plugins,
                             data_source=data, data_identity=ident)
        t = CellTask(name, cell, key, _grid.cell_label(cell), model_source=src, data_source=data, used=used,
                     data_identity=ident, missing=missing_items(exp, cell, src, memo))
        if store.exists(name, key):
            if verify:
                try:
                    rec = store.load(name, key)
                    problem = record_problem(rec, cell)
                    if problem:
                        raise CorruptCell(f"{store.path(name, key)}: {problem}")
                    t.state = "cached"
                    loaded.append((t, rec))
                except CorruptCell as e:
                    t.state, t.note = "corrupt", str(e)
            else:
                t.state = "cached"
        tasks.append(t)
    records = [rec for _, rec in loaded]
    checks = {**null_conflicts(records, _always_set(cfg.output_root / name)), **column_conflicts(records)} \
        if records else {}  # nothing read from the cache (verify=False: --list): no committed table to read
    for i, why in checks.items():
        t = loaded[i][0]
        t.state, t.note = "corrupt", f"{store.path(name, t.key)}: {why}"
    whys = _changes.reasons(tasks, code["hash"], _changes.read_manifest(cfg.output_root / name))
    for t in tasks:
        t.why = whys.get(t.label, "")
    return ExpPlan(exp, code["hash"], tasks, code["reads_scale"], substituted=events, overrides=overrides)


def paper_selection(names: Sequence[str], cfg: RunConfig, explicit: bool) -> List[str]:
    """--scale paper with no experiment named: the selected experiments that declare a paper scale (the others
    have no paper sizes to run); named ones are kept, and one without a paper scale is refused by grid_for."""
    if cfg.scale != "paper" or explicit:
        return list(names)
    return [n for n in names if _discovery.get_experiment(n).paper]
