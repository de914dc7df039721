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
from typing import NamedTuple

import torch

from ..numerics import all_finite
from ..symmetry import Alignment
from ..symmetry.elements import Transformed, apply_spec, identity
from ..symmetry.spec import Spec
from . import solve
from .kinds import matcher_of, solve_groups
from .weighting import TOKEN_ROW_PARAMS, WEIGHTINGS, token_weights, weighted_reference  # noqa: F401 (re-exported)


def solve_layer_groups(spec: Spec, pa: dict, pb_r: dict, elements: dict, names: list[str], freeze_perms: bool = False,
                 warm: dict | None = None):
    """Solve the given layer-local groups given B with the residual element applied, each run of one
    kind and shape in one batched call (its matcher's). With `freeze_perms`, permutations stay and
    only the per-head maps are re-solved. `warm` carries assignment prices from sweep to sweep."""
    stats = {n: matcher_of(spec.groups[n]).correlation(spec.groups[n], pa, pb_r) for n in names}
    solve_groups(spec, names, stats, elements, warm=warm, frozen=freeze_perms)


def disjoint_rounds(spec: Spec, names: list[str]) -> list[list[str]]:
    """`names` split into rounds of groups that touch no parameter in common (greedily, in order). The
    layer groups of a Transformer are all disjoint: one round. DiT's conditioning channels and its timestep
    MLP's hidden units share t_embed.fc2: two rounds, the second solved given the first's new element."""
    rounds: list[tuple[list[str], set]] = []
    for n in names:
        params = {ax.param for ax in spec.groups[n].axes}
        for members, used in rounds:
            if not params & used:
                members.append(n)
                used |= params
                break
        else:
            rounds.append(([n], set(params)))
    return [members for members, _ in rounds]


def solve_local_rounds(spec: Spec, pa: dict, pb: dict, elements: dict, names: list[str], act=apply_spec,
                       warm: dict | None = None, freeze_perms: bool = False) -> None:
    """Each round of `disjoint_rounds` solved exactly given B moved by every other group's current element."""
    for members in disjoint_rounds(spec, names):
        solve_layer_groups(spec, pa, act(spec, pb, elements, skip=set(members)), elements, members, warm=warm,
                           freeze_perms=freeze_perms)


class Piece(NamedTuple):
    """Part of a pair of models that the steps below can take on its own: A's parameters weighted as the
    objective weighs them (`a`), B's (`b`), and A weighted for the anchor start (`anchor`, when asked).
    Every layer-local group lies inside one piece; the residual's statistics are sums over pieces."""

    a: dict
    b: dict
    anchor: dict | None = None


class InMemoryPair:
    """Both models in memory: a single piece (so every layer's groups are solved in one batched call).

    A source of pieces also says how its statistics add up across processes: `reduce` (a sum over ranks of
    a tensor or number), `reduce_max`, and `share` (each layer group's element from the rank that solved
    it); here, in one process, all three are the identity."""

    def __init__(self, ref: dict, pb: dict, anchor_ref: dict):
        self.ref, self.pb, self.anchor_ref = ref, pb, anchor_ref
        self.dtype = ref[next(iter(ref))].dtype

    def reduce(self, x):
        return x

    def reduce_max(self, x: float) -> float:
        return x

    def share(self, elements: dict) -> None:
        pass

    def pieces(self, names=None, anchor: bool = False):
        """The one piece; `names` (a predicate on parameter names) keeps only some parameters."""
        pick = (lambda d: d) if names is None else (lambda d: {n: t for n, t in d.items() if names(n)})
        yield Piece(pick(self.ref), pick(self.pb), pick(self.anchor_ref) if anchor else None)


def _within(group, params):
    """`group` restricted to its axes on `params` (None when it has none there)."""
    axes = tuple(ax for ax in group.axes if ax.param in params)
    return dataclasses.replace(group, axes=axes) if axes else None


def _add(total, term):
    return term if total is None else total + term


def _action(source):
    """How a piece's B is moved by the current elements: all tensors at once (in memory: the batched
    transforms, fastest), or one tensor at a time on access where the source streams (`lazy`): the same
    values without a transformed copy of the whole block resident."""
    return Transformed if getattr(source, "lazy", False) else apply_spec


