"""Matching an orthogonal group: the residual stream's rotation (centred, R 1 = 1, in LayerNorm models).

- statistic: C = sum over the group's axes of A_(axis) B_(axis)^T (d, d); from data, the stream's
  normalised states at every block boundary;
- solve: Procrustes, R = polar(C), in the complement of the ones direction when centred;
- latent: a (d, d) matrix ((d - 1, d - 1) in that complement), projected by its exact polar factor,
  differentiable (base.polar_ste).
"""
from __future__ import annotations

import torch

from ...symmetry.maps import householder_basis
from .. import solve
from .base import Matcher, polar_ste, residual_term


class OrthogonalMatcher(Matcher):
    kind = "orthogonal"

    def has_maps(self, group) -> bool:
        return True

    def correlation(self, group, pa: dict, pb: dict) -> torch.Tensor:
        return solve.axes_correlation(group, pa, pb)

    def activation_term(self, group, rec_a: dict, rec_b: dict) -> torch.Tensor:
        if group.role != "residual":
            raise ValueError(f"group {group.name!r}: activation statistics of orthogonal groups are the residual stream's")
        return residual_term(rec_a, rec_b)

    def solve(self, groups, stats, *, warm=None, key=None, current=None) -> list[dict]:
        return [{"matrix": solve.solve_orthogonal(g, C)} for g, C in zip(groups, stats)]

    def value(self, group, stat, element) -> float:
        return float((element["matrix"] * stat).sum())

    def latent(self, groups, elements, dtype=torch.float32):
        if len(groups) != 1:
            raise ValueError("one orthogonal latent per group")
        return OrthogonalLatent(groups[0], elements[0], dtype)


class OrthogonalLatent(torch.nn.Module):
    def __init__(self, group, element, dtype):
        super().__init__()
        self.names, self.centred = [group.name], group.centred
        M = element["matrix"].to(torch.float64)
        if self.centred:
            Q = householder_basis(group.size)
            M = (Q.T @ M @ Q)[1:, 1:]
            self.register_buffer("Q", Q.to(dtype))
        self.rotation = torch.nn.Parameter(M.to(dtype))

    def tags(self) -> dict:
        return {"rotation": "continuous"}

    def warm_parts(self) -> dict:
        return {}

    def project(self):
        R = polar_ste(self.rotation.unsqueeze(0))[0]
        if self.centred:
            R = self.Q @ torch.block_diag(torch.ones(1, 1, dtype=R.dtype, device=R.device), R) @ self.Q.T
        return [{"R": R}], [{"matrix": R.detach().double()}]
