"""Weight matching (data-free): coordinate ascent on sum_p <theta_A, g . theta_B>.

Git Re-Basin visits groups in random order and can need hundreds of sweeps on Transformers,
because the residual rotation couples every group. Here the structure is used instead:
- given the residual element, the layer-local groups (heads.l, mlp.l) touch disjoint
  parameters, so all of them are solved exactly and at once (batched across layers);
- given those, the residual group is solved exactly;
- the residual starts from the "anchor" parameters no other group touches (embeddings,
  positions, the head), which pins it down before the first sweep.
Each step maximises the objective over one block exactly, so it never decreases.
"""
from __future__ import annotations

import dataclasses
import random
import time

import torch

from ..numerics import all_finite
from ..symmetry import Alignment
from ..symmetry.elements import apply_spec, identity
from ..symmetry.spec import Spec
from . import solve
from .kinds import matcher_of, solve_groups


def solve_layer_groups(spec: Spec, pa: dict, pb_r: dict, elements: dict, names: list[str], freeze_perms: bool = False,
                 warm: dict | None = None):
    """Solve the given layer-local groups given B with the residual element applied, each run of one
    kind and shape in one batched call (its matcher's). With `freeze_perms`, permutations stay and
    only the per-head maps are re-solved. `warm` carries assignment prices from sweep to sweep."""
    stats = {n: matcher_of(spec.groups[n]).correlation(spec.groups[n], pa, pb_r) for n in names}
    solve_groups(spec, names, stats, elements, warm=warm, frozen=freeze_perms)


def _residual_step(spec: Spec, pa: dict, pb: dict, elements: dict, rest: list[str], warm: dict | None = None) -> float:
    """Solve the residual group given the others and return the full objective, read off the
    residual's own correlation: sum over its axes of <A, M . B'> = sum(M * C) (or sum_i
    C[i, perm[i]]), plus the parameters it does not touch. Saves one transform of every
    parameter per sweep."""
    group = spec.groups[spec.residual]
    m = matcher_of(group)
    pb_other = apply_spec(spec, pb, elements, skip={spec.residual})
    C = m.correlation(group, pa, pb_other)
    elements[spec.residual] = m.solve([group], [C], warm=warm, key=spec.residual)[0]
    return m.value(group, C, elements[spec.residual]) + solve.objective(pa, pb_other, rest)


def _anchor_residual(spec: Spec, pa: dict, pb: dict):
    res = spec.groups[spec.residual]
    local = {ax.param for g in spec.groups.values() if g.layer_local for ax in g.axes}
    anchor = dataclasses.replace(res, axes=tuple(ax for ax in res.axes if ax.param not in local))
    if not anchor.axes:
        return None
    C = solve.correlation(anchor, pa, pb)
    if not all_finite(C) or C.abs().max() == 0:
        return None
    return matcher_of(anchor).solve([anchor], [C])[0]


def _polish(spec: Spec, pa: dict, pb: dict, elements: dict, local: list[str], rest: list[str],
            polish_iter: int, polish_tol: float) -> tuple[int, float]:
    """Alternate the per-head maps and the residual rotation with every permutation frozen.

    With the permutations fixed, everything outside the attention blocks contributes a
    constant to the residual correlation and to the objective: both are computed once, and
    each iteration transforms and correlates only the attention parameters (a third of
    GPT-2's residual-touching weights), instead of the whole model."""
    res = spec.groups[spec.residual]
    heads = [n for n in local if matcher_of(spec.groups[n]).has_maps(spec.groups[n])]  # the per-head maps
    moving = {ax.param for n in heads for ax in spec.groups[n].axes}
    fixed_axes = tuple(ax for ax in res.axes if ax.param not in moving)
    moving_res = dataclasses.replace(res, axes=tuple(ax for ax in res.axes if ax.param in moving))
    rest_fixed = [p for p in rest if p not in moving]
    rest_moving = [p for p in rest if p in moving]  # e.g. query biases: head maps, no residual axis
    pb_fixed = apply_spec(spec, {p: pb[p] for p in {ax.param for ax in fixed_axes} | set(rest_fixed)}, elements,
                          skip={spec.residual})
    C_fixed = solve.correlation(dataclasses.replace(res, axes=fixed_axes), pa, pb_fixed) if fixed_axes else 0.0
    value_fixed = solve.objective(pa, pb_fixed, rest_fixed)
    pb_moving = {p: pb[p] for p in moving}
    polished, value = 0, float("nan")
    for polished in range(1, polish_iter + 1):
        before = {n: dict(e) for n, e in elements.items()}
        if heads:
            solve_layer_groups(spec, pa, apply_spec(spec, pb_moving, elements, skip=set(local)), elements, heads,
                         freeze_perms=True)
        pb_other = apply_spec(spec, pb_moving, elements, skip={spec.residual})
        C = C_fixed + solve.correlation(moving_res, pa, pb_other) if moving_res.axes else C_fixed
        m = matcher_of(res)
        elements[spec.residual] = m.solve([res], [C])[0]
        value = m.value(res, C, elements[spec.residual]) + value_fixed + solve.objective(pa, pb_other, rest_moving)
        if _max_change(spec, before, elements) < polish_tol:
            break
    return polished, value


