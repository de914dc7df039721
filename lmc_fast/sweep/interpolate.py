"""Weighted averages of aligned models, in canonical (default) or raw parameter space."""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..models.adapters import adapter_for, check_compatible, standard_params
from ..symmetry import check_same_arch
from ..symmetry.canonical import canonical_params
from .checks import as_real


def space_params(model, space: str):
    """(Arch, float64 standard parameters) in the requested space."""
    if space not in ("canonical", "raw"):
        raise ValueError(f"space must be 'canonical' or 'raw', got {space!r}")
    arch, params = standard_params(model)
    if space == "canonical":
        return arch, canonical_params(arch, params)
    return arch, {k: v.detach().to(torch.float64) for k, v in params.items()}


def models_params(models: Sequence, space: str):
    if len(models) == 0:
        raise ValueError("need at least one model")
    for i, m in enumerate(models[1:], start=1):  # every config field, before any parameter is copied
        check_compatible(models[0], m, what=f"models[{i}]", ref="models[0]", mlp="equal")
    arch, first = space_params(models[0], space)
    out = [first]
    for i, m in enumerate(models[1:], start=1):
        a, p = space_params(m, space)
        check_same_arch(arch, a, f"models[{i}]")
        out.append(p)
    return arch, out


def mix(params_list: Sequence[dict], weights: Sequence[float]) -> dict:
    return {k: sum(w * p[k] for w, p in zip(weights, params_list)) for k in params_list[0]}


def check_weights(weights: Sequence[float], n: int) -> list[float]:
    """One finite real weight per model, summing to 1 (negative weights extrapolate: allowed)."""
    if isinstance(weights, (str, bytes)) or not hasattr(weights, "__len__"):
        raise ValueError(f"weights must be a list of {n} numbers, got {weights!r}")
    if len(weights) != n:
        raise ValueError(f"got {n} models but {len(weights)} weights")
    out = []
    for i, w in enumerate(weights):
        value = as_real(w)
        if not math.isfinite(value):
            raise ValueError(f"weights must be finite numbers, got {w!r} at position {i}")
        out.append(value)
    if abs(math.fsum(out) - 1.0) > 1e-6:
        raise ValueError(f"weights must sum to 1, got {out} (sum {math.fsum(out):.6g})")
    return out


def interpolate(models: Sequence, weights: Sequence[float], space: str = "canonical"):
    """sum_i w_i theta_i as a model of the first model's class. In canonical space (default)
    every input is canonicalised first (idempotent, so aligned models pass through)."""
    weights = check_weights(weights, len(models))
    _, params = models_params(models, space)
    return adapter_for(models[0]).build(models[0], mix(params, weights))
