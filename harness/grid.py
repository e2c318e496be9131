"""Parameter grids: product over keys, zip over `paired` key groups, unions of sub-grids, typed --set overrides.

A grid is a dict {key: [values]} (the cells are the Cartesian product) or a list of such dicts (the union
of their products, like scikit-learn's ParameterGrid), for experiments whose cells have different shapes.
Keys in one `paired` tuple vary together (zip): their lists must have equal length (a length-1 list is
broadcast). Cell order follows the key order of the grid, so it is deterministic.
"""
from __future__ import annotations

import itertools
import json
from typing import Any, Dict, Iterable, List, Mapping, Sequence, Tuple, Union

Grid = Union[Mapping[str, Sequence[Any]], Sequence[Mapping[str, Sequence[Any]]]]


def subgrids(grid: Grid) -> List[Dict[str, List[Any]]]:
    """The grid as a list of dict sub-grids (a dict grid is a list of one)."""
    if isinstance(grid, Mapping):
        return [_as_lists(grid)]
    if isinstance(grid, (list, tuple)):
        if not all(isinstance(g, Mapping) for g in grid):
            raise ValueError("a grid is a dict {key: [values]} or a list of such dicts")
        return [_as_lists(g) for g in grid]
    raise ValueError(f"a grid is a dict or a list of dicts, got {type(grid).__name__}")


def _as_lists(g: Mapping[str, Any]) -> Dict[str, List[Any]]:
    out = {}
    for k, v in g.items():
        if not isinstance(k, str) or not k:
            raise ValueError(f"grid keys must be non-empty strings, got {k!r}")
        out[k] = list(v) if isinstance(v, (list, tuple, range)) else [v]
        if not out[k]:
            raise ValueError(f"grid key {k!r} has an empty list of values")
    return out


def expand(grid: Grid, paired: Iterable[Tuple[str, ...]] = ()) -> List[Dict[str, Any]]:
    """All cells of a grid: dicts {key: value}, product over keys, zip inside each paired group, union over sub-grids."""
    paired = [tuple(p) for p in paired]
    seen = set()
    for p in paired:
        for k in p:
            if k in seen:
                raise ValueError(f"key {k!r} appears in two paired groups")
            seen.add(k)
    cells: List[Dict[str, Any]] = []
    ids = set()
    for g in subgrids(grid):
        axes: List[List[Dict[str, Any]]] = []
        done = set()
        for key in g:
            if key in done:
                continue
            group = next((p for p in paired if key in p), (key,))
            group = tuple(k for k in group if k in g)
            lens = {k: len(g[k]) for k in group}
            L = max(lens.values())
            bad = {k: n for k, n in lens.items() if n not in (1, L)}
            if bad:
                raise ValueError(f"paired keys {group} need lists of equal length (or length 1), got {lens}")
            axes.append([{k: (g[k][i] if lens[k] == L else g[k][0]) for k in group} for i in range(L)])
            done.update(group)
        for combo in itertools.product(*axes):
            cell: Dict[str, Any] = {}
            for part in combo:
                cell.update(part)
            cell = {k: cell[k] for k in g}  # grid key order
            ident = json.dumps(cell, sort_keys=True, default=str)
            if ident not in ids:  # sub-grids may overlap: keep the first
                ids.add(ident)
                cells.append(cell)
    return cells


def keys(grid: Grid) -> List[str]:
    """All parameter names appearing in the grid (first-seen order)."""
    out: List[str] = []
    for g in subgrids(grid):
        out += [k for k in g if k not in out]
    return out


def override(grid: Grid, overrides: Mapping[str, List[Any]], strict: bool = True) -> Grid:
    """The grid with `overrides` {key: [values]} replacing those keys in every sub-grid holding them.

    strict: a key found in no sub-grid raises ValueError naming the known keys.
    """
    subs = subgrids(grid)
    known = keys(subs)
    for k in overrides:
        if strict and k not in known:
            raise ValueError(f"unknown grid parameter {k!r}; known: {', '.join(known) or '(none)'}")
    new = []
    for g in subs:
        g = dict(g)
        for k, v in overrides.items():
            if k in g:
                g[k] = list(v)
        new.append(g)
    return new[0] if isinstance(grid, Mapping) else new


def parse_value(text: str) -> Any:
    """Typed value of a --set right-hand side: int, float, bool, None, JSON (lists, strings), else the raw string."""
    s = text.strip()
    low = s.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for conv in (int, float):
        try:
            return conv(s)
        except ValueError:
            pass
    if s[:1] in "[{\"":
        try:
            return json.loads(s)
        except json.JSONDecodeError as e:
            raise ValueError(f"cannot parse {text!r} as JSON: {e}") from None
    return s


def parse_set(items: Iterable[str]) -> Dict[str, List[Any]]:
    """--set key=value pairs -> {key: [values]}; `a,b,c` or `[a, b]` gives several values; repeated keys append."""
    out: Dict[str, List[Any]] = {}
    for item in items:
        if "=" not in item:
            raise ValueError(f"--set expects key=value, got {item!r}")
        key, _, rhs = item.partition("=")
        key = key.strip()
        if not key:
            raise ValueError(f"--set expects key=value with a non-empty key, got {item!r}")
        rhs = rhs.strip()
        if rhs.startswith("["):
            val = parse_value(rhs)
            vals = list(val) if isinstance(val, list) else [val]
        elif "," in rhs:
            vals = [parse_value(p) for p in rhs.split(",") if p.strip() != ""]
        else:
            vals = [parse_value(rhs)]
        out.setdefault(key, []).extend(vals)
    return out


def cell_label(cell: Mapping[str, Any]) -> str:
    """Short human-readable cell id: `k1=v1,k2=v2` in the cell's key order."""
    def fmt(v):
        return f"{v:g}" if isinstance(v, float) else json.dumps(v) if isinstance(v, (list, dict)) else str(v)

    return ",".join(f"{k}={fmt(v)}" for k, v in cell.items())
