"""Per-group solvers: from a cross-correlation C to the element maximising tr(M^T C).

- permutation: linear assignment on C;
- orthogonal: Procrustes, M = polar(C) = U V^T; with R 1 = 1 (LayerNorm models) the polar
  factor is taken in the complement of the ones direction;
- heads: score(i, j) = ||C_qk[i, j]||_* + ||C_vo[i, j]||_* (the best per-head orthogonal
  fit), assignment over heads, then per-head Procrustes for the matched pairs;
- whole-head permutations (head_map "none", raw space): score(i, j) = sum over the head
  blocks of <A head i, B head j> (Q / K / V row blocks and biases, O column blocks), then an
  assignment over heads.
Solvers take a batch of groups of one kind so that all layers are solved in one call.
"""
from __future__ import annotations

import torch

from .. import kernels
from ..symmetry.elements import householder_basis
from ..symmetry.spec import Group


def flat(W: torch.Tensor, axis: int) -> torch.Tensor:
    Wt = W.movedim(axis, 0)
    return Wt.reshape(Wt.shape[0], -1)


def correlation(group: Group, pa: dict, pb: dict):
    """C = sum over the group's axes of A_(axis) B_(axis)^T; for heads, per circuit (H, H, d_h, d_h)."""
    if group.kind != "heads":
        C = None
        for ax in group.axes:
            term = flat(pa[ax.param], ax.axis) @ flat(pb[ax.param], ax.axis).T
            C = term if C is None else C + term
        return C
    H, dh = group.n_heads, group.head_dim
    out = {}
    for circuit in ("qk", "vo"):
        C = None
        for ax in group.axes:
            if ax.circuit != circuit:
                continue
            a = flat(pa[ax.param], ax.axis).reshape(H, dh, -1)
            b = flat(pb[ax.param], ax.axis).reshape(H, dh, -1)
            term = torch.einsum("iar,jbr->ijab", a, b)
            C = term if C is None else C + term
        out[circuit] = C
    return out


def head_scores(group: Group, pa: dict, pb: dict) -> torch.Tensor:
    """(H, H) score of whole-head permutations: S[i, j] = sum over the group's axes of the
    Frobenius inner product of A's head-i block with B's head-j block."""
    H = group.n_heads
    S = None
    for ax in group.axes:
        term = flat(pa[ax.param], ax.axis).reshape(H, -1) @ flat(pb[ax.param], ax.axis).reshape(H, -1).T
        S = term if S is None else S + term
    return S


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


def solve_heads(C_qk: torch.Tensor, C_vo: torch.Tensor):
    """(G, H, H, d, d) correlations -> head perms (G, H), QK maps and VO maps (G, H, d, d)."""
    G, H, _, dh, _ = C_qk.shape
    both = torch.cat([C_qk, C_vo], dim=1).reshape(-1, dh, dh)
    # Nuclear norm ||C||_* = tr(P^T C) with P the polar factor: the polar-only kernel (a
    # Newton iteration on CPU) is ~2x cheaper than the singular values from a full SVD.
    nuclear = torch.einsum("bij,bij->b", kernels.polar(both), both).reshape(G, 2, H, H)
    score = nuclear.sum(1)  # QK + VO
    perm = kernels.linear_assignment(score, maximize=True)
    idx = perm[:, :, None, None, None].expand(G, H, 1, dh, dh)
    picked_qk = C_qk.gather(2, idx).squeeze(2)
    picked_vo = C_vo.gather(2, idx).squeeze(2)
    maps = kernels.polar(torch.cat([picked_qk, picked_vo]).reshape(-1, dh, dh)).reshape(2, G, H, dh, dh)
    return perm, maps[0], maps[1]


def solve_head_maps(C_qk: torch.Tensor, C_vo: torch.Tensor, perm: torch.Tensor):
    """Per-head Procrustes for a fixed head assignment: (H, H, d, d) correlations -> (H, d, d) maps."""
    H = perm.shape[0]
    rows = torch.arange(H)
    dh = C_qk.shape[-1]
    maps = kernels.polar(torch.cat([C_qk[rows, perm], C_vo[rows, perm]])).reshape(2, H, dh, dh)
    return maps[0], maps[1]


def objective(pa: dict, pb: dict, names) -> float:
    """sum over parameters of <A_p, B_p>."""
    return float(sum((pa[n] * pb[n]).sum() for n in names))
