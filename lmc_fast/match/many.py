"""Aligning several models: all to one reference, or MergeMany ("each to the mean of the others")."""
from __future__ import annotations

import os

from ..models.adapters import adapter_for, check_compatible
from ..models.resize import widen_all
from ..symmetry import Alignment
from ..symmetry.elements import elements_equal
from .align import align
from .merge_rounds import merge_rounds
from .methods import PARAMETER_METHODS, method as method_entry
from .options import check_option
from .pair import params_pair


def merge_many(models, method: str = "weight", *, mode: str = "mean", rounds: int = 10, data=None, seed: int = 0,
               return_alignments: bool = False, progress: bool = False, dtype=None, out=None,
               distributed: bool | None = None):
    """Aligned copies of `models` (the first is the reference), ready for `interpolate` / `simplex`.

    mode="reference": align each model to models[0]. mode="mean" (MergeMany, data-free methods
    only): start there, then repeatedly re-align each model to the mean of the others until no
    element changes or `rounds` is reached. Models whose MLPs are narrower than the widest are
    zero-padded to it first (the returned copies all have the widest MLP).

    `models` may be checkpoint paths (our folders and files, Hugging Face folders; methods "weight",
    "permutation" and, in mode "reference", "activation"): they are then streamed a block at a time and never
    held whole (match/many_streamed.py), the same alignments as in memory, solved in `dtype` (default float64;
    float32 for large models, where MergeMany counts a map unchanged within 1e-5). Nothing is loaded, so the
    alignments are returned (alignments[i] maps model i onto the first, or onto the common mean); with `out`,
    model i aligned is written to out/aligned_<i> in its format and dtype and those folders are returned
    (with the alignments if `return_alignments`). The
    merge itself: `lmc_fast.stream.merge_paths(paths, folder, alignments)`. Under torchrun
    (`distributed`) weight and permutation matching split the layers across ranks; call it on every rank.
    """
    if len(models) < 2:
        raise ValueError("merge_many needs at least two models")
    paths = [isinstance(m, (str, os.PathLike)) for m in models]
    if any(paths) and not all(paths):
        raise ValueError("merge_many takes models in memory or checkpoint paths, not both")
    if not all(paths) and (out is not None or dtype is not None or distributed):
        raise ValueError("out, dtype and distributed are for checkpoint paths: models in memory are aligned in "
                         "float64 in one process and returned")
    if mode not in ("mean", "reference"):
        raise ValueError(f"mode must be 'mean' or 'reference', got {mode!r}")
    entry = method_entry(method)
    if mode == "mean" and entry.match_params is None:  # before any alignment is solved
        raise ValueError(f"mode='mean' needs a data-free method that matches parameters alone "
                         f"({' or '.join(map(repr, PARAMETER_METHODS))})")
    check_option("rounds", rounds)
    check_option("seed", seed)
    check_option("dtype", dtype)
    if all(paths):
        from .many_streamed import merge_many_paths

        return merge_many_paths(list(models), entry, mode=mode, rounds=rounds, data=data, seed=seed, dtype=dtype,
                                out=out, return_alignments=return_alignments, progress=progress,
                                distributed=distributed)
    for i, m in enumerate(models[1:], start=1):  # any MLP widths: all are padded to the widest
        check_compatible(models[0], m, f"models[{i}]", "models[0]", mlp="any")
    models = widen_all(models)
    seeded = {"seed": seed} if entry.accepts("seed") else {}
    alignments = [None] + [align(models[0], m, method, data=data, **seeded) for m in models[1:]]
    spec = alignments[1].spec
    originals = [params_pair(models[0], m, spec.space)[2] for m in models]
    alignments[0] = Alignment.identity(spec)
    current = [al.apply_params(p) for al, p in zip(alignments, originals)]

    def realign(i: int) -> bool:  # model i to the mean of the others as they are now
        others = [current[j] for j in range(len(models)) if j != i]
        target = {k: sum(p[k] for p in others) / len(others) for k in others[0]}
        elements, info = entry.match_params(spec, target, originals[i], seed=seed)
        changed = not elements_equal(spec, elements, alignments[i].elements)
        alignments[i] = Alignment(spec, elements, info)
        current[i] = alignments[i].apply_params(originals[i])
        return changed

    done_rounds = merge_rounds(len(models), rounds, seed, realign, progress) if mode == "mean" else 0
    out = [adapter_for(m).build(m, p) for m, p in zip(models, current)]
    for al in alignments:
        al.info["merge_rounds"] = done_rounds
    return (out, alignments) if return_alignments else out
