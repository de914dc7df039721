"""The kinds of symmetry group, one class each: the algebra of their elements.

A `spec.Group` says where a group acts (its axes) and its sizes; its `kind` names one of the
classes below, which know what an element of that kind is and does:
`shapes`, `identity`, `random`, `validate`, `snap` (nearest exact element), `apply` (to one
axis of one parameter), `compose`, `inverse`, and `apply_dense` (the action of the dense,
differentiable form learned matching trains: permutation matrices instead of index vectors).
Matching (correlations and solvers) lives in match/solve.py, written against the same kinds.

- Permutation:  {"perm": (n,)}; new[i] = old[perm[i]] along the axis.
- Orthogonal:   {"matrix": (n, n)}; new = M @ old along the axis (M^{-T} = M on dual axes);
                centred groups keep the ones vector (R 1 = 1: LayerNorm residual streams).
- Heads:        {"perm": (G,), "qk": (G, d_h, d_h), "vo": (G, d_h, d_h)} for G key / value heads;
                new head i = A_i @ old head perm[i] (A_i^{-T} on dual axes). With r = H / G > 1
                query heads per key / value head (grouped-query attention) also "qperm" (G, r):
                new query head (i, j) = old (perm[i], qperm[i, j]), each moved by its group's map.
                head_map "orthogonal" | "invertible" | "none" (whole heads only, no maps);
                rotary groups: QK maps commute with RoPE, one [[a, -b], [b, a]] per frequency plane of
                the first rotary_dim dims, any map of the rest (partial rotary).
"""
from __future__ import annotations

import math

import torch

from .maps import (centred_orthogonal, householder_basis, nearest_orthogonal, random_invertible, random_orthogonal,
                   random_rotary, rotary_map, rotary_parts)
from .spec import NO_HEAD_MAP, Axis, Group

Element = dict[str, torch.Tensor]

# ||Q^T Q - I||_max allowed for an orthogonal map stored in each dtype (float32 rounding of an
# exactly orthogonal d <= 4096 matrix stays well below 1e-5; float64 below 1e-12).
ORTHOGONAL_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}
# Invertible head maps above this condition number amplify rounding into a changed function.
MAX_CONDITION = 1e8


class InvalidAlignmentError(ValueError):
    """An alignment element (or file) that is not a valid group element."""


# ---------------------------------------------------------------- checks shared by the kinds
def fail(group: Group, message: str):
    raise InvalidAlignmentError(f"group {group.name!r}: {message}")


def check_permutation(group: Group, key: str, perm: torch.Tensor) -> None:
    """An integer bijection of range(n) (the spec's groups are square: a narrower model is
    zero-padded first, so a semi-permutation is stored as a full one)."""
    if perm.dtype == torch.bool or perm.is_floating_point() or perm.is_complex():
        fail(group, f"permutation {key!r} must hold integers, got {perm.dtype}")
    n = perm.numel()
    if n == 0:
        return
    lo, hi = int(perm.min()), int(perm.max())
    if lo < 0:
        fail(group, f"permutation {key!r} holds negative index {lo}")
    if hi >= n:
        fail(group, f"permutation {key!r} holds index {hi}, out of range for size {n}")
    counts = torch.bincount(perm.reshape(-1).long(), minlength=n)
    if (counts != 1).any():
        dup = int(torch.argmax(counts))
        fail(group, f"permutation {key!r} is not a bijection: index {dup} appears {int(counts[dup])} times")


def check_float(group: Group, key: str, t: torch.Tensor) -> None:
    if t.dtype not in ORTHOGONAL_TOLERANCE:
        fail(group, f"{key!r} must be float32 or float64, got {t.dtype}")
    bad = ~torch.isfinite(t)
    if bad.any():
        fail(group, f"{key!r} holds {int(bad.sum())} NaN or inf values")


def _worst(errors: torch.Tensor) -> tuple[float, str]:
    """The largest per-map error and, for a batch of head maps, which head it is."""
    flat = errors.reshape(-1)
    i = int(torch.argmax(flat))
    return float(flat[i]), (f" (head {i})" if errors.dim() > 0 else "")


def check_orthogonal(group: Group, key: str, M: torch.Tensor, centred: bool = False) -> None:
    """Q^T Q = I (and R 1 = 1 for the centred residual group), measured in float64."""
    tol = ORTHOGONAL_TOLERANCE[M.dtype]
    Q = M.to(torch.float64)
    eye = torch.eye(Q.shape[-1], dtype=Q.dtype, device=Q.device)
    err, where = _worst((Q.transpose(-1, -2) @ Q - eye).abs().amax(dim=(-2, -1)))
    if not err <= tol:
        fail(group, f"{key!r} is not orthogonal{where}: max|Q^T Q - I| = {err:.3g} > {tol:g}")
    if centred:
        ones = torch.ones(Q.shape[-1], dtype=Q.dtype, device=Q.device)
        err, _ = _worst((Q @ ones - ones).abs().amax(dim=-1))
        if not err <= tol:
            fail(group, f"{key!r} does not keep the all-ones direction (LayerNorm residual): "
                        f"max|R 1 - 1| = {err:.3g} > {tol:g}")


