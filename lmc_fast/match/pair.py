"""Two models as a pair of parameter dicts in a spec's space, and the alignment back from solved elements.

What every data-free and activation method does around its solver: check the models agree,
read both into the spec's space (one model's raw copy at a time), and after solving in float32
move the elements onto their groups exactly.
"""
from __future__ import annotations

import torch

from ..models.adapters import check_compatible, standard_params
from ..symmetry import Alignment, check_same_arch, prepare_params, spec_for
from ..symmetry import elements as E


def params_pair(model_a, model_b, space: str, heads: bool = True, dtype=torch.float64):
    """(spec, A's and B's parameters in the spec's space and `dtype`); one model's raw copy at a time."""
    check_compatible(model_a, model_b, mlp="equal")  # every config field, not only the Arch
    arch_a, raw = standard_params(model_a)
    spec = spec_for(arch_a, space, heads=heads)
    pa = prepare_params(spec, arch_a, raw, dtype)
    arch_b, raw = standard_params(model_b)
    check_same_arch(arch_a, arch_b, "model_b")
    return spec, pa, prepare_params(spec, arch_b, raw, dtype)


def progress_bar(enabled: bool, desc: str, total=None):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc)


def solved_alignment(spec, elements: dict, info: dict, dtype=torch.float64) -> Alignment:
    """The Alignment of solved elements; solved in float32, the nearest exact group elements in float64."""
    if dtype != torch.float64:
        elements = {n: E.snap(g, elements[n]) for n, g in spec.groups.items()}
        info["dtype"] = str(dtype).removeprefix("torch.")
    return Alignment(spec, elements, info)