def _max_change(spec: Spec, old: dict, new: dict) -> float:
    out = 0.0
    for n, g in spec.groups.items():
        for key, t in new[n].items():
            if t.is_floating_point():
                out = max(out, (t - old[n][key]).abs().max().item())
    return out


WEIGHTINGS = ("sum", "per_tensor", "sqrt")
INITS = ("anchor", "anchor_per_tensor", "identity")


# parameters whose rows are indexed by token id (standard params): the token-frequency prior
# weighs these rows. The head's rows count too: its targets follow the same token distribution.
TOKEN_ROW_PARAMS = ("tok_embed.weight", "lm_head.weight")


def _as_counts(token_counts, vocab: int) -> torch.Tensor:
    """A counts vector as given, or the bincount of the input ids of (inputs, targets) batches."""
    if isinstance(token_counts, torch.Tensor):
        return token_counts
    if hasattr(token_counts, "__array__"):  # numpy and the like
        return torch.as_tensor(token_counts)
    try:
        batches = iter(token_counts)
    except TypeError:
        raise ValueError(f"token_counts must be a 1-D counts vector or (inputs, targets) batches, "
                         f"got {type(token_counts).__name__}") from None
    counts, seen = torch.zeros(vocab, dtype=torch.int64), False
    for batch in batches:
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2 and isinstance(batch[0], torch.Tensor)
                and not batch[0].is_floating_point() and not batch[0].is_complex()):
            raise ValueError("token_counts batches must be (inputs, targets) with integer token-id inputs")
        ids = batch[0].reshape(-1).long().cpu()
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
            raise ValueError(f"token_counts batches hold token ids outside [0, {vocab})")
        counts += torch.bincount(ids, minlength=vocab)
        seen = True
    if not seen:
        raise ValueError("token_counts batches are empty")
    return counts


def token_weights(token_counts, pa: dict) -> torch.Tensor:
    """Per-token weights counts / mean(counts) (float64, mean 1) for the token-frequency prior.

    Uniform counts give exactly 1 everywhere, i.e. the unweighted objective."""
    if "tok_embed.weight" not in pa:
        raise ValueError("token_counts needs a language model (no tok_embed.weight among its parameters)")
    vocab = pa["tok_embed.weight"].shape[0]
    counts = _as_counts(token_counts, vocab)
    if counts.dim() != 1 or len(counts) != vocab:
        raise ValueError(f"token_counts must be a 1-D vector of length vocab_size={vocab}, got shape "
                         f"{tuple(counts.shape)}")
    if counts.is_complex() or counts.dtype == torch.bool:
        raise ValueError(f"token_counts must be real numbers, got {counts.dtype}")
    counts = counts.to(torch.float64)
    if not all_finite(counts) or bool((counts < 0).any()) or not bool((counts > 0).any()):
        raise ValueError("token_counts must be finite, non-negative and not all zero")
    if bool((counts == counts[0]).all()):
        return torch.ones_like(counts)  # exactly the unweighted objective, free of rounding
    return counts * (vocab / counts.sum())


