"""Matrices the symmetry groups are made of: random ones for planted tests, and nearest ones.

- orthogonal maps (Haar-random), centred ones R 1 = 1 (LayerNorm residual streams), invertible
  maps with a bounded condition number;
- maps that commute with rotary positions (Hugging Face's layout: dimension p pairs with
  p + r/2 among the first r rotary dims): one block [[a, -b], [b, a]] per frequency plane, any
  map of the dims after them (partial rotary), zero elsewhere.
"""
from __future__ import annotations

import math

import torch


def householder_basis(d: int, dtype=torch.float64, device=None) -> torch.Tensor:
    """Symmetric orthogonal Q whose first column is 1/sqrt(d): maps e_1 <-> the ones direction."""
    u = torch.full((d,), d**-0.5, dtype=dtype, device=device)
    v = -u
    v[0] += 1.0
    if v.norm() < 1e-12:  # d == 1
        return torch.eye(d, dtype=dtype, device=device)
    return torch.eye(d, dtype=dtype, device=device) - 2.0 * torch.outer(v, v) / (v @ v)


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


def nearest_orthogonal(M: torch.Tensor) -> torch.Tensor:
    U, _, Vh = torch.linalg.svd(M)
    return U @ Vh


# ---------------------------------------------------------------- maps that commute with RoPE
# A head of d_h dims whose first r carry rotary positions (r = d_h, or less with GPT-NeoX's partial
# rotary): its QK map commutes with every position's rotation exactly when it is block diagonal,
# one 2x2 block [[a, -b], [b, a]] per plane (p, p + r/2) of the first r dims, and any map ("rest")
# of the d_h - r dims no position touches.
def rotary_map(a: torch.Tensor, b: torch.Tensor, rest: torch.Tensor | None = None) -> torch.Tensor:
    """(..., r/2) plane coefficients and the (..., m, m) map of the unrotated dims (None: m = 0) ->
    (..., r + m, r + m): [[a, -b], [b, a]] on each plane (p, p + r/2), `rest` after them."""
    half = a.shape[-1]
    m = 0 if rest is None else rest.shape[-1]
    M = torch.zeros(*a.shape[:-1], 2 * half + m, 2 * half + m, dtype=a.dtype, device=a.device)
    i = torch.arange(half, device=a.device)
    M[..., i, i] = a
    M[..., i + half, i + half] = a
    M[..., i + half, i] = b
    M[..., i, i + half] = -b
    if m:
        M[..., 2 * half:, 2 * half:] = rest
    return M


def rotary_parts(M: torch.Tensor, rotary_dim: int | None = None):
    """(a, b, rest) nearest to M (least squares): the inverse of `rotary_map`; rest is None when every
    dimension rotates (rotary_dim None or d_h)."""
    r = M.shape[-1] if rotary_dim is None else rotary_dim
    half = r // 2
    i = torch.arange(half, device=M.device)
    a = 0.5 * (M[..., i, i] + M[..., i + half, i + half])
    b = 0.5 * (M[..., i + half, i] - M[..., i, i + half])
    return a, b, (M[..., r:, r:] if r < M.shape[-1] else None)


def random_rotary(head_dim: int, generator=None, dtype=torch.float64, batch=(), invertible: bool = False,
                  max_cond: float = 10.0, rotary_dim: int | None = None) -> torch.Tensor:
    """Random maps commuting with RoPE: a rotation per plane (times a scale in [1, max_cond ** 0.5]),
    and a random orthogonal (invertible) map of the unrotated dims."""
    r = head_dim if rotary_dim is None else rotary_dim
    half = r // 2
    angle = 2 * math.pi * torch.rand(*batch, half, generator=generator, dtype=torch.float64)
    scale = (1.0 + (max_cond**0.5 - 1.0) * torch.rand(*batch, half, generator=generator, dtype=torch.float64)
             if invertible else torch.ones(*batch, half, dtype=torch.float64))
    rest = None
    if r < head_dim:
        maker = random_invertible if invertible else random_orthogonal
        rest = maker(head_dim - r, generator, batch=batch)
    return rotary_map(scale * angle.cos(), scale * angle.sin(), rest).to(dtype)


def nearest_rotary(C: torch.Tensor, rotary_dim: int | None = None) -> torch.Tensor:
    """The RoPE-commuting orthogonal M maximising tr(M^T C): per plane the angle of
    (C_pp + C_qq, C_qp - C_pq), q = p + r/2; on the unrotated dims the polar factor of C's block
    (tr(M^T C) splits over the blocks, so each is maximised alone)."""
    a, b, rest = rotary_parts(C, rotary_dim)
    norm = torch.sqrt(a * a + b * b)
    flat = norm == 0  # no signal in this plane: the identity
    a = torch.where(flat, torch.ones_like(a), a / norm.clamp_min(1e-300))
    b = torch.where(flat, torch.zeros_like(b), b / norm.clamp_min(1e-300))
    return rotary_map(a, b, None if rest is None else nearest_orthogonal(rest))


__all__ = ["centred_orthogonal", "householder_basis", "nearest_orthogonal", "nearest_rotary", "random_invertible",
           "random_orthogonal", "random_rotary", "rotary_map", "rotary_parts"]
