"""--set values, typed and range-checked in one place: a value takes the type of the values the experiment declares
for that grid key (an int where floats are declared becomes a float) and must lie in the key's range
(harness.catalog.PARAM_RANGES, overridden by the experiment's own `ranges`). Checked once per run and experiment
(the answer is kept on the RunConfig), when the run is planned, so a value outside is one line before any cell."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Sequence

from .. import catalog as _catalog
from .. import config as _config
from .. import grid as _grid

if TYPE_CHECKING:
    from ..catalog import Experiment

PLUGIN_KEY = "plugins"  # grid key of experiments that evaluate every registered bound (bound_leaderboard)


def _fmt(v: Any) -> str:
    import json

    return f"{v:g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def _declared(exp: Experiment, key: str) -> List[Any]:
    vals: List[Any] = []
    for scale in _config.SCALES:
        if scale == "paper" and not exp.paper:
            continue
        for g in _grid.subgrids(exp.grid_for(scale)):
            vals += g.get(key, [])
    return vals


def _kind(v: Any) -> str:
    return "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float" if isinstance(v, float) \
        else "none" if v is None else "list" if isinstance(v, list) else "dict" if isinstance(v, dict) else "str"


def check_value(exp_name: str, key: str, value: Any, declared: Sequence[Any]) -> Any:
    """`value` converted to the grid's declared type for `key` (int -> float where floats are declared), or a
    ValueError naming the key, the experiment, the expected type and an example."""
    kinds = {_kind(v) for v in declared}
    k = _kind(value)
    if not kinds or k in kinds:
        if k == "list" and "list" in kinds:
            inner = [x for v in declared if isinstance(v, list) for x in v]
            if inner:
                return [check_value(exp_name, f"{key}[]", x, inner) for x in value]
        return value
    if k == "int" and "float" in kinds:
        return float(value)
    example = ", ".join(_fmt(v) for v in declared[:4])
    raise ValueError(f"--set {key}={_fmt(value)}: grid parameter {key!r} of {exp_name} takes "
                     f"{' or '.join(sorted(kinds))} values (declared: {example}), got {k} {value!r}")


def typed_overrides(exp: Experiment, cfg) -> Dict[str, List[Any]]:
    """The --set overrides that apply to this experiment, typed by its declared grid values and checked against its
    ranges (harness.catalog.PARAM_RANGES and the experiment's own `ranges`): the one place a --set value is checked.
    The answer is kept on `cfg` (a harness.run.plan.RunConfig), so planning, the outputs and the checks before a
    run share it."""
    memo = (exp.name, cfg.scale, repr(sorted(cfg.overrides.items())), tuple(cfg.bounds))
    if memo not in cfg._typed:
        cfg._typed[memo] = _typed(exp, cfg)
    return {k: list(v) for k, v in cfg._typed[memo].items()}


def _typed(exp: Experiment, cfg) -> Dict[str, List[Any]]:
    known = _grid.keys(exp.grid_for(cfg.scale))
    out = {}
    for k, vs in cfg.overrides.items():
        if k in known:
            decl = _declared(exp, k)
            out[k] = [check_value(exp.name, k, v, decl) for v in vs]
            rule = {**_catalog.PARAM_RANGES, **exp.ranges}.get(k)
            bad = [v for v in out[k] if rule and _catalog.out_of_range(rule, v)]
            if bad:
                raise ValueError(f"--set {k}={_fmt(bad[0])}: grid parameter {k!r} of {exp.name} takes values "
                                 f"{rule}{' (each element)' if isinstance(bad[0], list) else ''} and finite")
    if cfg.bounds and PLUGIN_KEY in known:  # --bound X == --set 'plugins=[["X", ...]]'
        out[PLUGIN_KEY] = [list(cfg.bounds)]
    return out
