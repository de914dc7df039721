"""Group elements as tensors, and how they act on parameters: the functions the rest of the library
calls, each dispatching to the group's kind (groups.py, where each kind's algebra lives; the element
formats are described there).
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from .groups import MAX_CONDITION, ORTHOGONAL_TOLERANCE, Element, InvalidAlignmentError, fail, kind_of
from .maps import (centred_orthogonal, householder_basis, nearest_orthogonal, nearest_rotary, random_invertible,
                   random_orthogonal, random_rotary, rotary_map, rotary_parts)
from .spec import Axis, Group, Spec


def expected_shapes(group: Group) -> dict[str, tuple[int, ...]]:
    """The entries of an element of `group` and their shapes."""
    return kind_of(group).shapes(group)


def identity(group: Group, dtype=torch.float64, device=None) -> Element:
    return kind_of(group).identity(group, dtype, device)


def random_element(group: Group, generator=None, dtype=torch.float64) -> Element:
    """A random element of the group (for planted tests and function-preservation checks)."""
    return kind_of(group).random(group, generator, dtype)


def _check_entries(group: Group, el) -> None:
    if not isinstance(el, dict):
        fail(group, f"element must be a dict of tensors, got {type(el).__name__}")
    want = expected_shapes(group)
    missing, extra = sorted(set(want) - set(el)), sorted(set(el) - set(want))
    if missing:
        fail(group, f"{group.kind} element lacks {missing}")
    if extra:
        fail(group, f"{group.kind} element has unexpected entries {extra}")
    for key, shape in want.items():
        t = el[key]
        if not isinstance(t, torch.Tensor):
            fail(group, f"{key!r} must be a tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            fail(group, f"{key!r} has shape {tuple(t.shape)}, expected {shape}")


def validate(group: Group, el: Element) -> None:
    """Raise InvalidAlignmentError (naming the group, the problem and the measured number)
    unless `el` is an element of `group`: right entries and shapes, permutations that are
    bijections, orthogonal maps orthogonal to the dtype's tolerance, invertible maps finite
    and well conditioned, rotary maps one block per plane. Each check is batched over heads."""
    _check_entries(group, el)
    kind_of(group).validate(group, el)


def snap(group: Group, el: Element) -> Element:
    """`el` moved onto the group in float64 (nearest orthogonal maps, keeping R 1 = 1 where
    the group is centred): for elements computed in float32, e.g. by learned matching."""
    return kind_of(group).snap(group, el)


def apply_axis(W: torch.Tensor, group: Group, ax: Axis, el: Element) -> torch.Tensor:
    Wt = W.movedim(ax.axis, 0)
    shape = Wt.shape
    out = kind_of(group).apply(Wt.reshape(shape[0], -1), group, ax, el)
    return out.reshape(shape).movedim(0, ax.axis)


def apply_spec(spec: Spec, params: dict[str, torch.Tensor], elements: dict[str, Element],
               skip: set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """g . params for the given elements (groups missing from `elements` or in `skip` act as
    identity; parameters missing from `params` are passed over, so a subset can be transformed)."""
    out = dict(params)
    for name, group in spec.groups.items():
        if name in skip or name not in elements:
            continue
        for ax in group.axes:
            if ax.param in out:
                out[ax.param] = apply_axis(out[ax.param], group, ax, elements[name])
    return out


class Transformed(Mapping):
    """`apply_spec(spec, params, elements, skip)` read one tensor at a time: each access transforms that
    tensor (in the same order, so the same values) and keeps nothing, so a streamed layer never holds a
    transformed copy of every tensor at once."""

    def __init__(self, spec: Spec, params: dict, elements: dict, skip: set[str] = frozenset()):
        self.params, self.elements = params, elements
        self.axes = {}
        for name, group in spec.groups.items():
            if name in skip or name not in elements:
                continue
            for ax in group.axes:
                if ax.param in params:
                    self.axes.setdefault(ax.param, []).append((group, ax))

    def __getitem__(self, name: str) -> torch.Tensor:
        t = self.params[name]
        for group, ax in self.axes.get(name, ()):
            t = apply_axis(t, group, ax, self.elements[group.name])
        return t

    def __iter__(self):
        return iter(self.params)

    def __len__(self) -> int:
        return len(self.params)


def elements_equal(spec: Spec, e1: dict, e2: dict, atol: float = 1e-9) -> bool:
    """Every group's element of `e1` equals `e2`'s: permutations exactly, maps to `atol` (MergeMany's stop)."""
    for name in spec.groups:
        for key, t in e1[name].items():
            u = e2[name][key]
            if t.dtype == torch.int64:
                if not torch.equal(t, u):
                    return False
            elif (t - u).abs().max() > atol:
                return False
    return True


def compose(group: Group, first: Element, second: Element) -> Element:
    """The element acting as `first` after `second`: (first . second) . theta = first . (second . theta)."""
    return kind_of(group).compose(group, first, second)


def inverse(group: Group, el: Element) -> Element:
    return kind_of(group).inverse(group, el)


__all__ = ["Element", "InvalidAlignmentError", "MAX_CONDITION", "ORTHOGONAL_TOLERANCE", "Transformed", "apply_axis",
           "apply_spec",
           "centred_orthogonal", "compose", "expected_shapes", "householder_basis", "identity", "inverse",
           "nearest_orthogonal", "nearest_rotary", "random_element", "random_invertible", "random_orthogonal",
           "random_rotary", "rotary_map", "rotary_parts", "snap", "validate"]
