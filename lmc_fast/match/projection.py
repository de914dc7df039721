"""Latent matrices -> group elements, with straight-through gradients (learned matching).

- permutations: forward = the assignment of the latent (a hard permutation matrix);
  backward = identity to the latent (Git Re-Basin's straight-through estimator);
- orthogonal maps: forward = the exact polar factor U V^T (kernels.polar); backward = the gradient of
  a differentiable polar map, batched Newton-Schulz iterations, rather than the identity;
- invertible per-head maps: the latent itself;
- QK maps of rotary models: the latent's nearest per-plane [[a, -b], [b, a]] blocks (a linear
  projection), with (a, b) normalised for rotations: differentiable as it is; with partial rotary
  the unrotated dims' block is projected like any other head map.
Grouped-query attention: a permutation latent for the key / value heads and one per group for
its query heads. Group elements are applied as dense matrices here so that gradients reach the latents.
"""
from __future__ import annotations

import torch

from .. import kernels
from ..symmetry.groups import kind_of
from ..symmetry.maps import householder_basis, rotary_map, rotary_parts
from ..symmetry.spec import Group, Spec
from .solve import solve_permutations

NS_STEPS = 10


def newton_schulz_polar(M: torch.Tensor, sigma_max: torch.Tensor, steps: int = NS_STEPS) -> torch.Tensor:
    """Differentiable polar factor of a batch (..., n, n): X <- 1.5 X - 0.5 X X^T X after
    scaling by the largest singular value (held constant: the polar factor ignores scale)."""
    X = M / (sigma_max.detach() * 1.001).clamp_min(1e-30)[..., None, None]
    for _ in range(steps):
        X = 1.5 * X - 0.5 * X @ (X.transpose(-1, -2) @ X)
    return X


def polar_ste(M: torch.Tensor) -> torch.Tensor:
    """Exact polar factor forward, Newton-Schulz gradient backward. (B, n, n) batches."""
    Md = M.detach()
    exact = kernels.polar(Md)
    # Newton-Schulz needs an upper bound on the largest singular value: H = P^T M is
    # symmetric positive semi-definite with the singular values as eigenvalues, so its
    # max row sum bounds them, and is tight for the near-orthogonal latents met here.
    H = exact.transpose(-1, -2).to(Md.dtype) @ Md
    sigma_bound = H.abs().sum(-1).amax(-1)
    soft = newton_schulz_polar(M, sigma_bound)
    return exact.to(M.dtype) + (soft - soft.detach())


def permutation_ste(latent: torch.Tensor, warm: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, n, n) latents -> hard permutation matrices with identity gradient, and the perms.
    `warm` (a dict kept between steps) holds the assignment's column prices: one optimiser
    step moves the latents a little, so the next solve starts from the last one's prices."""
    perm = solve_permutations(latent.detach(), warm, "duals")
    hard = torch.zeros_like(latent).scatter_(-1, perm.unsqueeze(-1), 1.0)
    return hard + (latent - latent.detach()), perm