def _residual_terms(res, pa: dict, pb_moved, residual_params: set) -> tuple:
    """One piece's share of the residual's correlation (None where it holds none of its axes) and of the
    objective over the parameters the residual does not touch, B moved by every other group."""
    part = _within(res, pa)
    C = solve.correlation(part, pa, pb_moved) if part is not None else None
    return C, solve.objective(pa, pb_moved, [p for p in pa if p not in residual_params])


def _zeros_if_none(C, group, dtype):
    """A rank whose pieces hold none of the group's axes adds a zero statistic."""
    return torch.zeros(group.size, group.size, dtype=dtype) if C is None else C


def _local_in(spec: Spec, local: list[str], piece: dict) -> list[str]:
    return [n for n in local if spec.groups[n].axes[0].param in piece]


def _anchor_residual(spec: Spec, source) -> tuple:
    """(the residual solved on the anchor parameters no other group touches or None, the objective at
    the identity), in one pass: the anchor pins the residual down before the first sweep."""
    res = spec.groups[spec.residual] if spec.residual is not None else None
    local = {ax.param for g in spec.groups.values() if g.layer_local for ax in g.axes}
    C, value = None, 0.0
    for piece in source.pieces(anchor=res is not None):
        value += solve.objective(piece.a, piece.b, piece.a)
        if res is None:
            continue
        part = _within(res, [p for p in piece.anchor if p not in local])
        if part is not None:
            C = _add(C, solve.correlation(part, piece.anchor, piece.b))
        piece = None  # dropped before the next piece is read
    value = source.reduce(value)
    if res is not None:
        C = source.reduce(_zeros_if_none(C, res, source.dtype))
    if C is None or not all_finite(C) or C.abs().max() == 0:
        return None, value
    anchor = dataclasses.replace(res, axes=tuple(ax for ax in res.axes if ax.param not in local))
    return matcher_of(anchor).solve([anchor], [C])[0], value


def _sweep(spec: Spec, source, elements: dict, local: list[str], residual_params: set, warm: dict,
           first: bool) -> tuple[float, float | None]:
    """One structured sweep, one pass over the pieces: each piece's layer-local groups solved exactly
    given the residual element, then their pieces' correlation with the residual summed, then the
    residual solved exactly. Returns (objective after the sweep, objective before it when `first`).
    The objective is read off the residual's own correlation: sum over its axes of <A, M . B'> =
    sum(M * C) (or sum_i C[i, perm[i]]), plus the parameters it does not touch."""
    res = spec.residual
    C, value, before = None, 0.0, 0.0
    act = _action(source)
    for piece in source.pieces():
        if first:  # the local groups are still the identity
            before += solve.objective(piece.a, act(spec, piece.b, elements, skip=set(local)), piece.a)
        solve_local_rounds(spec, piece.a, piece.b, elements, _local_in(spec, local, piece.a), act, warm)
        if res is None:
            value += solve.objective(piece.a, act(spec, piece.b, elements), piece.a)
            continue
        term, rest = _residual_terms(spec.groups[res], piece.a, act(spec, piece.b, elements, skip={res}),
                                     residual_params)
        C, value = _add(C, term) if term is not None else C, value + rest
        piece = term = None  # dropped before the next piece is read, not after
    value, before = source.reduce(value), source.reduce(before)
    if res is not None:
        group = spec.groups[res]
        m = matcher_of(group)
        C = source.reduce(_zeros_if_none(C, group, source.dtype))
        elements[res] = m.solve([group], [C], warm=warm, key=res)[0]
        value += m.value(group, C, elements[res])
    return value, (before if first else None)


