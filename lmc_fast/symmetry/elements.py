"""Group elements as tensors, and how they act on parameters.

An element is a dict of tensors, by group kind:
- permutation: {"perm": (n,)}; new[i] = old[perm[i]] along the axis.
- orthogonal:  {"matrix": (n, n)}; new = M @ old along the axis (M^{-T} = M on dual axes).
- heads:       {"perm": (H,), "qk": (H, d_h, d_h), "vo": (H, d_h, d_h)};
               new head i = A_i @ old head perm[i] (A_i^{-T} on dual axes);
               with head_map "none" (raw-space head permutation): {"perm": (H,)} only,
               new head i = old head perm[i].
  Grouped-query attention (G key / value heads, r = H / G query heads each): "perm" (G,) moves
  key / value heads with their query heads, "qperm" (G, r) permutes query heads within a group
  (new query head (i, j) = old (perm[i], qperm[i, j])), and "qk", "vo" hold one map per key /
  value head (G, d_h, d_h), applied to every query head of the group.
  Rotary models: each QK map commutes with RoPE: per frequency plane (dimensions p and p + d_h/2)
  the 2x2 block [[a, -b], [b, a]] (a rotation; with invertible head maps a rotation and scale),
  zero elsewhere; stored dense like any head map.
"""
from __future__ import annotations

import math

import torch

from .spec import NO_HEAD_MAP, Axis, Group, Spec

Element = dict[str, torch.Tensor]

# ||Q^T Q - I||_max allowed for an orthogonal map stored in each dtype (float32 rounding of an
# exactly orthogonal d <= 4096 matrix stays well below 1e-5; float64 below 1e-12).
ORTHOGONAL_TOLERANCE = {torch.float32: 1e-5, torch.float64: 1e-10}
# Invertible head maps above this condition number amplify rounding into a changed function.
MAX_CONDITION = 1e8


class InvalidAlignmentError(ValueError):
    """An alignment element (or file) that is not a valid group element."""


def _perm_only(group: Group) -> bool:
    """A heads group whose elements are whole-head permutations (no per-head maps)."""
    return group.kind == "heads" and group.head_map == NO_HEAD_MAP


