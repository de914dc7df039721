"""Group elements as tensors, and how they act on parameters.

An element is a dict of tensors, by group kind:
- permutation: {"perm": (n,)}; new[i] = old[perm[i]] along the axis.
- orthogonal:  {"matrix": (n, n)}; new = M @ old along the axis (M^{-T} = M on dual axes).
- heads:       {"perm": (H,), "qk": (H, d_h, d_h), "vo": (H, d_h, d_h)};
               new head i = A_i @ old head perm[i] (A_i^{-T} on dual axes).
"""
from __future__ import annotations

import torch

from .spec import Axis, Group, Spec

Element = dict[str, torch.Tensor]


def householder_basis(d: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """Symmetric orthogonal Q whose first column is 1/sqrt(d): maps e_1 <-> the ones direction."""
    u = torch.full((d,), d**-0.5, dtype=dtype, device=device)
    v = -u
    v[0] += 1.0
    if v.norm() < 1e-12:  # d == 1
        return torch.eye(d, dtype=dtype, device=device)
    return torch.eye(d, dtype=dtype, device=device) - 2.0 * torch.outer(v, v) / (v @ v)


def identity(group: Group, dtype=torch.float64, device=None) -> Element:
    if group.kind == "permutation":
        return {"perm": torch.arange(group.size, device=device)}
    if group.kind == "orthogonal":
        return {"matrix": torch.eye(group.size, dtype=dtype, device=device)}
    eye = torch.eye(group.head_dim, dtype=dtype, device=device).expand(group.n_heads, -1, -1).clone()
    return {"perm": torch.arange(group.n_heads, device=device), "qk": eye, "vo": eye.clone()}


def random_orthogonal(n: int, generator=None, dtype=torch.float64, batch=()) -> torch.Tensor:
    Q, R = torch.linalg.qr(torch.randn(*batch, n, n, generator=generator, dtype=torch.float64))
    Q = Q * torch.sign(torch.diagonal(R, dim1=-2, dim2=-1)).unsqueeze(-2)  # Haar-distributed
    return Q.to(dtype)


def random_invertible(n: int, generator=None, dtype=torch.float64, batch=(), max_cond: float = 10.0) -> torch.Tensor:
    """U diag(s) V^T with singular values in [1, max_cond ** 0.5]: condition number < max_cond."""
    U, V = random_orthogonal(n, generator, batch=batch), random_orthogonal(n, generator, batch=batch)
    s = 1.0 + (max_cond**0.5 - 1.0) * torch.rand(*batch, n, generator=generator, dtype=torch.float64)
    return ((U * s.unsqueeze(-2)) @ V.transpose(-1, -2)).to(dtype)


def centred_orthogonal(R_sub: torch.Tensor) -> torch.Tensor:
    """R = Q diag(1, R') Q^T: orthogonal with R 1 = 1, from R' in O(d - 1)."""
    d = R_sub.shape[-1] + 1
    Q = householder_basis(d, R_sub.dtype, R_sub.device)
    block = torch.zeros(d, d, dtype=R_sub.dtype, device=R_sub.device)
    block[0, 0] = 1.0
    block[1:, 1:] = R_sub
    return Q @ block @ Q.T


def random_element(group: Group, generator=None, dtype=torch.float64) -> Element:
    """A random element of the group (for planted tests and function-preservation checks)."""
    if group.kind == "permutation":
        return {"perm": torch.randperm(group.size, generator=generator)}
    if group.kind == "orthogonal":
        if group.centred:
            return {"matrix": centred_orthogonal(random_orthogonal(group.size - 1, generator, dtype))}
        return {"matrix": random_orthogonal(group.size, generator, dtype)}
    maker = random_orthogonal if group.head_map == "orthogonal" else random_invertible
    H, dh = group.n_heads, group.head_dim
    return {"perm": torch.randperm(H, generator=generator),
            "qk": maker(dh, generator, dtype, batch=(H,)), "vo": maker(dh, generator, dtype, batch=(H,))}


def _dual(group: Group, M: torch.Tensor) -> torch.Tensor:
    """M^{-T}: M itself for orthogonal maps."""
    if group.kind == "heads" and group.head_map == "invertible":
        return torch.linalg.inv(M).transpose(-1, -2)
    return M


def apply_axis(W: torch.Tensor, group: Group, ax: Axis, el: Element) -> torch.Tensor:
    Wt = W.movedim(ax.axis, 0)
    shape = Wt.shape
    flat = Wt.reshape(shape[0], -1)
    if group.kind == "permutation":
        out = flat[el["perm"].to(W.device)]
    elif group.kind == "orthogonal":
        out = el["matrix"].to(W) @ flat
    else:
        A = el[ax.circuit].to(W)
        T = _dual(group, A) if ax.dual else A
        heads = flat.reshape(group.n_heads, group.head_dim, -1)[el["perm"].to(W.device)]
        out = (T @ heads).reshape(shape[0], -1)
    return out.reshape(shape).movedim(0, ax.axis)


def apply_spec(spec: Spec, params: dict[str, torch.Tensor], elements: dict[str, Element],
               skip: set[str] = frozenset()) -> dict[str, torch.Tensor]:
    """g . params for the given elements (groups missing from `elements` or in `skip` act as
    identity; parameters missing from `params` are passed over, so a subset can be transformed)."""
    out = dict(params)
    for name, group in spec.groups.items():
        if name in skip or name not in elements:
            continue
        for ax in group.axes:
            if ax.param in out:
                out[ax.param] = apply_axis(out[ax.param], group, ax, elements[name])
    return out


def compose(group: Group, first: Element, second: Element) -> Element:
    """The element acting as `first` after `second`: (first . second) . theta = first . (second . theta)."""
    if group.kind == "permutation":
        return {"perm": second["perm"][first["perm"]]}
    if group.kind == "orthogonal":
        return {"matrix": first["matrix"] @ second["matrix"].to(first["matrix"])}
    p1 = first["perm"]
    return {"perm": second["perm"][p1],
            "qk": first["qk"] @ second["qk"].to(first["qk"])[p1],
            "vo": first["vo"] @ second["vo"].to(first["vo"])[p1]}


def inverse(group: Group, el: Element) -> Element:
    if group.kind == "permutation":
        return {"perm": torch.argsort(el["perm"])}
    if group.kind == "orthogonal":
        return {"matrix": el["matrix"].transpose(-1, -2).clone()}
    inv_perm = torch.argsort(el["perm"])
    inv = (lambda A: A.transpose(-1, -2)) if group.head_map == "orthogonal" else torch.linalg.inv
    return {"perm": inv_perm, "qk": inv(el["qk"][inv_perm]), "vo": inv(el["vo"][inv_perm])}
