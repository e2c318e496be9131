"""The papers' data and models where they can be had, a declared stand-in where not.

An experiment lists `substitutes` (harness.catalog.Substitute): the paper's value of a grid key (dataset
"cifar10", model "bert-base-uncased") and what replaces it when it cannot be obtained (dataset "fashion_mnist"
with the patch sizes that fit 28x28 images; for a model, random init under the same name). The planner runs each
grid cell through `apply`:

- at the full / quick / test scales a cell naming the paper's value keeps it when `obtainable` says so (a mirror,
  a local folder, NLTK's data path, the `datasets` or hub cache, or a download the hub answers now), and otherwise
  becomes the substitute's cell. A value given with --set is never replaced: the user asked for it.
- at --scale paper nothing is replaced: the paper's own setting runs, or its cell fails with the loader's message.

The cell that runs is the one keyed and written, so the table's own columns (dataset, patch) say what ran; the
column `data_used` adds what was substituted for what, and `notices` gives one line per run and substitute:
"CIFAR-10 unreachable (offline: HF_HUB_OFFLINE=1): using Fashion-MNIST for lofast_certified, lofast_ablation".
"""
from __future__ import annotations

import functools
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from ..catalog import Experiment, Substitute

DATA_KEYS = ("dataset", "corpus")
PROBE_TIMEOUT_S = 10.0


def _label(sub: Substitute) -> str:
    return sub.label or str(sub.paper)


def _use_label(sub: Substitute) -> str:
    return sub.use_label or ("random init" if sub.use is None else str(sub.use))


@functools.lru_cache(maxsize=None)
def _hub_answers(repo: str) -> Optional[str]:
    """None when the hub answers for dataset `repo` (a download can start), else why not."""
    try:
        import huggingface_hub

        huggingface_hub.dataset_info(repo, timeout=PROBE_TIMEOUT_S)
    except Exception as e:  # noqa: BLE001 - any failure means: not downloadable from here now
        return f"hub unreachable: {e.__class__.__name__}"
    return None


def _dataset(name: str) -> Tuple[bool, str]:
    from ..data import hub, resolve, sources
    from ..errors import DataNotFound

    try:
        r = resolve.locate(name)
    except DataNotFound as e:
        return False, str(e).split(";")[0]
    if r.kind in ("mirror", "local", "nltk", "debian", "hf"):
        return True, ""
    d = sources.get(name)
    if r.kind == "download":
        if d.hub is None:
            return True, ""  # an NLTK package: nltk.download reports its own failure in the cell
        why = _hub_answers(d.hub.repo)
        return why is None, why or ""
    off = hub.offline_reason()
    return False, f"offline: {off}" if off else "no local copy and no download source"


def _model(name: str) -> Tuple[bool, str]:
    from ..models import text

    try:
        src = text.model_source(name, True)
    except Exception as e:  # noqa: BLE001 - an unusable name is as unobtainable as a missing one
        return False, f"{e.__class__.__name__}: {str(e)[:120]}"
    if src.startswith("unavailable"):
        from ..models import hub

        if hub.offline():
            from ..data.hub import offline_reason

            return False, f"offline: {offline_reason() or 'HF_HUB_OFFLINE set'}"
        return False, "weights not cached and the hub unreachable"
    return True, ""


@functools.lru_cache(maxsize=None)
def _obtainable_cached(key: str, value: str) -> Tuple[bool, str]:
    return _model(value) if key == "model" else _dataset(value)


def obtainable(sub: Substitute) -> Tuple[bool, str]:
    """(True, "") when the paper's item can be had from here, else (False, why): "offline: HF_HUB_OFFLINE=1"."""
    return _obtainable_cached(sub.key, str(sub.paper))


def clear_cache() -> None:
    """Forget what was resolved (the environment changed: a test, a fetch)."""
    _obtainable_cached.cache_clear()
    _hub_answers.cache_clear()


def _applies(sub: Substitute, cell: Dict[str, Any]) -> bool:
    if cell.get(sub.key) != sub.paper:
        return False
    return sub.key != "model" or sub.use is not None or cell.get("pretrained", "auto") in ("auto", True)


def apply(exp: Experiment, cell: Dict[str, Any], scale: str, fixed: Iterable[str] = ()
          ) -> Tuple[Dict[str, Any], Optional[str], List[Tuple[Substitute, str]]]:
    """(the cell to run, its `data_used` text or None, [(substitute, why) used or, at paper scale, needed])."""
    subs = [s for s in exp.substitutes or () if _applies(s, cell) and s.key not in set(fixed)]
    if not subs:
        return cell, None, []
    out, used, events = dict(cell), [], []
    for s in subs:
        ok, why = obtainable(s)
        asked = s.key == "model" and s.use is None and cell.get("pretrained") is True  # no fallback wanted
        if ok or scale == "paper" or asked:
            used.append(f"{s.paper} (paper)")
            if not ok:
                events.append((s, why))
            continue
        if s.use is not None:
            out[s.key] = s.use
            for k, mapping in s.also.items():
                if k in out and k not in set(fixed) and out[k] in mapping:
                    out[k] = mapping[out[k]]
        used.append(f"{_use_label(s) if s.use is None else s.use} (substitute for {s.paper})")
        events.append((s, why))
    return out, "; ".join(used), events


def notices(events: Sequence[Tuple[str, Substitute, str]], scale: str) -> List[str]:
    """One line per substitute over a run's experiments, from (experiment, substitute, why) events."""
    groups: Dict[Tuple[str, str, str, str], List[str]] = {}
    for name, s, why in events:
        fix = f"hf download {s.paper}" if s.key == "model" else f"attnlip data fetch {s.paper}"
        names = groups.setdefault((_label(s), why, _use_label(s), fix), [])
        if name not in names:
            names.append(name)
    lines = []
    for (label, why, use, fix), names in groups.items():
        head = f"{label} unreachable" + (f" ({why})" if why else "")
        if scale == "paper":
            lines.append(f"{head}: {', '.join(names)} need{'s' if len(names) == 1 else ''} it at --scale paper "
                         f"(no substitute at that scale; get it first with network: `{fix}`)")
        else:
            lines.append(f"{head}: using {use} for {', '.join(names)}")
    return lines


def plan_notices(plans: Iterable[Any], scale: str) -> List[str]:
    """notices(...) of planned experiments (harness.run.plan.ExpPlan: `.exp.name`, `.substituted`)."""
    return notices([(p.exp.name, s, why) for p in plans for s, why in p.substituted], scale)
