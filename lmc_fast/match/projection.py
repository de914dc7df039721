"""Latent matrices -> group elements, with straight-through gradients (learned matching).

Each kind's latent is its matcher's (match/kinds/): permutations forward = the assignment of the
latent (a hard permutation matrix, applied as a gather), backward = identity to the latent (Git
Re-Basin's straight-through estimator); orthogonal maps forward = the exact polar factor U V^T,
backward = its exact gradient on the CPU (one eigendecomposition) and the gradient of batched
Newton-Schulz iterations on CUDA (products only, no host sync); invertible per-head
maps: the latent itself; rotary QK maps: the latent's nearest per-plane [[a, -b], [b, a]] blocks.
`Latents` holds one block per run of groups of one kind and shape (all layers' MLP units, all
layers' heads, the residual), so each projection runs once per step, not per layer. Group elements
are applied as dense matrices here so that gradients reach the latents.
"""
from __future__ import annotations

import torch

from ..symmetry.groups import kind_of
from ..symmetry.spec import Group, Spec
from .kinds import batches
from .kinds.base import newton_schulz_polar, one_hot, permutation_ste, polar_ste  # noqa: F401  (the projections)

#: what each `learn` mode trains: latents by tag ("continuous" | "permutation"), by role ("residual",
#: "no_residual"), or by the family of groups a block holds ("heads", "mlp": its groups' name prefix)
LEARN_SELECTORS = {
    "all": lambda block, role, tag: True,
    "continuous": lambda block, role, tag: tag == "continuous",
    "permutations": lambda block, role, tag: tag == "permutation",
    "residual": lambda block, role, tag: role == "residual",
    "no_residual": lambda block, role, tag: role != "residual",
    "heads": lambda block, role, tag: block.rstrip("0123456789") == "heads",
    "mlp": lambda block, role, tag: block.rstrip("0123456789") == "mlp",
}


def _block_name(names: list[str], taken: set) -> str:
    base = names[0].split(".")[0]  # "mlp", "heads", "residual", "pooler", ...
    name, i = base, 1
    while name in taken:
        name, i = f"{base}{i}", i + 1
    return name


class Latents(torch.nn.Module):
    """One latent per group, initialised at given elements (e.g. weight matching's), in blocks:
    `blocks[name]` is the latent module of one run of groups (its matcher's `latent`)."""

    def __init__(self, spec: Spec, elements: dict, dtype=torch.float32):
        super().__init__()
        self.spec = spec
        self.blocks = torch.nn.ModuleDict()
        self.roles: dict[str, str] = {}
        for m, same in batches(spec, list(spec.groups)):
            name = _block_name(same, set(self.blocks))
            self.blocks[name] = m.latent([spec.groups[n] for n in same], [elements[n] for n in same], dtype)
            self.roles[name] = spec.groups[same[0]].role

    def trains(self, learn: str, block: str, param: str) -> bool:
        """Whether mode `learn` trains latent `param` of `block`."""
        return LEARN_SELECTORS[learn](block, self.roles[block], self.blocks[block].tags()[param])

    def warm_parts(self) -> dict:
        """{block.part: (warm-start prices dict, the latent (B, n, n) it prices)} (learned checkpoints)."""
        return {f"{b}.{part}": v for b, blk in self.blocks.items() for part, v in blk.warm_parts().items()}

    def project(self):
        """Dense differentiable elements {name: {...}} and the hard elements they equal."""
        dense, hard = {}, {}
        for blk in self.blocks.values():
            d, h = blk.project()
            dense.update(zip(blk.names, d))
            hard.update(zip(blk.names, h))
        return dense, hard


def _apply_dense_axis(W: torch.Tensor, group: Group, ax, el: dict) -> torch.Tensor:
    Wt = W.movedim(ax.axis, 0)
    shape = Wt.shape
    out = kind_of(group).apply_dense(Wt.reshape(shape[0], -1), group, ax, el)
    return out.reshape(shape).movedim(0, ax.axis)


def apply_dense(spec: Spec, params: dict, dense: dict) -> dict:
    """g . params with dense (differentiable) elements."""
    out = dict(params)
    for name, group in spec.groups.items():
        for ax in group.axes:
            out[ax.param] = _apply_dense_axis(out[ax.param], group, ax, dense[name])
    return out
