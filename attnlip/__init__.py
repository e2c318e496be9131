"""AttnLip's public Python API, one import: `import attnlip`.

    attnlip.analyze(model, inputs, ...)        every registered bound and the truth per layer and head (a DataFrame)
    attnlip.certify(model, inputs, ...)        certified l2 radius of each prediction of a classifier, beside an attack
    attnlip.registry                           the bound registry: evaluate, register_bound, bound_names, ...
    attnlip.register_bound(fn, scope="head")   add your bound (joins analyze, the leaderboard and their checks)
    attnlip.evaluate(X, w)                     every registered bound + the truth on one attention layer
    attnlip.AttentionWeights, attnlip.attention                 an attention layer's weights and its map
    attnlip.jacobian_norm(f, X), attnlip.layer_lipschitz(X, w)  the true local Lipschitz constant
    attnlip.jsm_norm(p), attnlip.g_k(p, k)                      softmax Jacobian: exact norm, JaSMin's g_k

The names are the harness's own functions (harness.analyze, harness.certify, harness.bounds, harness.kernels),
re-exported: each loads its module (and torch) when first used, so `import attnlip` itself is immediate."""
from __future__ import annotations

__all__ = ["analyze", "AnalyzeOptions", "certify", "registry", "register_bound", "unregister_bound", "evaluate",
           "bound_names", "AttentionWeights", "attention", "jacobian_norm", "layer_lipschitz", "jsm_norm", "g_k",
           "__version__"]

from harness import __version__  # noqa: E402,F401 - one version string (pyproject.toml, harness)


def __getattr__(name):
    # static imports, one branch a module: what each name is stays greppable
    if name == "analyze":
        from harness.analyze.core import analyze as value
    elif name == "AnalyzeOptions":
        from harness.analyze.options import AnalyzeOptions as value
    elif name == "certify":
        from harness.certify.run import certify_model as value
    elif name == "registry":
        from harness.bounds import registry as value
    elif name in ("register_bound", "unregister_bound", "evaluate", "bound_names"):
        from harness.bounds import registry

        value = getattr(registry, name)
    elif name in ("AttentionWeights", "attention"):
        from harness.kernels import attention as module

        value = getattr(module, name)
    elif name == "jacobian_norm":
        from harness.kernels.power import jacobian_norm as value
    elif name == "layer_lipschitz":
        from harness.kernels.layer import lipschitz as value
    elif name in ("jsm_norm", "g_k"):
        from harness.kernels import softmax

        value = getattr(softmax, name)
    else:
        raise AttributeError(f"module 'attnlip' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
