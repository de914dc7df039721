"""`align(model_a, model_b, method=...)`: the one entry point over every matching method."""
from __future__ import annotations

import torch

from ..models.adapters import adapter_for, check_compatible, standard_params
from ..models.resize import widen_mlp_to
from ..symmetry import Alignment, check_same_arch, model_fingerprint, prepare_params, spec_for
from ..sweep.batches import Checked
from ..sweep.checks import spec_from_params
from .options import check_options
from .methods import ALIGN_METHODS as METHODS  # the registry (match/methods.py) lists them


def _progress(enabled: bool, desc: str, total=None):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc)


def params_pair(model_a, model_b, space: str, heads: bool = True, dtype=torch.float64):
    """(spec, A's and B's parameters in the spec's space and `dtype`); one model's raw copy at a time."""
    check_compatible(model_a, model_b, mlp="equal")  # every config field, not only the Arch
    arch_a, raw = standard_params(model_a)
    spec = spec_for(arch_a, space, heads=heads)
    pa = prepare_params(spec, arch_a, raw, dtype)
    arch_b, raw = standard_params(model_b)
    check_same_arch(arch_a, arch_b, "model_b")
    return spec, pa, prepare_params(spec, arch_b, raw, dtype)


def align(model_a, model_b, method: str = "weight", data=None, *, seed: int = 0, max_iter: int = 100,
          tol: float = 1e-4, order: str = "structured", max_batches: int | None = None,
          progress: bool = False, heads: bool | None = None, weighting: str | None = None,
          token_counts=None, dtype=None, **learned_kw) -> Alignment:
    """The alignment g with g . model_b as close to model_a as the method can make it.

    - "weight": generalized weight matching over every symmetry group (data-free);
    - "permutation": Git Re-Basin weight matching on raw parameters (the baseline): the
      residual, MLP units and whole heads permuted; `heads=False` leaves attention alone;
    - "activation": the same solvers on activation cross-covariances over `data`;
    - "learned": straight-through optimisation of the alignment on the task loss of the
      midpoints (needs `data`), initialised at weight matching. Keyword options go to
      `learned_matching`: steps, lr, lam ("narrow" | "uniform" | "fixed" | a number),
      lambdas_per_step, target ("labels" | "endpoints"), temperature, augment (e.g.
      `lmc_fast.data.augment.Mixup(1.0)` with target="endpoints"), learn, head_map, init,
      eval_every, patience, val_fraction, device, checkpoint (a file: a killed run resumes exactly),
      checkpoint_every.

    `weighting` ("sum" default | "per_tensor") weighs the parameters in the objective of
    "weight" and "permutation" (see match/weight.py `weighted_reference`). `token_counts`
    (method "weight", language models): the token-frequency prior, a vocab-length counts vector
    or (inputs, targets) batches whose input ids are counted (see match/weight.py `token_weights`).

    A model_b whose MLPs are narrower than model_a's (all else equal) is zero-padded first;
    apply the result to the narrow model_b as usual (`al.apply(model_b)` pads it too).
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if heads is not None and method != "permutation":
        raise ValueError(f"heads is an option of method 'permutation', not {method!r}")
    if weighting is not None and method not in ("weight", "permutation"):
        raise ValueError(f"weighting is an option of methods 'weight' and 'permutation', not {method!r}")
    if token_counts is not None and method != "weight":
        raise ValueError(f"token_counts is an option of method 'weight', not {method!r}")
    if dtype is not None and method == "learned":
        raise ValueError("dtype is an option of methods 'weight', 'permutation' and 'activation', not 'learned'")
    if dtype not in (None, torch.float32, torch.float64):
        raise ValueError(f"dtype must be torch.float32 or torch.float64, got {dtype!r}")
    # every option by its one rule (options.py), before any work
    check_options(dict(seed=seed, max_iter=max_iter, tol=tol, order=order, max_batches=max_batches, heads=heads,
                       weighting=weighting, **learned_kw))
    check_compatible(model_a, model_b)  # names the first differing field; B may be narrower
    # fingerprints of the models as passed (before widening): `verify_models` checks them later
    fingerprints = {"fingerprint_a": model_fingerprint(model_a), "fingerprint_b": model_fingerprint(model_b)}
    al = _match(model_a, model_b, method, data, seed=seed, max_iter=max_iter, tol=tol, order=order,
                max_batches=max_batches, progress=progress, heads=heads, weighting=weighting or "sum",
                token_counts=token_counts, dtype=dtype or torch.float64, **learned_kw)
    al.info.update(fingerprints)
    return al


def _match(model_a, model_b, method, data, *, seed, max_iter, tol, order, max_batches, progress, heads=None,
           weighting="sum", token_counts=None, dtype=torch.float64, **learned_kw):
    # A narrower MLP in B is zero-padded to A's width (function-preserving); the assignment
    # then leaves the zero units on A's unmatched units (models/resize.py).
    model_b = widen_mlp_to(adapter_for(model_a).arch(model_a), model_b)
    if method == "permutation":
        from .weight import weight_matching

        spec, pa, pb = params_pair(model_a, model_b, "raw", heads=heads is not False, dtype=dtype)
        bar = _progress(progress, "permutation matching", max_iter)
        elements, info = weight_matching(spec, pa, pb, max_iter=max_iter, tol=tol, order=order, seed=seed,
                                         weighting=weighting, progress=bar)
        info["method"] = "permutation"
        info["heads"] = heads is not False
    elif method == "weight":
        from .weight import weight_matching

        spec, pa, pb = params_pair(model_a, model_b, "canonical", dtype=dtype)
        bar = _progress(progress, "weight matching", max_iter)
        elements, info = weight_matching(spec, pa, pb, max_iter=max_iter, tol=tol, order=order, seed=seed,
                                         weighting=weighting, token_counts=token_counts, progress=bar)
    elif method == "activation":
        from .activation import activation_matching

        spec, pa, pb = params_pair(model_a, model_b, "canonical", dtype=dtype)
        bar = _progress(progress, "activation statistics")
        batches = Checked(data, spec_from_params(spec.arch, pa))  # as lf.barrier checks them
        elements, info = activation_matching(spec, pa, pb, batches, max_batches=max_batches, progress=bar)
    else:
        from .learned import learned_matching

        return learned_matching(model_a, model_b, data, seed=seed, progress=progress, **learned_kw)
    if bar is not None:
        bar.close()
    if dtype != torch.float64:  # solved in float32: the nearest exact group elements, in float64
        from ..symmetry import elements as E

        elements = {n: E.snap(g, elements[n]) for n, g in spec.groups.items()}
        info["dtype"] = str(dtype).removeprefix("torch.")
    return Alignment(spec, elements, info)