def _polish(spec: Spec, source, elements: dict, local: list[str], residual_params: set,
            polish_iter: int, polish_tol: float) -> tuple[int, float]:
    """Alternate the per-head maps and the residual rotation with every permutation frozen.

    With the permutations fixed, everything outside the attention blocks contributes a
    constant to the residual correlation and to the objective: both are computed once, and
    each iteration transforms and correlates only the attention parameters (a third of
    GPT-2's residual-touching weights), instead of the whole model."""
    res = spec.groups[spec.residual]
    m = matcher_of(res)
    heads = [n for n in local if matcher_of(spec.groups[n]).has_maps(spec.groups[n])]  # the per-head maps
    moving = {ax.param for n in heads for ax in spec.groups[n].axes}
    C_fixed, value_fixed = None, 0.0
    act = _action(source)
    for piece in source.pieces(names=lambda p: p not in moving):
        term, rest = _residual_terms(res, piece.a, act(spec, piece.b, elements, skip={spec.residual}),
                                     residual_params)
        C_fixed, value_fixed = _add(C_fixed, term) if term is not None else C_fixed, value_fixed + rest
        piece = term = None
    C_fixed, value_fixed = source.reduce(_zeros_if_none(C_fixed, res, source.dtype)), source.reduce(value_fixed)
    polished, value = 0, float("nan")
    for polished in range(1, polish_iter + 1):
        before = {n: dict(e) for n, e in elements.items()}
        C, value_moving = None, 0.0
        for piece in source.pieces(names=moving.__contains__):
            in_piece = _local_in(spec, heads, piece.a)
            if in_piece:
                solve_local_rounds(spec, piece.a, piece.b, elements, in_piece, act, freeze_perms=True)
            # the rest: e.g. query biases, moved by head maps, no residual axis
            term, rest = _residual_terms(res, piece.a, act(spec, piece.b, elements, skip={spec.residual}),
                                         residual_params)
            C, value_moving = _add(C, term) if term is not None else C, value_moving + rest
            piece = term = None
        C = C_fixed + source.reduce(_zeros_if_none(C, res, source.dtype))
        elements[spec.residual] = m.solve([res], [C])[0]
        value = m.value(res, C, elements[spec.residual]) + value_fixed + source.reduce(value_moving)
        if source.reduce_max(_max_change(spec, before, elements)) < polish_tol:  # every rank stops together
            break
    return polished, value


def _max_change(spec: Spec, old: dict, new: dict) -> float:
    out = 0.0
    for n, g in spec.groups.items():
        for key, t in new[n].items():
            if t.is_floating_point():
                out = max(out, (t - old[n][key]).abs().max().item())
    return out


INITS = ("anchor", "anchor_per_tensor", "identity")


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
    prior = token_weights(token_counts, pa) if token_counts is not None else None
    # "anchor_per_tensor": the anchor start with each anchor tensor counted equally (the
    # ViT's embeddings otherwise weigh little next to its head), then the chosen objective
    anchor_ref = weighted_reference(pa, pb, "per_tensor" if init == "anchor_per_tensor" else weighting, prior)
    ref = weighted_reference(pa, pb, weighting, prior)
    if order == "random":
        elements, info = _random_order(spec, ref, pb, anchor_ref, max_iter=max_iter, tol=tol, seed=seed, init=init,
                                       progress=progress)
    else:
        elements, info = match_pieces(spec, InMemoryPair(ref, pb, anchor_ref), max_iter=max_iter, tol=tol,
                                      init=init, polish_iter=polish_iter, polish_tol=polish_tol, progress=progress)
    info.update(weighting=weighting, token_prior=prior is not None)
    return elements, info


def match_pieces(spec: Spec, source, *, max_iter: int = 100, tol: float = 1e-4, init: str = "anchor",
                 polish_iter: int = 10, polish_tol: float = 1e-9, progress=None):
    """The structured schedule of `weight_matching` over a source of pieces (an InMemoryPair, or a pair of
    checkpoints streamed a block at a time, stream/pieces.py): the same steps and elements either way."""
    t0 = time.perf_counter()
    elements = {n: identity(g, source.dtype) for n, g in spec.groups.items()}
    start, objective_identity = _anchor_residual(spec, source) if init != "identity" else (None, None)
    if start is not None:
        elements[spec.residual] = start
    local = [n for n, g in spec.groups.items() if g.layer_local]
    residual_params = {ax.param for ax in spec.groups[spec.residual].axes} if spec.residual is not None else set()
    warm = {}  # assignment prices per group, carried from sweep to sweep
    history, it = [], 0
    for it in range(1, max_iter + 1):
        value, before = _sweep(spec, source, elements, local, residual_params, warm, first=it == 1)
        if before is not None:
            history.append(before)
        history.append(value)
        if progress is not None:
            progress.set_postfix(objective=f"{history[-1]:.6g}")
            progress.update(1)
        if history[-1] - history[-2] <= tol * abs(history[-1]):
            break
    if objective_identity is None:  # init "identity": the first sweep started there
        objective_identity = history[0]
    polished = 0
    if (polish_iter > 0 and spec.residual is not None
            and matcher_of(spec.groups[spec.residual]).has_maps(spec.groups[spec.residual])):
        polished, value = _polish(spec, source, elements, local, residual_params, polish_iter, polish_tol)
        history.append(value)
    source.share(elements)  # each layer group's element from the rank that solved it
    info = {"method": "weight", "order": "structured", "init": init, "iterations": it,
            "polish_iterations": polished, "objective": history, "objective_identity": objective_identity,
            "seconds": time.perf_counter() - t0}
    return elements, info


