"""The one list of matching methods: name -> how to run it, whether it needs data, where to sweep.

    from lmc_fast.match.methods import METHODS, method, align_with
    m = method("activation")           # Method(name="activation", needs_data=True, space="canonical", ...)
    al = align_with("weight", a, b)    # an Alignment, or None for "none"
    res = lf.barrier(a, al.apply(b) if al else b, test, space=m.space)

`lf.align` validates against it, and the demo and the grid iterate over it, so a new method
added here reaches all of them. "none" (the raw-parameter baseline) aligns nothing.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    name: str
    needs_data: bool  # matching reads training batches (activation statistics, a loss)
    space: str  # "raw" | "canonical": the parameters its linear path interpolates
    aligns: bool  # False only for "none": no alignment, model B as it is
    summary: str
    options: tuple[str, ...] = ()  # the keyword options of `lf.align` that change its result


_SOLVER = ("seed", "max_iter", "tol", "order")
_LEARNED = ("preset", "steps", "lr", "lam", "lambdas_per_step", "val_fraction", "eval_every", "patience", "head_map",
            "learn", "target", "temperature", "augment", "weight_decay", "warmup", "clip", "seed")
_ALL = (
    Method("none", False, "raw", False, "raw parameters, no alignment (the baseline every paper reports)"),
    Method("permutation", False, "raw", True,
           "Git Re-Basin weight matching of the residual, MLP and head permutations on raw parameters",
           _SOLVER + ("heads",)),
    Method("weight", False, "canonical", True, "weight matching over every Transformer symmetry group", _SOLVER),
    Method("activation", True, "canonical", True, "the same solvers on activation cross-covariances over data",
           ("max_batches",)),
    Method("learned", True, "canonical", True, "straight-through optimisation of the alignment on midpoint loss",
           _LEARNED),
)

#: name -> Method, in the order tables and plots list them
REGISTRY: dict[str, Method] = {m.name: m for m in _ALL}
#: every method name (the grid's and the demo's choices)
METHODS: tuple[str, ...] = tuple(REGISTRY)
#: the names `lf.align` accepts (everything that produces an Alignment)
ALIGN_METHODS: tuple[str, ...] = tuple(m.name for m in _ALL if m.aligns)


def method(name: str) -> Method:
    """The registry entry of `name`; ValueError naming the choices otherwise."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}") from None


def align_with(name: str, model_a, model_b, data=None, **options):
    """Run method `name` (options go to `lf.align`); None for "none". Data-free methods ignore `data`."""
    m = method(name)
    if not m.aligns:
        if options:
            raise ValueError(f"method 'none' takes no options, got {sorted(options)}")
        return None
    if m.needs_data and data is None:
        raise ValueError(f"method {name!r} needs data (training batches)")
    from .align import align

    return align(model_a, model_b, name, data=data if m.needs_data else None, **options)


__all__ = ["ALIGN_METHODS", "METHODS", "Method", "REGISTRY", "align_with", "method"]
