"""The one list of matching methods: name -> how it runs, which options it takes, whether it needs
data, where its linear path is swept.

    from lmc_fast.match.methods import METHODS, method
    from lmc_fast.match.align import align_with
    m = method("activation")           # Method(name="activation", needs_data=True, space="canonical", ...)
    al = align_with("weight", a, b)    # an Alignment, or None for "none"
    res = lf.barrier(a, al.apply(b) if al else b, test, space=m.space)

`lf.align` runs a method through its entry here and refuses options the method does not take;
MergeMany and the training monitor use `match_params` (matching on parameters alone); the demo,
the grid and the CLI iterate over the registry. A new method is one entry here (and its name in
method_names.py, which the CLI reads before torch loads). "none" (the raw-parameter baseline)
aligns nothing.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import activation, learned, streamed, weight


@dataclass(frozen=True)
class Method:
    name: str
    needs_data: bool  # matching reads training batches (activation statistics, a loss)
    space: str  # "raw" | "canonical": the parameters its linear path interpolates
    summary: str
    options: tuple[str, ...] = ()  # the keyword options of `lf.align` that change its result (grid specs set them)
    runtime: tuple[str, ...] = ()  # the options that only say how it runs (progress, device, checkpoints)
    # (model_a, model_b, data, **options) -> Alignment, B's MLPs already widened to A's; None: no alignment
    run: Callable | None = None
    # (spec, pa, pb, seed=) -> (elements, info): matching on parameters alone, no data and no models
    # (MergeMany's re-alignments to a mean, the training monitor); None where the method needs models or data
    match_params: Callable | None = None
    # (path_a, path_b, data, **options) -> Alignment: the same matching on two checkpoints streamed from disk,
    # a block at a time (match/streamed.py); None where the method needs the models in memory
    stream: Callable | None = None
    # options -> what else its result depends on that these options leave to the library (learned matching:
    # the settings of every preset they may resolve to), for the grid's keys; None: the options say it all
    settings: Callable | None = None

    @property
    def aligns(self) -> bool:
        """False only for "none": no alignment, model B as it is."""
        return self.run is not None

    def accepts(self, option: str) -> bool:
        return option in self.options or option in self.runtime

    def check_options(self, options: dict) -> None:
        """One line for the first option this method does not take, naming the methods that do."""
        for key in options:
            if self.accepts(key):
                continue
            takers = [m.name for m in _ALL if m.accepts(key)]
            if not takers:
                raise ValueError(f"unknown option {key!r}; method {self.name!r} takes "
                                 f"{', '.join(self.options + self.runtime) or 'no options'}")
            which = (f"method {takers[0]!r}" if len(takers) == 1 else
                     "methods " + ", ".join(map(repr, takers[:-1])) + f" and {takers[-1]!r}")
            raise ValueError(f"{key} is an option of {which}, not {self.name!r}")


_SOLVER = ("seed", "max_iter", "tol", "order", "weighting")
_LEARNED = ("preset", "steps", "lr", "lam", "lambdas_per_step", "val_fraction", "eval_every", "patience", "head_map",
            "learn", "sides", "target", "temperature", "augment", "weight_decay", "warmup", "clip", "seed")
_ALL = (
    Method("none", False, "raw", "raw parameters, no alignment (the baseline every paper reports)"),
    Method("permutation", False, "raw",
           "Git Re-Basin weight matching of the residual, MLP and head permutations on raw parameters",
           _SOLVER + ("heads",), ("progress", "dtype", "distributed"), weight.align_by_permutations,
           weight.weight_matching, streamed.streamed_by_permutations),
    Method("weight", False, "canonical", "weight matching over every Transformer symmetry group",
           _SOLVER + ("token_counts",), ("progress", "dtype", "distributed"), weight.align_by_weights,
           weight.weight_matching,
           streamed.streamed_by_weights),
    Method("activation", True, "canonical", "the same solvers on activation cross-covariances over data",
           ("max_batches", "residual_only"), ("progress", "dtype"), activation.align_by_activations,
           stream=streamed.streamed_by_activations),
    Method("learned", True, "canonical", "straight-through optimisation of the alignment on midpoint loss",
           _LEARNED, ("progress", "init", "device", "checkpoint", "checkpoint_every"), learned.learned_matching,
           settings=learned.resolved_settings),
)

#: name -> Method, in the order tables and plots list them
REGISTRY: dict[str, Method] = {m.name: m for m in _ALL}
#: every method name (the grid's and the demo's choices)
METHODS: tuple[str, ...] = tuple(REGISTRY)
#: the names `lf.align` accepts (everything that produces an Alignment)
ALIGN_METHODS: tuple[str, ...] = tuple(m.name for m in _ALL if m.aligns)
#: the methods that match parameters alone (MergeMany's mean mode, the training monitor)
PARAMETER_METHODS: tuple[str, ...] = tuple(m.name for m in _ALL if m.match_params is not None)


def method(name: str) -> Method:
    """The registry entry of `name`; ValueError naming the choices otherwise."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r}; choose from {', '.join(METHODS)}") from None


__all__ = ["ALIGN_METHODS", "METHODS", "Method", "PARAMETER_METHODS", "REGISTRY", "method"]