def _random_order(spec: Spec, pa: dict, pb: dict, anchor_ref: dict, *, max_iter: int, tol: float, seed: int,
                  init: str, progress):
    """Git Re-Basin's schedule, kept as the baseline: every sweep visits the groups in a random order,
    each solved given all the others (in memory only)."""
    t0 = time.perf_counter()
    names = list(pa)
    elements = {n: identity(g, pa[g.axes[0].param].dtype) for n, g in spec.groups.items()}
    objective_identity = solve.objective(pa, pb, names)
    if init != "identity" and spec.residual is not None:
        start, _ = _anchor_residual(spec, InMemoryPair(pa, pb, anchor_ref))
        if start is not None:
            elements[spec.residual] = start
    history = [solve.objective(pa, apply_spec(spec, pb, elements), names)]
    rng = random.Random(seed)
    warm, it = {}, 0
    for it in range(1, max_iter + 1):
        group_names = list(spec.groups)
        rng.shuffle(group_names)
        for n in group_names:
            touched = {ax.param for ax in spec.groups[n].axes}
            sub = apply_spec(spec, {p: pb[p] for p in touched}, elements, skip={n})
            group = spec.groups[n]
            elements[n] = matcher_of(group).solve([group], [matcher_of(group).correlation(group, pa, sub)],
                                                  warm=warm, key=n)[0]
        history.append(solve.objective(pa, apply_spec(spec, pb, elements), names))
        if progress is not None:
            progress.set_postfix(objective=f"{history[-1]:.6g}")
            progress.update(1)
        if history[-1] - history[-2] <= tol * abs(history[-1]):
            break
    info = {"method": "weight", "order": "random", "init": init, "iterations": it, "polish_iterations": 0,
            "objective": history, "objective_identity": objective_identity, "seconds": time.perf_counter() - t0}
    return elements, info


def _align(model_a, model_b, space: str, heads: bool, dtype, progress: bool, distributed=None,
           **options) -> Alignment:
    from .pair import params_pair, progress_bar, solved_alignment

    if distributed:
        raise ValueError("distributed matching splits the layers of checkpoints streamed from disk: pass the two "
                         "checkpoint paths, not models")
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
                     token_counts=None, distributed: bool | None = None) -> Alignment:
    """Method "weight" on two models: weight matching of every group in canonical space."""
    return _align(model_a, model_b, "canonical", True, dtype, progress, distributed, seed=seed, max_iter=max_iter,
                  tol=tol, order=order, weighting=weighting or "sum", token_counts=token_counts)


def align_by_permutations(model_a, model_b, data=None, *, heads: bool | None = True, dtype=None,
                          progress: bool = False, seed: int = 0, max_iter: int = 100, tol: float = 1e-4,
                          order: str = "structured", weighting: str | None = None,
                          distributed: bool | None = None) -> Alignment:
    """Method "permutation" on two models: Git Re-Basin's weight matching on raw parameters, permuting
    the residual, MLP units and, unless `heads` is False, whole heads."""
    heads = heads is not False
    return _align(model_a, model_b, "raw", heads, dtype, progress, distributed, seed=seed, max_iter=max_iter,
                  tol=tol, order=order, weighting=weighting or "sum")