def householder_basis(d: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """Symmetric orthogonal Q whose first column is 1/sqrt(d): maps e_1 <-> the ones direction."""
    u = torch.full((d,), d**-0.5, dtype=dtype, device=device)
    v = -u
    v[0] += 1.0
    if v.norm() < 1e-12:  # d == 1
        return torch.eye(d, dtype=dtype, device=device)
    return torch.eye(d, dtype=dtype, device=device) - 2.0 * torch.outer(v, v) / (v @ v)


def _head_perms(group: Group, device=None, random: bool = False, generator=None) -> Element:
    """"perm" (and "qperm" with grouped-query attention): the identity, or random ones."""
    G, r = group.kv_heads, group.group_size
    if not random:
        out = {"perm": torch.arange(G, device=device)}
        if r > 1:
            out["qperm"] = torch.arange(r, device=device).expand(G, -1).clone()
        return out
    out = {"perm": torch.randperm(G, generator=generator)}
    if r > 1:
        out["qperm"] = torch.stack([torch.randperm(r, generator=generator) for _ in range(G)])
    return out


def identity(group: Group, dtype=torch.float64, device=None) -> Element:
    if group.kind == "permutation":
        return {"perm": torch.arange(group.size, device=device)}
    if group.kind == "orthogonal":
        return {"matrix": torch.eye(group.size, dtype=dtype, device=device)}
    if _perm_only(group):
        return _head_perms(group, device)
    eye = torch.eye(group.head_dim, dtype=dtype, device=device).expand(group.kv_heads, -1, -1).clone()
    return {**_head_perms(group, device), "qk": eye, "vo": eye.clone()}


# ---------------------------------------------------------------- maps that commute with RoPE
def rotary_map(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """(..., d_h / 2) plane coefficients -> (..., d_h, d_h): [[a, -b], [b, a]] on each plane (p, p + d_h/2)."""
    half = a.shape[-1]
    M = torch.zeros(*a.shape[:-1], 2 * half, 2 * half, dtype=a.dtype, device=a.device)
    i = torch.arange(half, device=a.device)
    M[..., i, i] = a
    M[..., i + half, i + half] = a
    M[..., i + half, i] = b
    M[..., i, i + half] = -b
    return M


def rotary_parts(M: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The plane coefficients (a, b) nearest to M (least squares): the inverse of `rotary_map`."""
    half = M.shape[-1] // 2
    i = torch.arange(half, device=M.device)
    a = 0.5 * (M[..., i, i] + M[..., i + half, i + half])
    b = 0.5 * (M[..., i + half, i] - M[..., i, i + half])
    return a, b


def random_rotary(half: int, generator=None, dtype=torch.float64, batch=(), invertible: bool = False,
                  max_cond: float = 10.0) -> torch.Tensor:
    """Random maps commuting with RoPE: a rotation per plane (times a scale in [1, max_cond ** 0.5])."""
    angle = 2 * math.pi * torch.rand(*batch, half, generator=generator, dtype=torch.float64)
    scale = (1.0 + (max_cond**0.5 - 1.0) * torch.rand(*batch, half, generator=generator, dtype=torch.float64)
             if invertible else torch.ones(*batch, half, dtype=torch.float64))
    return rotary_map(scale * angle.cos(), scale * angle.sin()).to(dtype)


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
    perms = _head_perms(group, random=True, generator=generator)
    if _perm_only(group):
        return perms
    maker = random_orthogonal if group.head_map == "orthogonal" else random_invertible
    G, dh = group.kv_heads, group.head_dim
    qk = (random_rotary(dh // 2, generator, dtype, batch=(G,), invertible=group.head_map == "invertible")
          if group.rotary else maker(dh, generator, dtype, batch=(G,)))
    return {**perms, "qk": qk, "vo": maker(dh, generator, dtype, batch=(G,))}


# ------------------------------------------------------------------ validation
def expected_shapes(group: Group) -> dict[str, tuple[int, ...]]:
    """The entries of an element of `group` and their shapes."""
    if group.kind == "permutation":
        return {"perm": (group.size,)}
    if group.kind == "orthogonal":
        return {"matrix": (group.size, group.size)}
    G, r, dh = group.kv_heads, group.group_size, group.head_dim
    perms = {"perm": (G,), **({"qperm": (G, r)} if r > 1 else {})}
    if _perm_only(group):
        return perms
    return {**perms, "qk": (G, dh, dh), "vo": (G, dh, dh)}


def _fail(group: Group, message: str):
    raise InvalidAlignmentError(f"group {group.name!r}: {message}")


def _check_entries(group: Group, el) -> None:
    if not isinstance(el, dict):
        _fail(group, f"element must be a dict of tensors, got {type(el).__name__}")
    want = expected_shapes(group)
    missing, extra = sorted(set(want) - set(el)), sorted(set(el) - set(want))
    if missing:
        _fail(group, f"{group.kind} element lacks {missing}")
    if extra:
        _fail(group, f"{group.kind} element has unexpected entries {extra}")
    for key, shape in want.items():
        t = el[key]
        if not isinstance(t, torch.Tensor):
            _fail(group, f"{key!r} must be a tensor, got {type(t).__name__}")
        if tuple(t.shape) != shape:
            _fail(group, f"{key!r} has shape {tuple(t.shape)}, expected {shape}")


def _check_permutation(group: Group, key: str, perm: torch.Tensor) -> None:
    """An integer bijection of range(n) (the spec's groups are square: a narrower model is
    zero-padded first, so a semi-permutation is stored as a full one)."""
    if perm.dtype == torch.bool or perm.is_floating_point() or perm.is_complex():
        _fail(group, f"permutation {key!r} must hold integers, got {perm.dtype}")
    n = perm.numel()
    if n == 0:
        return
    lo, hi = int(perm.min()), int(perm.max())
    if lo < 0:
        _fail(group, f"permutation {key!r} holds negative index {lo}")
    if hi >= n:
        _fail(group, f"permutation {key!r} holds index {hi}, out of range for size {n}")
    counts = torch.bincount(perm.reshape(-1).long(), minlength=n)
    if (counts != 1).any():
        dup = int(torch.argmax(counts))
        _fail(group, f"permutation {key!r} is not a bijection: index {dup} appears {int(counts[dup])} times")


def _check_float(group: Group, key: str, t: torch.Tensor) -> None:
    if t.dtype not in ORTHOGONAL_TOLERANCE:
        _fail(group, f"{key!r} must be float32 or float64, got {t.dtype}")
    bad = ~torch.isfinite(t)
    if bad.any():
        _fail(group, f"{key!r} holds {int(bad.sum())} NaN or inf values")


def _worst(errors: torch.Tensor) -> tuple[float, str]:
    """The largest per-map error and, for a batch of head maps, which head it is."""
    flat = errors.reshape(-1)
    i = int(torch.argmax(flat))
    return float(flat[i]), (f" (head {i})" if errors.dim() > 0 else "")


def _check_orthogonal(group: Group, key: str, M: torch.Tensor, centred: bool = False) -> None:
    """Q^T Q = I (and R 1 = 1 for the centred residual group), measured in float64."""
    tol = ORTHOGONAL_TOLERANCE[M.dtype]
    Q = M.to(torch.float64)
    eye = torch.eye(Q.shape[-1], dtype=Q.dtype, device=Q.device)
    err, where = _worst((Q.transpose(-1, -2) @ Q - eye).abs().amax(dim=(-2, -1)))
    if not err <= tol:
        _fail(group, f"{key!r} is not orthogonal{where}: max|Q^T Q - I| = {err:.3g} > {tol:g}")
    if centred:
        ones = torch.ones(Q.shape[-1], dtype=Q.dtype, device=Q.device)
        err, _ = _worst((Q @ ones - ones).abs().amax(dim=-1))
        if not err <= tol:
            _fail(group, f"{key!r} does not keep the all-ones direction (LayerNorm residual): "
                         f"max|R 1 - 1| = {err:.3g} > {tol:g}")


def _check_rotary(group: Group, key: str, M: torch.Tensor) -> None:
    """Zero outside the planes and [[a, -b], [b, a]] on each: the maps that commute with RoPE."""
    tol = ORTHOGONAL_TOLERANCE[M.dtype]
    Q = M.to(torch.float64)
    off = (Q - rotary_map(*rotary_parts(Q))).abs().amax(dim=(-2, -1))
    err, where = _worst(off / Q.abs().amax(dim=(-2, -1)).clamp_min(1e-300))
    if not err <= tol:
        _fail(group, f"{key!r} does not commute with the rotary positions{where}: it is not one "
                     f"rotation (and scale) per frequency plane (relative error {err:.3g} > {tol:g})")


def _check_invertible(group: Group, key: str, M: torch.Tensor) -> None:
    s = torch.linalg.svdvals(M.to(torch.float64))
    cond = torch.where(s[..., -1] > 0, s[..., 0] / s[..., -1], torch.full_like(s[..., 0], math.inf))
    worst, where = _worst(cond)
    if not worst < MAX_CONDITION:
        _fail(group, f"{key!r} is singular or ill-conditioned{where}: condition number {worst:.3g} "
                     f">= {MAX_CONDITION:g}")


def validate(group: Group, el: Element) -> None:
    """Raise InvalidAlignmentError (naming the group, the problem and the measured number)
    unless `el` is an element of `group`: right entries and shapes, permutations that are
    bijections, orthogonal maps orthogonal to the dtype's tolerance, invertible maps finite
    and well conditioned. Each check is batched over heads."""
    _check_entries(group, el)
    if group.kind == "permutation":
        _check_permutation(group, "perm", el["perm"])
        return
    if group.kind == "orthogonal":
        _check_float(group, "matrix", el["matrix"])
        _check_orthogonal(group, "matrix", el["matrix"], centred=group.centred)
        return
    _check_permutation(group, "perm", el["perm"])
    for i, row in enumerate(el.get("qperm", ())):
        _check_permutation(group, f"qperm[{i}]", row)
    if _perm_only(group):
        return
    for key in ("qk", "vo"):
        _check_float(group, key, el[key])
        if group.head_map == "orthogonal":
            _check_orthogonal(group, key, el[key])
        else:
            _check_invertible(group, key, el[key])
    if group.rotary:
        _check_rotary(group, "qk", el["qk"])


def _nearest_orthogonal(M: torch.Tensor) -> torch.Tensor:
    U, _, Vh = torch.linalg.svd(M)
    return U @ Vh


def snap(group: Group, el: Element) -> Element:
    """`el` moved onto the group in float64 (nearest orthogonal maps, keeping R 1 = 1 where
    the group is centred): for elements computed in float32, e.g. by learned matching."""
    out = {k: (v.long() if k in ("perm", "qperm") else v.to(torch.float64)) for k, v in el.items()}
    if group.kind == "orthogonal":
        M = out["matrix"]
        if group.centred:
            Q = householder_basis(M.shape[0], M.dtype, M.device)
            out["matrix"] = centred_orthogonal(_nearest_orthogonal((Q @ M @ Q)[1:, 1:]))
        else:
            out["matrix"] = _nearest_orthogonal(M)
    elif group.kind == "heads" and group.head_map == "orthogonal":
        out["qk"], out["vo"] = _nearest_orthogonal(out["qk"]), _nearest_orthogonal(out["vo"])
    if group.kind == "heads" and group.rotary and "qk" in out:
        a, b = rotary_parts(out["qk"])
        if group.head_map == "orthogonal":
            norm = torch.sqrt(a * a + b * b).clamp_min(1e-300)
            a, b = a / norm, b / norm
        out["qk"] = rotary_map(a, b)
    return out


def nearest_rotary(C: torch.Tensor) -> torch.Tensor:
    """The RoPE-commuting rotation M (one per plane) maximising tr(M^T C): per plane the angle of
    (C_pp + C_qq, C_qp - C_pq), q = p + d_h/2."""
    a, b = rotary_parts(C)
    norm = torch.sqrt(a * a + b * b)
    flat = norm == 0  # no signal in this plane: the identity
    a = torch.where(flat, torch.ones_like(a), a / norm.clamp_min(1e-300))
    b = torch.where(flat, torch.zeros_like(b), b / norm.clamp_min(1e-300))
    return rotary_map(a, b)


def _dual(group: Group, M: torch.Tensor) -> torch.Tensor:
    """M^{-T}: M itself for orthogonal maps."""
    if group.kind == "heads" and group.head_map == "invertible":
        return torch.linalg.inv(M).transpose(-1, -2)
    return M


def _gather_heads(flat: torch.Tensor, group: Group, ax: Axis, el: Element) -> torch.Tensor:
    """The axis's head blocks in their new order: (G, d_h, X) for key / value axes, (G, r, d_h, X)
    for query axes (Q rows, O columns)."""
    G, r, dh = group.kv_heads, group.group_size, group.head_dim
    n_blocks = G * r if ax.query else G
    if flat.shape[0] != n_blocks * dh:  # e.g. grouped-query K rows read as one block per query head
        raise InvalidAlignmentError(f"group {group.name!r}: {ax.param} axis {ax.axis} has {flat.shape[0]} entries, "
                                    f"not {n_blocks} heads x {dh}")
    perm = el["perm"].to(flat.device)
    if not ax.query:
        return flat.reshape(G, dh, -1)[perm]
    blocks = flat.reshape(G, r, dh, -1)[perm]
    if "qperm" in el:
        idx = el["qperm"].to(flat.device)[perm.new_tensor(range(G))]  # (G, r): row i for new group i
        blocks = blocks.gather(1, idx[:, :, None, None].expand(-1, -1, dh, blocks.shape[-1]))
    return blocks


def apply_axis(W: torch.Tensor, group: Group, ax: Axis, el: Element) -> torch.Tensor:
    Wt = W.movedim(ax.axis, 0)
    shape = Wt.shape
    flat = Wt.reshape(shape[0], -1)
    if group.kind == "permutation":
        out = flat[el["perm"].to(W.device)]
    elif group.kind == "orthogonal":
        out = el["matrix"].to(W) @ flat
    elif _perm_only(group):
        out = _gather_heads(flat, group, ax, el).reshape(shape[0], -1)
    else:
        A = el[ax.circuit].to(W)
        T = _dual(group, A) if ax.dual else A
        heads = _gather_heads(flat, group, ax, el)
        out = ((T.unsqueeze(1) if ax.query else T) @ heads).reshape(shape[0], -1)
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
    out = {"perm": second["perm"][p1]}
    if "qperm" in first:  # new query head (i, j) = old (second.perm[p1[i]], second.qperm[p1[i], first.qperm[i, j]])
        out["qperm"] = second["qperm"][p1].gather(1, first["qperm"])
    if _perm_only(group):
        return out
    return {**out, "qk": first["qk"] @ second["qk"].to(first["qk"])[p1],
            "vo": first["vo"] @ second["vo"].to(first["vo"])[p1]}


def inverse(group: Group, el: Element) -> Element:
    if group.kind == "permutation":
        return {"perm": torch.argsort(el["perm"])}
    if group.kind == "orthogonal":
        return {"matrix": el["matrix"].transpose(-1, -2).clone()}
    inv_perm = torch.argsort(el["perm"])
    out = {"perm": inv_perm}
    if "qperm" in el:
        out["qperm"] = torch.argsort(el["qperm"][inv_perm], dim=1)
    if _perm_only(group):
        return out
    inv = (lambda A: A.transpose(-1, -2)) if group.head_map == "orthogonal" else torch.linalg.inv
    return {**out, "qk": inv(el["qk"][inv_perm]), "vo": inv(el["vo"][inv_perm])}
