"""Group elements as tensors, and how they act on parameters.

An element is a dict of tensors, by group kind:
- permutation: {"perm": (n,)}; new[i] = old[perm[i]] along the axis.
- orthogonal:  {"matrix": (n, n)}; new = M @ old along the axis (M^{-T} = M on dual axes).
- heads:       {"perm": (H,), "qk": (H, d_h, d_h), "vo": (H, d_h, d_h)};
               new head i = A_i @ old head perm[i] (A_i^{-T} on dual axes);
               with head_map "none" (raw-space head permutation): {"perm": (H,)} only,
               new head i = old head perm[i].
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


def identity(group: Group, dtype=torch.float64, device=None) -> Element:
    if group.kind == "permutation":
        return {"perm": torch.arange(group.size, device=device)}
    if group.kind == "orthogonal":
        return {"matrix": torch.eye(group.size, dtype=dtype, device=device)}
    if _perm_only(group):
        return {"perm": torch.arange(group.n_heads, device=device)}
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
    if _perm_only(group):
        return {"perm": torch.randperm(group.n_heads, generator=generator)}
    maker = random_orthogonal if group.head_map == "orthogonal" else random_invertible
    H, dh = group.n_heads, group.head_dim
    return {"perm": torch.randperm(H, generator=generator),
            "qk": maker(dh, generator, dtype, batch=(H,)), "vo": maker(dh, generator, dtype, batch=(H,))}


# ------------------------------------------------------------------ validation
def expected_shapes(group: Group) -> dict[str, tuple[int, ...]]:
    """The entries of an element of `group` and their shapes."""
    if group.kind == "permutation":
        return {"perm": (group.size,)}
    if group.kind == "orthogonal":
        return {"matrix": (group.size, group.size)}
    H, dh = group.n_heads, group.head_dim
    if _perm_only(group):
        return {"perm": (H,)}
    return {"perm": (H,), "qk": (H, dh, dh), "vo": (H, dh, dh)}


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
    if _perm_only(group):
        return
    for key in ("qk", "vo"):
        _check_float(group, key, el[key])
        if group.head_map == "orthogonal":
            _check_orthogonal(group, key, el[key])
        else:
            _check_invertible(group, key, el[key])


def _nearest_orthogonal(M: torch.Tensor) -> torch.Tensor:
    U, _, Vh = torch.linalg.svd(M)
    return U @ Vh


def snap(group: Group, el: Element) -> Element:
    """`el` moved onto the group in float64 (nearest orthogonal maps, keeping R 1 = 1 where
    the group is centred): for elements computed in float32, e.g. by learned matching."""
    out = {k: (v.long() if k == "perm" else v.to(torch.float64)) for k, v in el.items()}
    if group.kind == "orthogonal":
        M = out["matrix"]
        if group.centred:
            Q = householder_basis(M.shape[0], M.dtype, M.device)
            out["matrix"] = centred_orthogonal(_nearest_orthogonal((Q @ M @ Q)[1:, 1:]))
        else:
            out["matrix"] = _nearest_orthogonal(M)
    elif group.kind == "heads" and group.head_map == "orthogonal":
        out["qk"], out["vo"] = _nearest_orthogonal(out["qk"]), _nearest_orthogonal(out["vo"])
    return out


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
    elif _perm_only(group):
        perm = el["perm"].to(W.device)
        out = flat.reshape(group.n_heads, group.head_dim, -1)[perm].reshape(shape[0], -1)
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
    if group.kind == "permutation" or _perm_only(group):
        return {"perm": second["perm"][first["perm"]]}
    if group.kind == "orthogonal":
        return {"matrix": first["matrix"] @ second["matrix"].to(first["matrix"])}
    p1 = first["perm"]
    return {"perm": second["perm"][p1],
            "qk": first["qk"] @ second["qk"].to(first["qk"])[p1],
            "vo": first["vo"] @ second["vo"].to(first["vo"])[p1]}


def inverse(group: Group, el: Element) -> Element:
    if group.kind == "permutation" or _perm_only(group):
        return {"perm": torch.argsort(el["perm"])}
    if group.kind == "orthogonal":
        return {"matrix": el["matrix"].transpose(-1, -2).clone()}
    inv_perm = torch.argsort(el["perm"])
    inv = (lambda A: A.transpose(-1, -2)) if group.head_map == "orthogonal" else torch.linalg.inv
    return {"perm": inv_perm, "qk": inv(el["qk"][inv_perm]), "vo": inv(el["vo"][inv_perm])}