def check_rotary(group: Group, key: str, M: torch.Tensor) -> None:
    """Zero outside the planes (and the unrotated block) and [[a, -b], [b, a]] on each plane: the maps
    that commute with RoPE."""
    tol = ORTHOGONAL_TOLERANCE[M.dtype]
    Q = M.to(torch.float64)
    off = (Q - rotary_map(*rotary_parts(Q, group.rotary_dim))).abs().amax(dim=(-2, -1))
    err, where = _worst(off / Q.abs().amax(dim=(-2, -1)).clamp_min(1e-300))
    if not err <= tol:
        fail(group, f"{key!r} does not commute with the rotary positions{where}: it is not one "
                    f"rotation (and scale) per frequency plane (relative error {err:.3g} > {tol:g})")


def check_invertible(group: Group, key: str, M: torch.Tensor) -> None:
    s = torch.linalg.svdvals(M.to(torch.float64))
    cond = torch.where(s[..., -1] > 0, s[..., 0] / s[..., -1], torch.full_like(s[..., 0], math.inf))
    worst, where = _worst(cond)
    if not worst < MAX_CONDITION:
        fail(group, f"{key!r} is singular or ill-conditioned{where}: condition number {worst:.3g} "
                    f">= {MAX_CONDITION:g}")


class _OneHotRows(torch.autograd.Function):
    """P @ flat where P (n, n) is the one-hot matrix of `perm` (P[i, perm[i]] = 1) in value but carries
    gradients (a straight-through latent): a gather forward (n x rest reads instead of an n x n x rest
    product), and backward the matmul's own gradients, G flat^T for P and P^T G (a scatter) for flat."""

    @staticmethod
    def forward(ctx, P, perm, flat):
        ctx.save_for_backward(perm, flat if ctx.needs_input_grad[0] else None)
        return flat.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad):
        perm, flat = ctx.saved_tensors
        grad_P = grad @ flat.transpose(0, 1) if ctx.needs_input_grad[0] else None
        grad_flat = torch.zeros_like(grad).index_copy_(0, perm, grad) if ctx.needs_input_grad[2] else None
        return grad_P, None, grad_flat


# ---------------------------------------------------------------- the kinds
class Permutation:
    """MLP units, and the residual stream of the raw-space baseline."""

    def shapes(self, g: Group) -> dict:
        return {"perm": (g.size,)}

    def identity(self, g: Group, dtype=torch.float64, device=None) -> Element:
        return {"perm": torch.arange(g.size, device=device)}

    def random(self, g: Group, generator=None, dtype=torch.float64) -> Element:
        return {"perm": torch.randperm(g.size, generator=generator)}

    def validate(self, g: Group, el: Element) -> None:
        check_permutation(g, "perm", el["perm"])

    def snap(self, g: Group, el: Element) -> Element:
        return {"perm": el["perm"].long()}

    def apply(self, flat: torch.Tensor, g: Group, ax: Axis, el: Element) -> torch.Tensor:
        return flat[el["perm"].to(flat.device)]

    def compose(self, g: Group, first: Element, second: Element) -> Element:
        return {"perm": second["perm"][first["perm"]]}

    def inverse(self, g: Group, el: Element) -> Element:
        return {"perm": torch.argsort(el["perm"])}

    def apply_dense(self, flat: torch.Tensor, g: Group, ax: Axis, dense: dict) -> torch.Tensor:
        """dense: "P" (n, n), and "perm" where P is that permutation's one-hot matrix in value (a
        straight-through latent's): then the product is a gather with the same values and gradients."""
        if "perm" in dense:
            return _OneHotRows.apply(dense["P"], dense["perm"].to(flat.device), flat)
        return dense["P"] @ flat


