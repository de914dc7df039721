"""Matching a heads group: attention heads permuted whole, with per-head QK / VO maps.

- statistic: per circuit the (H, H, d_h, d_h) correlations of every head of A with every head of
  B, sum over the circuit's axes (Q / K rows and biases for QK, V rows and O columns for VO); with
  grouped-query attention (G key / value heads of r query heads each) the query part "q"
  (G, r, G, r, d_h, d_h) apart from the key / value part "kv" (G, G, d_h, d_h). Whole-head
  permutations without maps (head_map "none", the raw-space baseline) use the scores
  S[i, j] = sum of <A head i, B head j> instead. From data: queries and keys (QK), values (VO).
- solve: score(i, j) = ||C_qk[i, j]||_* + ||C_vo[i, j]||_* (the best per-head orthogonal fit), an
  assignment over heads, then per-head Procrustes for the matched pairs; grouped-query: for every
  pair of groups an r x r assignment of their query heads, then a G x G assignment of groups on the
  key / value score plus the inner optimum, each group's maps by Procrustes on its summed
  correlations. Rotary models: QK maps one rotation per frequency plane (`nearest_rotary`), and a
  rotation of the unrotated dims with partial rotary.
- latent: a head-permutation latent per layer (and one per group for its query heads), and the
  QK / VO maps themselves: polar-projected when orthogonal, per-plane [[a, -b], [b, a]] blocks
  (normalised for rotations) for rotary QK maps.
"""
from __future__ import annotations

import torch

from ... import kernels
from ...symmetry.groups import KINDS
from ...symmetry.maps import nearest_rotary, rotary_map, rotary_parts
from ...symmetry.spec import NO_HEAD_MAP, Group
from .. import solve
from .base import Matcher, one_hot, permutation_ste, polar_ste, stacked


def _blocks(W: torch.Tensor, group: Group, ax) -> torch.Tensor:
    """(G, r, d_h, X) blocks of a query axis, (G, d_h, X) of a key / value axis (the kind's own
    reading, length-checked)."""
    return KINDS["heads"].blocks(solve.flat(W, ax.axis), group, ax)


def correlation(group: Group, pa: dict, pb: dict) -> dict:
    """Per circuit (H, H, d_h, d_h); with grouped-query attention per circuit its query part "qk_q"
    (G, r, G, r, d_h, d_h) and its key / value part "qk_kv" (G, G, d_h, d_h) (and "vo_q", "vo_kv")."""
    grouped = group.group_size > 1
    H, dh = group.n_heads, group.head_dim
    out = {}
    for circuit in ("qk", "vo"):
        parts = {"q": None, "kv": None}
        for ax in group.axes:
            if ax.circuit != circuit:
                continue
            if grouped and ax.query:
                term = torch.einsum("iuar,jvbr->iujvab", _blocks(pa[ax.param], group, ax),
                                    _blocks(pb[ax.param], group, ax))
                part = "q"
            else:
                a = solve.flat(pa[ax.param], ax.axis).reshape(H if ax.query else group.kv_heads, dh, -1)
                b = solve.flat(pb[ax.param], ax.axis).reshape(H if ax.query else group.kv_heads, dh, -1)
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
            a, b = _blocks(pa[ax.param], group, ax), _blocks(pb[ax.param], group, ax)
            if ax.query:
                S_q = S_q + torch.einsum("iuar,jvar->iujv", a, b)
            else:
                S_kv = S_kv + torch.einsum("iar,jar->ij", a, b)
        return S_q, S_kv
    H = group.n_heads
    S = None
    for ax in group.axes:
        term = solve.flat(pa[ax.param], ax.axis).reshape(H, -1) @ solve.flat(pb[ax.param], ax.axis).reshape(H, -1).T
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


def stack_correlations(cs: list[dict]) -> dict:
    """Per-layer correlation dicts -> one dict of (B, ...) tensors (None where a part is absent)."""
    return {k: (None if cs[0][k] is None else torch.stack([c[k] for c in cs])) for k in cs[0]}


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


def _head_term(a: torch.Tensor, b: torch.Tensor, heads: int, dh: int) -> torch.Tensor:
    return torch.einsum("nia,njb->ijab", stacked(a).reshape(-1, heads, dh), stacked(b).reshape(-1, heads, dh))


