"""The solvers every kind of group shares: correlations over axes, assignments, Procrustes.

- permutation: linear assignment on C (warm-started from the last solve's prices);
- orthogonal: Procrustes, M = polar(C) = U V^T; with R 1 = 1 (LayerNorm models) the polar
  factor is taken in the complement of the ones direction.
What is particular to a kind (the head blocks, grouped-query assignments, rotary maps) lives in
its matcher, match/kinds/<kind>.py.
"""
from __future__ import annotations

import torch

from .. import kernels
from ..symmetry.maps import householder_basis
from ..symmetry.spec import Group


def flat(W: torch.Tensor, axis: int) -> torch.Tensor:
    Wt = W.movedim(axis, 0)
    return Wt.reshape(Wt.shape[0], -1)


def axes_correlation(group: Group, pa: dict, pb: dict) -> torch.Tensor:
    """C = sum over the group's axes of A_(axis) B_(axis)^T, (n, n), accumulated in place: at a 7B MLP
    width C is 0.8 GB in float32, and `C + term` would hold three of them."""
    C = None
    for ax in group.axes:
        a, b = flat(pa[ax.param], ax.axis), flat(pb[ax.param], ax.axis)
        C = a @ b.T if C is None else C.addmm_(a, b.T)
    return C


def correlation(group: Group, pa: dict, pb: dict):
    """Weight matching's statistic of `group` (its kind's layout: a matrix, or per-circuit head blocks)."""
    from .kinds import matcher_of

    return matcher_of(group).correlation(group, pa, pb)


def solve_permutations(Cs: torch.Tensor, warm: dict | None = None, key=None) -> torch.Tensor:
    """(G, n, n) correlations -> (G, n) permutations maximising sum_i C[i, perm[i]].

    `warm`: a dict kept across calls (e.g. sweeps); the assignment's column prices are kept
    under `key` and start the next solve of the same groups, which costs a fraction of a
    cold solve once the correlations change little (the optimum is the same either way)."""
    if warm is None:
        return kernels.linear_assignment(Cs, maximize=True)
    perm, duals = kernels.linear_assignment(Cs, maximize=True, duals=warm.get(key), return_duals=True)
    if duals is not None:
        warm[key] = duals
    return perm


def solve_orthogonal(group: Group, C: torch.Tensor) -> torch.Tensor:
    if not group.centred:
        return kernels.polar(C.unsqueeze(0))[0]
    Q = householder_basis(C.shape[0], C.dtype, C.device)
    inner = (Q.T @ C @ Q)[1:, 1:]
    R = torch.zeros_like(C)
    R[0, 0] = 1.0
    R[1:, 1:] = kernels.polar(inner.unsqueeze(0))[0]
    return Q @ R @ Q.T


def objective(pa: dict, pb: dict, names) -> float:
    """sum over parameters of <A_p, B_p>."""
    return float(sum((pa[n] * pb[n]).sum() for n in names))