def _with_token_prior(pa: dict, weights: torch.Tensor) -> dict:
    """A's token-indexed rows scaled by the token weights: <w * A_p, g.B_p> = sum_t w_t <A_t, (g.B)_t>,
    still linear in g.B, so every solver works unchanged."""
    out = dict(pa)
    for n in TOKEN_ROW_PARAMS:
        if n in pa and pa[n].shape[0] == len(weights):
            out[n] = pa[n] * weights.to(pa[n].dtype)[:, None]
    return out


def weighted_reference(pa: dict, pb: dict, weighting: str, token_weights: torch.Tensor | None = None) -> dict:
    """A's parameters scaled so that sum_p <A'_p, g.B_p> is the chosen objective.

    "sum": sum_p <A_p, g.B_p> (A unchanged): the largest tensors dominate, and on the ViT
    the embeddings that fix the residual basis weigh under 1% of it. "per_tensor": each term
    divided by ||A_p|| ||B_p||, a sum of cosines where every tensor counts equally; "sqrt":
    divided by sqrt(||A_p|| ||B_p||), halfway between the two on a log scale. The norms
    are taken once, at g = identity (orthogonal maps and permutations keep them), so the
    objective stays linear in g.B and every solver works on it unchanged. `token_weights`
    (see `token_weights`) then scale the rows of the token embedding and LM head."""
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if token_weights is not None:
        return _with_token_prior(weighted_reference(pa, pb, weighting), token_weights)
    if weighting == "sum":
        return pa
    out = {}
    for n, a in pa.items():
        scale = a.norm() * pb[n].norm()
        scale = scale.sqrt() if weighting == "sqrt" else scale
        out[n] = a / scale if scale > 0 else torch.zeros_like(a)  # a zero tensor adds nothing either way
    return out


def weight_matching(spec: Spec, pa: dict, pb: dict, *, max_iter: int = 100, tol: float = 1e-4,
                    order: str = "structured", seed: int = 0, init: str = "anchor", polish_iter: int = 10,
                    polish_tol: float = 1e-9, weighting: str = "sum", token_counts=None, progress=None):
    """Elements mapping B onto A, and info (objective per sweep, iterations, seconds).

    `pa`, `pb`: float64 parameters in the spec's space. Sweeps stop once the objective rises
    by less than `tol` (relative); then up to `polish_iter` cheap sweeps with every permutation
    frozen refine the continuous maps (residual rotation, per-head maps) until they move by
    less than `polish_tol`: the coupled rotations converge only linearly, and this makes a
    planted symmetry come back to ~1e-9 without paying for assignments. `order="random"` is
    Git Re-Basin's schedule (random group order every sweep), kept as the baseline.
    `weighting` ("sum" | "per_tensor" | "sqrt", see `weighted_reference`) weighs the parameters
    in the objective; the reported objective is the weighted one. `init`: "anchor" (the
    residual solved on the anchor parameters first), "anchor_per_tensor" (the same with every
    anchor tensor counted equally) or "identity". `token_counts` (a vocab-length counts vector
    or (inputs, targets) batches, see `token_weights`): the token-frequency prior, weighting the
    token embedding's and LM head's rows by how often each token occurs (None: no prior).
    """
    if order not in ("structured", "random"):
        raise ValueError(f"order must be 'structured' or 'random', got {order!r}")
    if init not in INITS:
        raise ValueError(f"init must be one of {INITS}, got {init!r}")
    # "anchor_per_tensor": the anchor start with each anchor tensor counted equally (the
    # ViT's embeddings otherwise weigh little next to its head), then the chosen objective
    prior = token_weights(token_counts, pa) if token_counts is not None else None
    anchor_ref = weighted_reference(pa, pb, "per_tensor" if init == "anchor_per_tensor" else weighting, prior)
    pa = weighted_reference(pa, pb, weighting, prior)
    t0 = time.perf_counter()
    names = list(pa)
    elements = {n: identity(g, pa[g.axes[0].param].dtype) for n, g in spec.groups.items()}
    objective_identity = solve.objective(pa, pb, names)
    if init != "identity" and spec.residual is not None:
        start = _anchor_residual(spec, anchor_ref, pb)
        if start is not None:
            elements[spec.residual] = start
    history = [solve.objective(pa, apply_spec(spec, pb, elements), names)]
    local = [n for n, g in spec.groups.items() if g.layer_local]
    residual_params = {ax.param for ax in spec.groups[spec.residual].axes} if spec.residual is not None else set()
    rest = [n for n in names if n not in residual_params]
    rng = random.Random(seed)
    warm = {}  # assignment prices per group, carried from sweep to sweep
    it = 0
    for it in range(1, max_iter + 1):
        if order == "structured":
            pb_r = apply_spec(spec, pb, elements, skip=set(local))
            solve_layer_groups(spec, pa, pb_r, elements, local, warm=warm)
            if spec.residual is not None:
                value = _residual_step(spec, pa, pb, elements, rest, warm)
            else:
                value = solve.objective(pa, apply_spec(spec, pb, elements), names)
        else:
            group_names = list(spec.groups)
            rng.shuffle(group_names)
            for n in group_names:
                touched = {ax.param for ax in spec.groups[n].axes}
                sub = apply_spec(spec, {p: pb[p] for p in touched}, elements, skip={n})
                group = spec.groups[n]
                elements[n] = matcher_of(group).solve([group], [matcher_of(group).correlation(group, pa, sub)],
                                                      warm=warm, key=n)[0]
            value = solve.objective(pa, apply_spec(spec, pb, elements), names)
        history.append(value)
        if progress is not None:
            progress.set_postfix(objective=f"{history[-1]:.6g}")
            progress.update(1)
        if history[-1] - history[-2] <= tol * abs(history[-1]):
            break
    polished = 0
    if (order == "structured" and polish_iter > 0 and spec.residual is not None
            and matcher_of(spec.groups[spec.residual]).has_maps(spec.groups[spec.residual])):
        polished, value = _polish(spec, pa, pb, elements, local, rest, polish_iter, polish_tol)
        history.append(value)
    info = {"method": "weight", "order": order, "weighting": weighting, "init": init,
            "token_prior": prior is not None, "iterations": it, "polish_iterations": polished, "objective": history,
            "objective_identity": objective_identity,
            "seconds": time.perf_counter() - t0}
    return elements, info