class Orthogonal:
    """The residual stream's rotation (centred: R 1 = 1, for LayerNorm models)."""

    def shapes(self, g: Group) -> dict:
        return {"matrix": (g.size, g.size)}

    def identity(self, g: Group, dtype=torch.float64, device=None) -> Element:
        return {"matrix": torch.eye(g.size, dtype=dtype, device=device)}

    def random(self, g: Group, generator=None, dtype=torch.float64) -> Element:
        if g.centred:
            return {"matrix": centred_orthogonal(random_orthogonal(g.size - 1, generator, dtype))}
        return {"matrix": random_orthogonal(g.size, generator, dtype)}

    def validate(self, g: Group, el: Element) -> None:
        check_float(g, "matrix", el["matrix"])
        check_orthogonal(g, "matrix", el["matrix"], centred=g.centred)

    def snap(self, g: Group, el: Element) -> Element:
        M = el["matrix"].to(torch.float64)
        if g.centred:
            Q = householder_basis(M.shape[0], M.dtype, M.device)
            return {"matrix": centred_orthogonal(nearest_orthogonal((Q @ M @ Q)[1:, 1:]))}
        return {"matrix": nearest_orthogonal(M)}

    def apply(self, flat: torch.Tensor, g: Group, ax: Axis, el: Element) -> torch.Tensor:
        return el["matrix"].to(flat) @ flat

    def compose(self, g: Group, first: Element, second: Element) -> Element:
        return {"matrix": first["matrix"] @ second["matrix"].to(first["matrix"])}

    def inverse(self, g: Group, el: Element) -> Element:
        return {"matrix": el["matrix"].transpose(-1, -2).clone()}

    def apply_dense(self, flat: torch.Tensor, g: Group, ax: Axis, dense: dict) -> torch.Tensor:
        return dense["R"] @ flat


