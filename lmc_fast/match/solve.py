"""Per-group solvers: from a cross-correlation C to the element maximising tr(M^T C).

- permutation: linear assignment on C;
- orthogonal: Procrustes, M = polar(C) = U V^T; with R 1 = 1 (LayerNorm models) the polar
  factor is taken in the complement of the ones direction;
- heads: score(i, j) = ||C_qk[i, j]||_* + ||C_vo[i, j]||_* (the best per-head orthogonal
  fit), assignment over heads, then per-head Procrustes for the matched pairs;
- whole-head permutations (head_map "none", raw space): score(i, j) = sum over the head
  blocks of <A head i, B head j> (Q / K / V row blocks and biases, O column blocks), then an
  assignment over heads.
- grouped-query attention (G key / value heads of r query heads): the same scores per query
  head and per key / value head; for every pair of groups an r x r assignment of their query
  heads, then a G x G assignment of groups on the key / value score plus the inner optimum;
  the group's QK / VO maps by Procrustes on its summed correlations.
- rotary models: QK maps are one rotation per frequency plane (`nearest_rotary`), and a rotation of
  the unrotated dims with partial rotary.
Solvers take a batch of groups of one kind so that all layers are solved in one call.
"""
from __future__ import annotations

import torch

from .. import kernels
from ..symmetry.groups import KINDS
from ..symmetry.maps import householder_basis, nearest_rotary
from ..symmetry.spec import Group


def flat(W: torch.Tensor, axis: int) -> torch.Tensor:
    Wt = W.movedim(axis, 0)
    return Wt.reshape(Wt.shape[0], -1)


def _head_blocks(W: torch.Tensor, group: Group, ax) -> torch.Tensor:
    """(G, r, d_h, X) blocks of a query axis, (G, d_h, X) of a key / value axis (the group kind's own
    reading, length-checked)."""
    return KINDS["heads"].blocks(flat(W, ax.axis), group, ax)


def correlation(group: Group, pa: dict, pb: dict):
    """C = sum over the group's axes of A_(axis) B_(axis)^T; for heads, per circuit (H, H, d_h, d_h);
    with grouped-query attention per circuit its query part "qk_q" (G, r, G, r, d_h, d_h) and its
    key / value part "qk_kv" (G, G, d_h, d_h) (and "vo_q", "vo_kv")."""
    if group.kind != "heads":
        C = None
        for ax in group.axes:
            term = flat(pa[ax.param], ax.axis) @ flat(pb[ax.param], ax.axis).T
            C = term if C is None else C + term
        return C
    grouped = group.group_size > 1
    H, dh = group.n_heads, group.head_dim
    out = {}
    for circuit in ("qk", "vo"):
        parts = {"q": None, "kv": None}
        for ax in group.axes:
            if ax.circuit != circuit:
                continue
            if grouped and ax.query:
                term = torch.einsum("iuar,jvbr->iujvab", _head_blocks(pa[ax.param], group, ax),
                                    _head_blocks(pb[ax.param], group, ax))
                part = "q"
            else:
                a = flat(pa[ax.param], ax.axis).reshape(H if ax.query else group.kv_heads, dh, -1)
                b = flat(pb[ax.param], ax.axis).reshape(H if ax.query else group.kv_heads, dh, -1)
                term, part = torch.einsum("iar,jbr->ijab", a, b), "kv"
            parts[part] = term if parts[part] is None else parts[part] + term
        if grouped:
            out[circuit + "_q"], out[circuit + "_kv"] = parts["q"], parts["kv"]
        else:
            out[circuit] = parts["kv"]
    return out


def head_scores(group: Group, pa: dict, pb: dict):
    """Score of whole-head permutations: S[i, j] = sum over the group's axes of the Frobenius inner
    product of A's head-i block with B's head-j block, (H, H); with grouped-query attention
    (S_q (G, r, G, r) over query heads, S_kv (G, G) over key / value heads)."""
    if group.group_size > 1:
        S_q = S_kv = 0.0
        for ax in group.axes:
            a, b = _head_blocks(pa[ax.param], group, ax), _head_blocks(pb[ax.param], group, ax)
            if ax.query:
                S_q = S_q + torch.einsum("iuar,jvar->iujv", a, b)
            else:
                S_kv = S_kv + torch.einsum("iar,jar->ij", a, b)
        return S_q, S_kv
    H = group.n_heads
    S = None
    for ax in group.axes:
        term = flat(pa[ax.param], ax.axis).reshape(H, -1) @ flat(pb[ax.param], ax.axis).reshape(H, -1).T
        S = term if S is None else S + term
    return S


