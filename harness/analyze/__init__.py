"""The front door: any attention model + inputs -> every registered bound and the truth, as one table.

    from harness.analyze import analyze
    df = analyze("minilm", ["A sentence.", "Another, longer sentence."], layers=[0, 5])

`import harness.analyze` also makes the module callable: `harness.analyze(model, inputs, ...)`.
The command line is harness.analyze.cli:main (`attnlip analyze`).
"""
import sys
import types

from harness.analyze.core import analyze, entry_point_plugins, register_plugin
from harness.analyze.state import EXTRA, AnalyzeState

__all__ = ["analyze", "AnalyzeState", "EXTRA", "entry_point_plugins", "register_plugin"]


class _CallableModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        return analyze(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
