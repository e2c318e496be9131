"""Loading plug-in code by name ('package.module:function'): the one dynamic import of the harness.

Kept apart from harness.bounds.registry so that the code hash (harness.store.codehash) does not see a dynamic import
in every closure that reaches the registry (which would widen those hashes to all of harness/): this module is
neither hashed nor walked there, and what it loads is keyed by its own source instead (harness.run.plan.
plugin_sources hashes the file of every plug-in a cell evaluates, from --bound and from the `plugins` grid key).

Modules are found as `python -m` finds them: on sys.path, and in the current working directory, which the
`attnlip` and `run_all.py` entry points do not put on sys.path themselves. The working directory is searched
only when the installed packages do not have the module, so a local folder never shadows an installed package.

Every call of a plug-in goes through `guarded` (load_function wraps what it loads; the bound registry wraps any
other callable it registers): private copies of its inputs, a time limit ($ATTNLIP_PLUGIN_TIMEOUT), and a
PluginError naming it for whatever goes wrong, so the user's code can neither change another bound's inputs nor
end, hang or crash the command.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import os
import sys
import threading
from typing import Any, Callable

from harness.errors import PluginError


def _import(mod: str):
    try:
        return importlib.import_module(mod)
    except ModuleNotFoundError as e:
        top = mod.split(".", 1)[0]
        cwd = os.getcwd()
        if e.name != top or cwd in sys.path or "" in sys.path:
            raise
        sys.path.append(cwd)  # as `python -m` would have it, after the installed packages
        importlib.invalidate_caches()
        try:
            return importlib.import_module(mod)
        except ModuleNotFoundError as e2:
            if e2.name == top:
                sys.path.remove(cwd)
                raise ModuleNotFoundError(f"No module named {top!r} on sys.path or in the working directory "
                                          f"{cwd}", name=top) from None
            raise


def load_function(spec_: str) -> Callable:
    """'package.module:function' -> the function (the `--bound` option's syntax)."""
    mod, sep, attr = spec_.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"expected 'module:function', got {spec_!r}")
    try:  # the module's own code runs here: under the same time limit as a call, and it may not end the command
        obj = _run(_import, (mod,), {}, timeout_s(), spec_)
    except (Exception, KeyboardInterrupt):
        raise
    except BaseException as e:  # SystemExit at import
        raise PluginError(f"plug-in module {mod} exited while imported ({e.__class__.__name__}"
                          f"{f': {e}' if str(e) else ''})") from None
    for part in attr.split("."):
        obj = getattr(obj, part)
    return guarded(obj, spec_) if callable(obj) else obj


# A plug-in call that has not returned after this long is reported as stuck. Generous: a bound over a long batch of
# long inputs may take minutes, like the truth beside it; ATTNLIP_PLUGIN_TIMEOUT (seconds, 0: no limit) sets it.
TIMEOUT_S = 600.0
TIMEOUT_ENV = "ATTNLIP_PLUGIN_TIMEOUT"
# What a plug-in call may return: numbers (a tensor, an array, a number, a list of them) of a real dtype.
ACCEPTED = "a tensor, array or list of real per-head or per-layer numbers"


def timeout_s() -> float:
    """The time limit of one plug-in call in seconds ($ATTNLIP_PLUGIN_TIMEOUT, else TIMEOUT_S); 0: none."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"${TIMEOUT_ENV}={raw!r} is not a time limit: set it to a number of seconds >= 0 "
                         "(0: no limit) or unset it")
    return value


def _private(arg: Any) -> Any:
    """A copy of one argument that shares no memory with the caller's: tensors and arrays, and the tensors of a
    dataclass (AttentionWeights), so a plug-in that writes into its inputs changes nothing another bound reads."""
    if hasattr(arg, "detach") and hasattr(arg, "clone"):  # a torch tensor
        return arg.detach().clone()
    if hasattr(arg, "copy") and hasattr(arg, "__array__"):  # a numpy array
        return arg.copy()
    if dataclasses.is_dataclass(arg) and not isinstance(arg, type):
        return dataclasses.replace(arg, **{f.name: _private(getattr(arg, f.name))
                                           for f in dataclasses.fields(arg) if f.init})
    return arg


def _check_values(out: Any, spec_: str) -> None:
    """PluginError unless `out` converts to a tensor of real numbers (not text, not a generator, not complex)."""
    import torch

    got = type(out).__name__
    if isinstance(out, (torch.Tensor, int, float, list, tuple)) or type(out).__module__ == "numpy":
        try:
            t = out if isinstance(out, torch.Tensor) else torch.as_tensor(out)
        except (TypeError, ValueError, RuntimeError, OverflowError):
            t = None
        else:
            got = f"{got} of dtype {str(t.dtype).replace('torch.', '')}"
        if t is not None and t.is_meta:
            got += " on the meta device (no values)"
        elif t is not None and t.layout != torch.strided:
            got += f" in layout {str(t.layout).replace('torch.', '')}"
        elif t is not None and not (t.is_complex() or t.dtype == torch.bool):
            return
    raise PluginError(f"plug-in {spec_} returned {got}, not bound values ({ACCEPTED})")


def _run(fn: Callable, args: tuple, kwargs: dict, limit: float, spec_: str) -> Any:
    """fn(*args, **kwargs) in a daemon thread, waited for at most `limit` seconds (0: called here). Returns its
    result or re-raises what it raised; PluginError when it did not return in time (the thread is left running,
    a daemon, so the command still ends). Torch's grad and inference modes (per thread) are the caller's."""
    if not limit:
        return fn(*args, **kwargs)
    import torch

    grad, inference, box = torch.is_grad_enabled(), torch.is_inference_mode_enabled(), {}

    def work():
        try:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad):
                box["out"] = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=work, name=f"plug-in {spec_}", daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        raise PluginError(f"plug-in {spec_} did not return within {limit:g} s (${TIMEOUT_ENV}=SECONDS sets the limit, "
                          "0 none)")
    if "error" in box:
        raise box.pop("error")
    return box["out"]


def is_guarded(fn: Callable) -> bool:
    return getattr(fn, "__plugin__", None) is not None


def guarded(fn: Callable, spec_: str, values: bool = True) -> Callable:
    """`fn` as a plug-in is called: with private copies of its arguments (_private), under the time limit
    (timeout_s), and whatever it raises (SystemExit included), a result that cannot be bound values (when
    `values`: see _check_values) or no result in time becomes a PluginError naming the plug-in, so a user's bug is
    one line, never a traceback of ours, and never reaches another bound. A KeyboardInterrupt stays one. The
    signature and declared attributes (bound_name, scope, ...) stay those of `fn`."""
    limit = timeout_s()

    @functools.wraps(fn)
    def call(*args, **kwargs):
        args, kwargs = tuple(map(_private, args)), {k: _private(v) for k, v in kwargs.items()}
        try:
            out = _run(fn, args, kwargs, limit, spec_)
        except (PluginError, KeyboardInterrupt):
            raise
        except Exception as e:  # noqa: BLE001 - the plug-in's own error, reported as its own
            raise PluginError(f"plug-in {spec_} raised {e.__class__.__name__}: {str(e)[:300]}") from e
        except BaseException as e:  # SystemExit, GeneratorExit: the plug-in may not end the command
            raise PluginError(f"plug-in {spec_} exited ({e.__class__.__name__}{f': {e}' if str(e) else ''}) "
                              "instead of returning bound values") from None
        if values:
            _check_values(out, spec_)
        return out

    call.__plugin__ = spec_
    return call
