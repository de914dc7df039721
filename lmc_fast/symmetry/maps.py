"""Matrices the symmetry groups are made of: random ones for planted tests, and nearest ones.

- orthogonal maps (Haar-random), centred ones R 1 = 1 (LayerNorm residual streams), invertible
  maps with a bounded condition number;
- maps that commute with rotary positions (Hugging Face's layout: dimension p pairs with
  p + d_h/2): one block [[a, -b], [b, a]] per frequency plane, zero elsewhere.
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


def nearest_rotary(C: torch.Tensor) -> torch.Tensor:
    """The RoPE-commuting rotation M (one per plane) maximising tr(M^T C): per plane the angle of
    (C_pp + C_qq, C_qp - C_pq), q = p + d_h/2."""
    a, b = rotary_parts(C)
    norm = torch.sqrt(a * a + b * b)
    flat = norm == 0  # no signal in this plane: the identity
    a = torch.where(flat, torch.ones_like(a), a / norm.clamp_min(1e-300))
    b = torch.where(flat, torch.zeros_like(b), b / norm.clamp_min(1e-300))
    return rotary_map(a, b)


__all__ = ["centred_orthogonal", "householder_basis", "nearest_orthogonal", "nearest_rotary", "random_invertible",
           "random_orthogonal", "random_rotary", "rotary_map", "rotary_parts"]
