"""The front door: any attention model + inputs -> every registered bound and the truth, as one table.

    from harness.analyze import analyze
    df = analyze("minilm", ["A sentence.", "Another, longer sentence."], layers=[0, 5])

`import harness.analyze` also makes the module callable: `harness.analyze(model, inputs, ...)`.
The command line is harness.analyze.cli:main (`attnlip analyze`). The names below load their modules (and torch)
when first used, so `attnlip analyze --help` and the option checks answer without them.
"""
import sys
import types

__all__ = ["analyze", "AnalyzeState", "EXTRA", "entry_point_plugins", "register_plugin"]


def __getattr__(name):
    # static imports (not importlib): the cell keys' code hash follows them (harness.store.codehash)
    if name in ("analyze", "entry_point_plugins", "register_plugin"):
        from harness.analyze import core as module
    elif name in ("AnalyzeState", "EXTRA"):
        from harness.analyze import state as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = globals()[name] = getattr(module, name)
    return value


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return self.analyze(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
