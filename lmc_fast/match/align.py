"""`align(model_a, model_b, method=...)`: the one entry point over every matching method."""
from __future__ import annotations

import os

from ..models.adapters import adapter_for, check_compatible
from ..models.resize import widen_mlp_to
from ..symmetry import Alignment, model_fingerprint
from .methods import ALIGN_METHODS as METHODS  # the registry (match/methods.py) lists them
from .methods import REGISTRY, method as method_entry
from .options import check_options
from .pair import params_pair  # noqa: F401  (its old home: `from lmc_fast.match.align import params_pair`)


def align(model_a, model_b, method: str = "weight", data=None, *, progress: bool = False, **options) -> Alignment:
    """The alignment g with g . model_b as close to model_a as the method can make it.

    - "weight": generalized weight matching over every symmetry group (data-free); options
      seed, max_iter (100), tol (1e-4), order ("structured" | "random"), weighting, token_counts;
    - "permutation": Git Re-Basin weight matching on raw parameters (the baseline): the
      residual, MLP units and whole heads permuted; `heads=False` leaves attention alone;
      the solver options of "weight" but token_counts;
    - "activation": the same solvers on activation cross-covariances over `data` (max_batches);
    - "learned": straight-through optimisation of the alignment on the task loss of the
      midpoints (needs `data`), initialised at weight matching. Options go to
      `learned_matching`: steps, lr, lam ("narrow" | "uniform" | "mixed" | "fixed" | a number),
      lambdas_per_step, target ("labels" | "endpoints"), temperature, augment (e.g.
      `lmc_fast.data.augment.Mixup(1.0)` with target="endpoints"), learn, head_map, init,
      eval_every, patience, val_fraction, device, checkpoint (a file: a killed run resumes exactly),
      checkpoint_every.

    `weighting` ("sum" default | "per_tensor" | "sqrt") weighs the parameters in the objective of
    "weight" and "permutation" (see match/weight.py `weighted_reference`). `token_counts`
    (method "weight", language models): the token-frequency prior, a vocab-length counts vector
    or (inputs, targets) batches whose input ids are counted (see match/weight.py `token_weights`).
    `dtype` (torch.float64 default, or torch.float32; not "learned"): the solvers' precision.
    An option the method does not take is refused in one line naming the methods that take it.

    A model_b whose MLPs are narrower than model_a's (all else equal) is zero-padded first;
    apply the result to the narrow model_b as usual (`al.apply(model_b)` pads it too).

    `model_a` and `model_b` may be checkpoint paths (our folders and files, Hugging Face folders, sharded
    or not) for "weight", "permutation" and "activation": the checkpoints are then streamed, a layer at a
    time, and never held whole (lmc_fast.stream); the result is the in-memory one.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    m = REGISTRY[method]
    m.check_options(options)  # the method's own options only: nothing is silently ignored
    check_options(options)  # every value by its one rule (options.py), before any work
    if m.needs_data and data is None:
        raise ValueError(f"data is required: method {method!r} reads training batches")
    paths = [isinstance(x, (str, os.PathLike)) for x in (model_a, model_b)]
    if any(paths):
        if not all(paths):
            raise ValueError("model_a and model_b must be both models or both checkpoint paths")
        if m.stream is None:
            raise ValueError(f"method {method!r} needs both models in memory: load them with "
                             "lmc_fast.io.load_model (methods 'weight', 'permutation' and 'activation' stream "
                             "checkpoint paths)")
        return m.stream(model_a, model_b, data if m.needs_data else None, progress=progress, **options)
    check_compatible(model_a, model_b)  # names the first differing field; B may be narrower
    # fingerprints of the models as passed (before widening): `verify_models` checks them later
    fingerprints = {"fingerprint_a": model_fingerprint(model_a), "fingerprint_b": model_fingerprint(model_b)}
    # A narrower MLP in B is zero-padded to A's width (function-preserving); the assignment
    # then leaves the zero units on A's unmatched units (models/resize.py).
    model_b = widen_mlp_to(adapter_for(model_a).arch(model_a), model_b)
    al = m.run(model_a, model_b, data if m.needs_data else None, progress=progress, **options)
    al.info.update(fingerprints)
    return al


def align_with(name: str, model_a, model_b, data=None, **options):
    """Run method `name` (options go to `lf.align`); None for "none". Data-free methods ignore `data`."""
    m = method_entry(name)
    if not m.aligns:
        if options:
            raise ValueError(f"method 'none' takes no options, got {sorted(options)}")
        return None
    if m.needs_data and data is None:
        raise ValueError(f"method {name!r} needs data (training batches)")
    return align(model_a, model_b, name, data=data if m.needs_data else None, **options)
