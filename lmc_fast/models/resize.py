"""Width-heterogeneous models: zero-pad a narrower MLP so that models can be aligned.

A unit with zero input weights, zero bias and zero output weights contributes GELU(0) * 0 = 0,
so appending such units preserves the function exactly. Aligning A (MLP width m_A) with B
(m_B < m_A) pads B to m_A; the square assignment that follows places B's units among A's,
leaving the zero units on A's unmatched ones: a rectangular assignment (semi-permutation).
"""
from __future__ import annotations

import torch

from ..symmetry.spec import permutation_spec
from .adapters import adapter_for, standard_params


def pad_params(arch, params: dict, d_mlp: int) -> dict:
    """Standard parameters with every MLP padded by zero units to width d_mlp."""
    out = dict(params)
    for group in permutation_spec(arch).groups.values():
        if not group.name.startswith("mlp."):
            continue
        for ax in group.axes:
            t = out[ax.param]
            shape = list(t.shape)
            shape[ax.axis] = d_mlp - t.shape[ax.axis]
            out[ax.param] = torch.cat([t, t.new_zeros(shape)], dim=ax.axis)
    return out


def pad_mlp(model, d_mlp: int):
    """A model of `model`'s class with MLP width d_mlp >= its own, computing the same function
    (the new units are zero)."""
    arch, params = standard_params(model)
    if d_mlp < arch.d_mlp:
        raise ValueError(f"pad_mlp: d_mlp={d_mlp} is narrower than the model's MLP ({arch.d_mlp}); "
                         "zero-padding only widens")
    adapter = adapter_for(model)
    if d_mlp == arch.d_mlp:
        return adapter.build(model, params)
    return adapter.build(adapter.resized(model, d_mlp), pad_params(arch, params, d_mlp))


def widen_mlp_to(arch_a, model_b, what: str = "model_b"):
    """model_b zero-padded to the MLP width of arch_a (the reference) when it is narrower and
    otherwise equal; unchanged when the widths match or the models differ elsewhere too
    (check_same_arch then names the difference). A wider model_b is an error: the alignment
    maps B onto A's shapes."""
    from dataclasses import replace

    arch_b = adapter_for(model_b).arch(model_b)
    if arch_b.d_mlp == arch_a.d_mlp or replace(arch_b, d_mlp=arch_a.d_mlp) != arch_a:
        return model_b
    if arch_b.d_mlp > arch_a.d_mlp:
        raise ValueError(f"{what} has a wider MLP ({arch_b.d_mlp}) than the reference ({arch_a.d_mlp}): "
                         "use the wider model as the reference (swap the two), or widen the reference with "
                         "lmc_fast.models.pad_mlp")
    return pad_mlp(model_b, arch_a.d_mlp)


def widen_all(models: list) -> list:
    """Every model zero-padded to the widest MLP among them (those that differ only in MLP
    width); for merging several models of different widths."""
    archs = [adapter_for(m).arch(m) for m in models]
    widest = max(archs, key=lambda a: a.d_mlp)
    return [widen_mlp_to(widest, m, f"models[{i}]") for i, m in enumerate(models)]