def assign_grouped(S_q: torch.Tensor, S_kv) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, G, r, G, r) query-head scores and (B, G, G) key / value scores -> group permutations
    (B, G) and query permutations within groups (B, G, r) maximising the total score: for every
    pair of groups the best r x r assignment of their query heads, then the best assignment of groups."""
    B, G, r = S_q.shape[:3]
    inner = S_q.permute(0, 1, 3, 2, 4).reshape(B * G * G, r, r)  # [b, i, i'] -> r x r
    qp = kernels.linear_assignment(inner, maximize=True)  # (B G G, r)
    value = inner.gather(2, qp.unsqueeze(-1)).squeeze(-1).sum(-1).reshape(B, G, G)
    perm = kernels.linear_assignment(value + S_kv, maximize=True)  # (B, G)
    qperm = qp.reshape(B, G, G, r).gather(2, perm[:, :, None, None].expand(B, G, 1, r)).squeeze(2)
    return perm, qperm


def _nuclear(C: torch.Tensor) -> torch.Tensor:
    """||C||_* of every trailing (d, d) block: tr(P^T C) with P the polar factor (the polar-only
    kernel, a Newton iteration on CPU, is ~2x cheaper than singular values from a full SVD)."""
    dh = C.shape[-1]
    blocks = C.reshape(-1, dh, dh)
    return torch.einsum("bij,bij->b", kernels.polar(blocks), blocks).reshape(C.shape[:-2])


def _project_qk(C: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """The QK maps maximising tr(M^T C): rotary-commuting ones for rotary_dim > 0."""
    dh = C.shape[-1]
    return nearest_rotary(C, rotary_dim) if rotary_dim else kernels.polar(C.reshape(-1, dh, dh)).reshape(C.shape)


def grouped_head_maps(c: dict, perm: torch.Tensor, qperm: torch.Tensor, rotary_dim: int):
    """(B, ...) grouped correlations and fixed assignments -> QK and VO maps (B, G, d_h, d_h): each
    group's summed correlation (its key / value head and all its query heads), then Procrustes."""
    B, G, r = qperm.shape
    bi = torch.arange(B)[:, None]
    gi = torch.arange(G)[None, :]
    summed = {}
    for circuit in ("qk", "vo"):
        total = 0.0
        if c[circuit + "_kv"] is not None:
            total = c[circuit + "_kv"][bi, gi, perm]  # (B, G, dh, dh)
        if c[circuit + "_q"] is not None:
            Cq = c[circuit + "_q"]  # (B, G, r, G, r, dh, dh)
            ji = torch.arange(r)[None, None, :]
            total = total + Cq[bi[:, :, None], gi[:, :, None], ji, perm[:, :, None], qperm].sum(2)
        summed[circuit] = total
    dh = summed["vo"].shape[-1]
    return _project_qk(summed["qk"], rotary_dim), kernels.polar(summed["vo"].reshape(-1, dh, dh)).reshape(B, G, dh, dh)


def solve_grouped_heads(c: dict, rotary_dim: int = 0):
    """Grouped-query heads of B layers: dict of stacked grouped correlations (see `correlation`)
    -> perm (B, G), qperm (B, G, r), QK maps and VO maps (B, G, d_h, d_h)."""
    S_q = sum(_nuclear(c[k]) for k in ("qk_q", "vo_q") if c[k] is not None)
    S_kv = sum(_nuclear(c[k]) for k in ("qk_kv", "vo_kv") if c[k] is not None)
    perm, qperm = assign_grouped(S_q, S_kv)
    qk, vo = grouped_head_maps(c, perm, qperm, rotary_dim)
    return perm, qperm, qk, vo


def by_size(spec, names: list[str]) -> list[list[str]]:
    """The groups in runs of one size, so that each run stacks into one batched solve (MLP units, and
    BERT's pooler and transform units, of another width)."""
    runs: dict[int, list[str]] = {}
    for n in names:
        runs.setdefault(spec.groups[n].size, []).append(n)
    return list(runs.values())


def stack_correlations(cs: list[dict]) -> dict:
    """Per-layer correlation dicts -> one dict of (B, ...) tensors (None where a part is absent)."""
    return {k: (None if cs[0][k] is None else torch.stack([c[k] for c in cs])) for k in cs[0]}


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


def solve_heads(C_qk: torch.Tensor, C_vo: torch.Tensor, rotary_dim: int = 0):
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
    return perm, (nearest_rotary(picked_qk, rotary_dim) if rotary_dim else maps[0]), maps[1]


def solve_head_maps(C_qk: torch.Tensor, C_vo: torch.Tensor, perm: torch.Tensor, rotary_dim: int = 0):
    """Per-head Procrustes for a fixed head assignment: (H, H, d, d) correlations -> (H, d, d) maps."""
    H = perm.shape[0]
    rows = torch.arange(H)
    dh = C_qk.shape[-1]
    maps = kernels.polar(torch.cat([C_qk[rows, perm], C_vo[rows, perm]])).reshape(2, H, dh, dh)
    return (nearest_rotary(C_qk[rows, perm], rotary_dim) if rotary_dim else maps[0]), maps[1]


def objective(pa: dict, pb: dict, names) -> float:
    """sum over parameters of <A_p, B_p>."""
    return float(sum((pa[n] * pb[n]).sum() for n in names))
