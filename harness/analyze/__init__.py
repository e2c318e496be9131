"""The front door: any attention model + inputs -> every registered bound and the truth, as one table.

    from harness.analyze import analyze
    df = analyze("minilm", ["A sentence.", "Another, longer sentence."], layers=[0, 5])

`import harness.analyze` also makes the module callable: `harness.analyze(model, inputs, ...)`.
The command line is harness.analyze.cli:main (`attnlip analyze`). The names below load their modules (and torch)
when first used, so `attnlip analyze --help` and the option checks answer without them.
"""
import importlib
import sys
import types

_LAZY = {"analyze": "core", "entry_point_plugins": "core", "register_plugin": "core", "AnalyzeState": "state",
         "EXTRA": "state"}

__all__ = ["analyze", "AnalyzeState", "EXTRA", "entry_point_plugins", "register_plugin"]


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return self.analyze(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