class Heads:
    """Attention heads: whole-head (and grouped-query) permutations with per-head QK / VO maps."""

    @staticmethod
    def _perm_only(g: Group) -> bool:
        return g.head_map == NO_HEAD_MAP

    def shapes(self, g: Group) -> dict:
        G, r, dh = g.kv_heads, g.group_size, g.head_dim
        perms = {"perm": (G,), **({"qperm": (G, r)} if r > 1 else {})}
        return perms if self._perm_only(g) else {**perms, "qk": (G, dh, dh), "vo": (G, dh, dh)}

    def _perms(self, g: Group, device=None, random: bool = False, generator=None) -> Element:
        """"perm" (and "qperm" with grouped-query attention): the identity, or random ones."""
        G, r = g.kv_heads, g.group_size
        if not random:
            out = {"perm": torch.arange(G, device=device)}
            if r > 1:
                out["qperm"] = torch.arange(r, device=device).expand(G, -1).clone()
            return out
        out = {"perm": torch.randperm(G, generator=generator)}
        if r > 1:
            out["qperm"] = torch.stack([torch.randperm(r, generator=generator) for _ in range(G)])
        return out

    def identity(self, g: Group, dtype=torch.float64, device=None) -> Element:
        perms = self._perms(g, device)
        if self._perm_only(g):
            return perms
        eye = torch.eye(g.head_dim, dtype=dtype, device=device).expand(g.kv_heads, -1, -1).clone()
        return {**perms, "qk": eye, "vo": eye.clone()}

    def random(self, g: Group, generator=None, dtype=torch.float64) -> Element:
        perms = self._perms(g, random=True, generator=generator)
        if self._perm_only(g):
            return perms
        maker = random_orthogonal if g.head_map == "orthogonal" else random_invertible
        G, dh = g.kv_heads, g.head_dim
        qk = (random_rotary(dh, generator, dtype, batch=(G,), invertible=g.head_map == "invertible",
                            rotary_dim=g.rotary_dim)
              if g.rotary else maker(dh, generator, dtype, batch=(G,)))
        return {**perms, "qk": qk, "vo": maker(dh, generator, dtype, batch=(G,))}

    def validate(self, g: Group, el: Element) -> None:
        check_permutation(g, "perm", el["perm"])
        for i, row in enumerate(el.get("qperm", ())):
            check_permutation(g, f"qperm[{i}]", row)
        if self._perm_only(g):
            return
        for key in ("qk", "vo"):
            check_float(g, key, el[key])
            if g.head_map == "orthogonal":
                check_orthogonal(g, key, el[key])
            else:
                check_invertible(g, key, el[key])
        if g.rotary:
            check_rotary(g, "qk", el["qk"])

    def snap(self, g: Group, el: Element) -> Element:
        out = {k: (v.long() if k in ("perm", "qperm") else v.to(torch.float64)) for k, v in el.items()}
        if self._perm_only(g):
            return out
        if g.head_map == "orthogonal":
            out["qk"], out["vo"] = nearest_orthogonal(out["qk"]), nearest_orthogonal(out["vo"])
        if g.rotary:  # the nearest map of the rotary structure (nearest_orthogonal kept `rest` orthogonal)
            a, b, rest = rotary_parts(out["qk"], g.rotary_dim)
            if g.head_map == "orthogonal":
                norm = torch.sqrt(a * a + b * b).clamp_min(1e-300)
                a, b = a / norm, b / norm
                rest = None if rest is None else nearest_orthogonal(rest)
            out["qk"] = rotary_map(a, b, rest)
        return out

    def _dual(self, g: Group, M: torch.Tensor) -> torch.Tensor:
        """M^{-T}: M itself for orthogonal maps."""
        return torch.linalg.inv(M).transpose(-1, -2) if g.head_map == "invertible" else M

    def blocks(self, flat: torch.Tensor, g: Group, ax: Axis) -> torch.Tensor:
        """(G, d_h, X) blocks of a key / value axis, (G, r, d_h, X) of a query axis (Q rows, O columns);
        the axis's length is checked, so a grouped K is never read as one block per query head."""
        G, r, dh = g.kv_heads, g.group_size, g.head_dim
        n_blocks = G * r if ax.query else G
        if flat.shape[0] != n_blocks * dh:
            raise InvalidAlignmentError(f"group {g.name!r}: {ax.param} axis {ax.axis} has {flat.shape[0]} entries, "
                                        f"not {n_blocks} heads x {dh}")
        return flat.reshape(G, r, dh, -1) if ax.query else flat.reshape(G, dh, -1)

    def _gather(self, flat: torch.Tensor, g: Group, ax: Axis, el: Element) -> torch.Tensor:
        """The axis's head blocks in their new order."""
        blocks = self.blocks(flat, g, ax)[el["perm"].to(flat.device)]
        if ax.query and "qperm" in el:  # row i of qperm orders the query heads of new group i
            idx = el["qperm"].to(flat.device)
            blocks = blocks.gather(1, idx[:, :, None, None].expand(-1, -1, g.head_dim, blocks.shape[-1]))
        return blocks

    def apply(self, flat: torch.Tensor, g: Group, ax: Axis, el: Element) -> torch.Tensor:
        heads = self._gather(flat, g, ax, el)
        if self._perm_only(g):
            return heads.reshape(flat.shape[0], -1)
        A = el[ax.circuit].to(flat)
        T = self._dual(g, A) if ax.dual else A
        return ((T.unsqueeze(1) if ax.query else T) @ heads).reshape(flat.shape[0], -1)

    def compose(self, g: Group, first: Element, second: Element) -> Element:
        p1 = first["perm"]
        out = {"perm": second["perm"][p1]}
        if "qperm" in first:  # new (i, j) = old (second.perm[p1[i]], second.qperm[p1[i], first.qperm[i, j]])
            out["qperm"] = second["qperm"][p1].gather(1, first["qperm"])
        if self._perm_only(g):
            return out
        return {**out, "qk": first["qk"] @ second["qk"].to(first["qk"])[p1],
                "vo": first["vo"] @ second["vo"].to(first["vo"])[p1]}

    def inverse(self, g: Group, el: Element) -> Element:
        inv_perm = torch.argsort(el["perm"])
        out = {"perm": inv_perm}
        if "qperm" in el:
            out["qperm"] = torch.argsort(el["qperm"][inv_perm], dim=1)
        if self._perm_only(g):
            return out
        inv = (lambda A: A.transpose(-1, -2)) if g.head_map == "orthogonal" else torch.linalg.inv
        return {**out, "qk": inv(el["qk"][inv_perm]), "vo": inv(el["vo"][inv_perm])}

    def apply_dense(self, flat: torch.Tensor, g: Group, ax: Axis, dense: dict) -> torch.Tensor:
        """dense: "P" (G, G) group permutation matrix, "QP" (G, r, r) query permutations within groups
        (grouped-query attention), "qk" / "vo" (G, d_h, d_h) maps."""
        A = dense[ax.circuit]
        if ax.dual and g.head_map == "invertible":
            A = torch.linalg.inv(A).transpose(-1, -2)
        blocks = self.blocks(flat, g, ax)
        if ax.query and g.group_size > 1:  # groups moved, then query heads within each new group
            heads = torch.einsum("iuv,ivar->iuar", dense["QP"], torch.einsum("ij,juar->iuar", dense["P"], blocks))
            return (A.unsqueeze(1) @ heads).reshape(flat.shape[0], -1)
        heads = torch.einsum("ij,jar->iar", dense["P"], blocks.reshape(-1, g.head_dim, blocks.shape[-1]))
        return (A @ heads).reshape(flat.shape[0], -1)


#: group.kind -> its class; a new kind of symmetry is one class here and its solver in match/solve.py
KINDS = {"permutation": Permutation(), "orthogonal": Orthogonal(), "heads": Heads()}


def kind_of(group: Group):
    return KINDS[group.kind]


__all__ = ["Element", "Heads", "InvalidAlignmentError", "KINDS", "MAX_CONDITION", "ORTHOGONAL_TOLERANCE",
           "Orthogonal", "Permutation", "kind_of"]