class HeadsMatcher(Matcher):
    kind = "heads"

    def batch_key(self, group):
        return (group.head_map, group.n_heads, group.kv_heads, group.head_dim, group.rotary_dim)

    def has_maps(self, group) -> bool:
        return group.head_map != NO_HEAD_MAP

    def correlation(self, group, pa: dict, pb: dict):
        return head_scores(group, pa, pb) if group.head_map == NO_HEAD_MAP else correlation(group, pa, pb)

    def activation_term(self, group, rec_a: dict, rec_b: dict) -> dict:
        """Queries and keys (QK), values (VO) of the group's layer, as `correlation` lays them out."""
        if group.head_map == NO_HEAD_MAP:
            raise ValueError(f"group {group.name!r}: whole-head permutations are matched on weights only")
        layer = group.name.split(".")[1]
        H, G, dh = group.n_heads, group.kv_heads, group.head_dim
        q, k, v = (f"{x}.{layer}" for x in "qkv")
        if G == H:
            return {"qk": _head_term(rec_a[q], rec_b[q], H, dh) + _head_term(rec_a[k], rec_b[k], H, dh),
                    "vo": _head_term(rec_a[v], rec_b[v], H, dh)}
        r = H // G
        qa, qb = stacked(rec_a[q]).reshape(-1, G, r, dh), stacked(rec_b[q]).reshape(-1, G, r, dh)
        return {"qk_q": torch.einsum("niua,njvb->iujvab", qa, qb), "qk_kv": _head_term(rec_a[k], rec_b[k], G, dh),
                "vo_q": None, "vo_kv": _head_term(rec_a[v], rec_b[v], G, dh)}

    def solve(self, groups, stats, *, warm=None, key=None, current=None) -> list[dict]:
        g = groups[0]
        n = len(groups)
        if g.head_map == NO_HEAD_MAP:  # whole heads: an assignment on the scores
            if current is not None:
                return list(current)
            if g.group_size > 1:
                perms, qperms = assign_grouped(torch.stack([s[0] for s in stats]), torch.stack([s[1] for s in stats]))
                return [{"perm": perms[i], "qperm": qperms[i]} for i in range(n)]
            return [{"perm": p} for p in solve.solve_permutations(torch.stack(stats), warm, key)]
        if g.group_size > 1:
            c = stack_correlations(stats)
            if current is None:
                perm, qperm, qk, vo = solve_grouped_heads(c, g.rotary_dim)
            else:
                perm = torch.stack([el["perm"] for el in current])
                qperm = torch.stack([el["qperm"] for el in current])
                qk, vo = grouped_head_maps(c, perm, qperm, g.rotary_dim)
            return [{"perm": perm[i], "qperm": qperm[i], "qk": qk[i], "vo": vo[i]} for i in range(n)]
        if current is not None:  # the assignment fixed: per-head Procrustes only
            out = []
            for c, el in zip(stats, current):
                qk, vo = solve_head_maps(c["qk"], c["vo"], el["perm"], g.rotary_dim)
                out.append({"perm": el["perm"], "qk": qk, "vo": vo})
            return out
        perm, qk, vo = solve_heads(torch.stack([c["qk"] for c in stats]), torch.stack([c["vo"] for c in stats]),
                                   g.rotary_dim)
        return [{"perm": perm[i], "qk": qk[i], "vo": vo[i]} for i in range(n)]

    def latent(self, groups, elements, dtype=torch.float32):
        return HeadsLatent(groups, elements, dtype)


class HeadsLatent(torch.nn.Module):
    """L layers' heads: (L, G, G) permutation latents, (L, G, r, r) query-head latents with
    grouped-query attention, (L, 2, G, d_h, d_h) QK and VO maps."""

    def __init__(self, groups, elements, dtype):
        super().__init__()
        g = groups[0]
        if g.head_map == NO_HEAD_MAP:
            raise ValueError("learned matching needs per-head maps (the canonical spec), not whole-head permutations")
        self.names = [x.name for x in groups]
        self.head_map, self.rotary_dim, self.grouped = g.head_map, g.rotary_dim, g.group_size > 1
        self.perm = torch.nn.Parameter(torch.stack([one_hot(el["perm"], dtype) for el in elements]))
        self.warm, self.warm_q = {}, {}  # assignment prices from the previous step
        if self.grouped:
            self.qperm = torch.nn.Parameter(torch.stack([one_hot(el["qperm"], dtype) for el in elements]))
        self.maps = torch.nn.Parameter(torch.stack([torch.stack([el["qk"], el["vo"]]) for el in elements]).to(dtype))

    def tags(self) -> dict:
        return {"perm": "permutation", "qperm": "permutation", "maps": "continuous"}

    def warm_parts(self) -> dict:
        out = {"perm": (self.warm, self.perm)}
        if self.grouped:
            out["qperm"] = (self.warm_q, self.qperm.flatten(0, 1))
        return out

    def project(self):
        P, perm = permutation_ste(self.perm, self.warm)
        dh = self.maps.shape[-1]
        qk, vo = self.maps[:, 0], self.maps[:, 1]
        orthogonal = self.head_map == "orthogonal"
        if orthogonal:
            vo = polar_ste(vo.reshape(-1, dh, dh)).reshape(vo.shape)
            if not self.rotary_dim:
                qk = polar_ste(qk.reshape(-1, dh, dh)).reshape(qk.shape)
        if self.rotary_dim:
            a, b, rest = rotary_parts(qk, self.rotary_dim)
            if orthogonal:
                norm = torch.sqrt(a * a + b * b).clamp_min(1e-12)
                a, b = a / norm, b / norm
                if rest is not None:
                    m = rest.shape[-1]
                    rest = polar_ste(rest.reshape(-1, m, m)).reshape(rest.shape)
            qk = rotary_map(a, b, rest)
        if self.grouped:
            QP, qperm = permutation_ste(self.qperm.flatten(0, 1), self.warm_q)
            QP, qperm = QP.reshape(self.qperm.shape), qperm.reshape(self.qperm.shape[:-1])
        dense, hard = [], []
        for i in range(len(self.names)):
            dense.append({"P": P[i], "qk": qk[i], "vo": vo[i]})
            hard.append({"perm": perm[i], "qk": qk[i].detach().double(), "vo": vo[i].detach().double()})
            if self.grouped:
                dense[-1]["QP"], hard[-1]["qperm"] = QP[i], qperm[i]
        return dense, hard