def _align(model_a, model_b, space: str, heads: bool, dtype, progress: bool, **options) -> Alignment:
    from .pair import params_pair, progress_bar, solved_alignment

    dtype = dtype or torch.float64
    spec, pa, pb = params_pair(model_a, model_b, space, heads=heads, dtype=dtype)
    bar = progress_bar(progress, "weight matching" if space == "canonical" else "permutation matching",
                       options["max_iter"])
    elements, info = weight_matching(spec, pa, pb, progress=bar, **options)
    if bar is not None:
        bar.close()
    if space == "raw":
        info["method"], info["heads"] = "permutation", heads
    return solved_alignment(spec, elements, info, dtype)


def align_by_weights(model_a, model_b, data=None, *, dtype=None, progress: bool = False, seed: int = 0,
                     max_iter: int = 100, tol: float = 1e-4, order: str = "structured", weighting: str | None = None,
                     token_counts=None) -> Alignment:
    """Method "weight" on two models: weight matching of every group in canonical space."""
    return _align(model_a, model_b, "canonical", True, dtype, progress, seed=seed, max_iter=max_iter, tol=tol,
                  order=order, weighting=weighting or "sum", token_counts=token_counts)


def align_by_permutations(model_a, model_b, data=None, *, heads: bool | None = True, dtype=None,
                          progress: bool = False, seed: int = 0, max_iter: int = 100, tol: float = 1e-4,
                          order: str = "structured", weighting: str | None = None) -> Alignment:
    """Method "permutation" on two models: Git Re-Basin's weight matching on raw parameters, permuting
    the residual, MLP units and, unless `heads` is False, whole heads."""
    heads = heads is not False
    return _align(model_a, model_b, "raw", heads, dtype, progress, seed=seed, max_iter=max_iter, tol=tol,
                  order=order, weighting=weighting or "sum")
