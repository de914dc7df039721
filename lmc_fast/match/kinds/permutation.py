"""Matching a permutation group (MLP units; BERT's pooler and masked-LM transform units; the residual
stream of post-norm models and of the raw-space baseline).

- statistic: C = sum over the group's axes of A_(axis) B_(axis)^T (n, n); from data, the units'
  activations a^T b (the stream's normalised states for the residual);
- solve: the linear assignment maximising sum_i C[i, perm[i]], all layers of one size batched;
- latent: an (n, n) matrix per group, projected to its assignment (straight-through gradient).
"""
from __future__ import annotations

import torch

from .. import solve
from .base import Matcher, one_hot, permutation_ste, residual_term, stacked


class PermutationMatcher(Matcher):
    kind = "permutation"

    def batch_key(self, group):
        return (group.role, group.size)  # one batched assignment per size

    def correlation(self, group, pa: dict, pb: dict) -> torch.Tensor:
        return solve.axes_correlation(group, pa, pb)

    def activation_term(self, group, rec_a: dict, rec_b: dict) -> torch.Tensor:
        if group.role == "residual":
            return residual_term(rec_a, rec_b)
        a, b = rec_a[group.name], rec_b[group.name]  # the units' activations, recorded under the group's name
        return stacked(a).T @ stacked(b)

    def solve(self, groups, stats, *, warm=None, key=None, current=None) -> list[dict]:
        if current is not None:  # permutations frozen
            return list(current)
        # one group (a layer's MLP, solved alone when streamed): a view, not a copy of its n x n scores
        Cs = stats[0].unsqueeze(0) if len(stats) == 1 else torch.stack(stats)
        perms = solve.solve_permutations(Cs, warm, key)
        return [{"perm": p} for p in perms]

    def value(self, group, stat, element) -> float:
        return float(stat[torch.arange(stat.shape[0]), element["perm"]].sum())

    def latent(self, groups, elements, dtype=torch.float32):
        return PermutationLatent(groups, elements, dtype)


class PermutationLatent(torch.nn.Module):
    """(L, n, n) latents of L groups of one size, one batched assignment per step."""

    def __init__(self, groups, elements, dtype):
        super().__init__()
        self.names = [g.name for g in groups]
        self.perm = torch.nn.Parameter(torch.stack([one_hot(el["perm"], dtype) for el in elements]))
        self.warm = {}  # the assignment's prices from the previous step

    def tags(self) -> dict:
        return {"perm": "permutation"}

    def warm_parts(self) -> dict:
        return {"perm": (self.warm, self.perm)}

    def project(self):
        P, perm = permutation_ste(self.perm, self.warm)
        # "perm" beside P: P is its one-hot matrix in value, so applying it is a gather (groups.Permutation)
        return ([{"P": P[i], "perm": perm[i]} for i in range(len(self.names))],
                [{"perm": perm[i]} for i in range(len(self.names))])
