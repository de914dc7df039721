"""lmc_fast: align, merge and measure independently trained Transformers.

    import lmc_fast as lf
    al = lf.align(model_a, model_b, method="weight")
    res = lf.barrier(model_a, al.apply(model_b), data, lambdas=25)
"""
from . import kernels, models
from .match import align, merge_many
from .models.adapters import UnsupportedModelError
from .symmetry import Alignment, to_canonical
from .sweep import BarrierResult, barrier, evaluate, interpolate, simplex

__version__ = "0.1.0"
__all__ = ["Alignment", "BarrierResult", "UnsupportedModelError", "align", "barrier", "evaluate", "interpolate",
           "kernels", "merge_many", "models", "simplex", "to_canonical"]