def one_hot(perm: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(*perm.shape, perm.shape[-1], dtype=dtype).scatter_(-1, perm.unsqueeze(-1), 1.0)


class Latents(torch.nn.Module):
    """One latent matrix per group, initialised at given elements (e.g. weight matching's).
    Latents of one kind and shape are stacked across layers so that each projection (one
    batched assignment, one batched SVD + Newton-Schulz) runs once per step, not per layer."""

    def __init__(self, spec: Spec, elements: dict, dtype=torch.float32):
        super().__init__()
        self.spec = spec
        perms = [n for n, g in spec.groups.items() if g.kind == "permutation" and g.layer_local]
        self.mlp = [n for n in perms if spec.groups[n].size == spec.arch.d_mlp]  # stacked: one size
        # permutation groups of other sizes (BERT's pooler and masked-LM transform units): one latent each
        self.extra = [n for n in perms if n not in self.mlp]
        self._warm_extra = [{} for _ in self.extra]
        if self.extra:
            self.perm_latents = torch.nn.ParameterList(
                [torch.nn.Parameter(one_hot(elements[n]["perm"], dtype)) for n in self.extra])
        self.heads = [n for n, g in spec.groups.items() if g.kind == "heads"]
        first = spec.groups[self.heads[0]] if self.heads else None
        self.head_map = first.head_map if first is not None else "orthogonal"
        self.rotary_dim = first.rotary_dim if first is not None else 0
        self.grouped = bool(first is not None and first.group_size > 1)
        res = spec.groups.get(spec.residual)
        self.centred = bool(res is not None and res.centred)
        self.residual_kind = None if res is None else res.kind
        self._warm_mlp, self._warm_heads = {}, {}  # assignment prices from the previous step
        if self.mlp:
            self.mlp_latent = torch.nn.Parameter(torch.stack([one_hot(elements[n]["perm"], dtype) for n in self.mlp]))
        if self.heads:
            self.head_perm = torch.nn.Parameter(torch.stack([one_hot(elements[n]["perm"], dtype) for n in self.heads]))
            if self.grouped:  # (layers, G, r, r): query heads within each group
                self.head_qperm = torch.nn.Parameter(torch.stack([one_hot(elements[n]["qperm"], dtype)
                                                                  for n in self.heads]))
                self._warm_qheads = {}
            self.head_maps = torch.nn.Parameter(torch.stack(
                [torch.stack([elements[n]["qk"], elements[n]["vo"]]) for n in self.heads]).to(dtype))
        if res is not None and res.kind == "permutation":  # post-norm streams (BERT)
            self._warm_residual = {}
            self.residual_perm = torch.nn.Parameter(one_hot(elements[spec.residual]["perm"], dtype))
        elif res is not None:
            M = elements[spec.residual]["matrix"].to(torch.float64)
            if self.centred:
                Q = householder_basis(res.size)
                M = (Q.T @ M @ Q)[1:, 1:]
                self.register_buffer("Q", Q.to(dtype))
            self.residual = torch.nn.Parameter(M.to(dtype))

    def project(self):
        """Dense differentiable elements {name: {...}} and the hard elements they equal."""
        dense, hard = {}, {}
        if self.mlp:
            P, perm = permutation_ste(self.mlp_latent, self._warm_mlp)
            for i, n in enumerate(self.mlp):
                dense[n], hard[n] = {"P": P[i]}, {"perm": perm[i]}
        for n, latent, warm in zip(self.extra, getattr(self, "perm_latents", ()), self._warm_extra):
            P, perm = permutation_ste(latent.unsqueeze(0), warm)
            dense[n], hard[n] = {"P": P[0]}, {"perm": perm[0]}
        if self.heads:
            P, perm = permutation_ste(self.head_perm, self._warm_heads)
            L, _, H, dh, _ = self.head_maps.shape
            qk, vo = self.head_maps[:, 0], self.head_maps[:, 1]
            if self.head_map == "orthogonal":
                vo = polar_ste(vo.reshape(-1, dh, dh)).reshape(vo.shape)
                if not self.rotary_dim:
                    qk = polar_ste(qk.reshape(-1, dh, dh)).reshape(qk.shape)
            if self.rotary_dim:
                a, b, rest = rotary_parts(qk, self.rotary_dim)
                if self.head_map == "orthogonal":
                    norm = torch.sqrt(a * a + b * b).clamp_min(1e-12)
                    a, b = a / norm, b / norm
                    if rest is not None:
                        m = rest.shape[-1]
                        rest = polar_ste(rest.reshape(-1, m, m)).reshape(rest.shape)
                qk = rotary_map(a, b, rest)
            if self.grouped:
                QP, qperm = permutation_ste(self.head_qperm.flatten(0, 1), self._warm_qheads)
                QP, qperm = QP.reshape(self.head_qperm.shape), qperm.reshape(self.head_qperm.shape[:-1])
            for i, n in enumerate(self.heads):
                dense[n] = {"P": P[i], "qk": qk[i], "vo": vo[i]}
                hard[n] = {"perm": perm[i], "qk": qk[i].detach().double(), "vo": vo[i].detach().double()}
                if self.grouped:
                    dense[n]["QP"], hard[n]["qperm"] = QP[i], qperm[i]
        if self.residual_kind == "permutation":
            P, perm = permutation_ste(self.residual_perm.unsqueeze(0), self._warm_residual)
            dense[self.spec.residual], hard[self.spec.residual] = {"P": P[0]}, {"perm": perm[0]}
        elif self.spec.residual is not None:
            R = polar_ste(self.residual.unsqueeze(0))[0]
            if self.centred:
                R = self.Q @ torch.block_diag(torch.ones(1, 1, dtype=R.dtype, device=R.device), R) @ self.Q.T
            res = self.spec.residual
            dense[res], hard[res] = {"R": R}, {"matrix": R.detach().double()}
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
