"""lmc_fast: align, merge and measure independently trained Transformers.

    import lmc_fast as lf
    al = lf.align(model_a, model_b, method="weight")
    res = lf.barrier(model_a, al.apply(model_b), data, lambdas=25)

The names below are imported on first use (PEP 562), so `import lmc_fast` (and the `lmc-fast`
command, which must set OpenMP's environment before torch loads) does not import torch.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "Alignment": ".symmetry",
    "to_canonical": ".symmetry",
    "BarrierResult": ".sweep",
    "barrier": ".sweep",
    "evaluate": ".sweep",
    "interpolate": ".sweep",
    "simplex": ".sweep",
    "plane": ".sweep",
    "align": ".match",
    "merge_many": ".match",
    "LearnedAlignment": ".match.learned_module",
    "UnsupportedModelError": ".models.adapters",
}
#: subpackages reachable as attributes (`lmc_fast.data.loader(...)`) without importing them first
_SUBMODULES = ("atomic", "callbacks", "cli", "data", "demo", "errors", "grid", "instability", "io", "kernels",
               "match", "models", "monitor", "numerics", "plots", "recipes", "sweep", "symmetry", "train", "diffusion")

__all__ = ["Alignment", "BarrierResult", "LearnedAlignment", "UnsupportedModelError", "align", "barrier", "evaluate",
           "interpolate", "kernels", "merge_many", "models", "plane", "simplex", "to_canonical"]


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f".{name}", __name__)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | set(_SUBMODULES))
