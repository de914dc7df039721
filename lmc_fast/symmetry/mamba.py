"""Mamba's continuous reparameterisations, taken out by the canonical form (docs/ARCHITECTURE.md, section 1).

Three maps leave a Mamba block's function unchanged exactly and are fixed here, in float64, per block:
- channel scales: in_x's row i (and bias) times a != 0, the conv's row i times 1 / a (the conv is linear and
  its bias is added after it, so u is unchanged). Balanced (both rows' norms sqrt(|in_x_i| |conv_i|)) and
  signed (the conv row's taps sum > 0);
- state scales: x_B's row n times a != 0, x_C's row n times 1 / a (A is diagonal: the state s[:, n] scales
  by a and C reads it back). Balanced, and signed by the x_B row's sum;
- dt's factorisation: x_dt <- M x_dt, dt.weight <- dt.weight M^-1 for any M in GL(dt_rank) (only the
  product dt.weight x_dt = U S V^T enters). Fixed as dt.weight = U S^1/2, x_dt = S^1/2 V^T, each column of U
  with a positive sum.
Every choice reads norms and sums that the inner-channel and state permutations and the residual rotation
keep (in_x's row norms under W R^T, a row's sum under a permutation of its columns), and the three maps
touch disjoint tensors, so the canonical form of g . A is that of A moved by the permutations and rotation
of g: no matcher searches these maps.
"""
from __future__ import annotations

import torch


def _sign(v: torch.Tensor) -> torch.Tensor:
    """sign(v), +1 where v is zero."""
    s = torch.sign(v)
    return torch.where(s == 0, torch.ones_like(s), s)


def _factor(side_sq: torch.Tensor, other_sq: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """The per-row factor a (times `sign`) that makes |a side| = |other / a| = sqrt(|side| |other|); 1 where
    either side is zero (a zero-padded channel)."""
    side, other = side_sq.sqrt(), other_sq.sqrt()
    live = (side > 0) & (other > 0)
    return torch.where(live, (other / torch.where(live, side, 1.0)).sqrt(), torch.ones_like(side)) * sign


def balanced_channels(p: dict, prefix: str) -> dict:
    """in_x (rows, bias) and conv (rows) of one block with each inner channel's scale and sign fixed."""
    W = p[prefix + "in_x.weight"].to(torch.float64)
    bias = p.get(prefix + "in_x.bias")
    bias = None if bias is None else bias.to(torch.float64)
    conv = p[prefix + "conv.weight"].to(torch.float64)
    side = W.pow(2).sum(1) + (0.0 if bias is None else bias.pow(2))
    a = _factor(side, conv.pow(2).sum(1), _sign(conv.sum(1)))
    out = {prefix + "in_x.weight": W * a[:, None], prefix + "conv.weight": conv / a[:, None]}
    if bias is not None:
        out[prefix + "in_x.bias"] = bias * a
    return out


def balanced_states(p: dict, prefix: str) -> dict:
    """x_B and x_C of one block with each state's scale and sign fixed."""
    B, C = (p[prefix + n].to(torch.float64) for n in ("x_B.weight", "x_C.weight"))
    a = _factor(B.pow(2).sum(1), C.pow(2).sum(1), _sign(B.sum(1)))
    return {prefix + "x_B.weight": B * a[:, None], prefix + "x_C.weight": C / a[:, None]}


def factored_dt(p: dict, prefix: str) -> dict:
    """dt.weight and x_dt as U S^1/2 and S^1/2 V^T of their product's SVD (through two thin QRs: the product
    is never formed), signs fixed by U's column sums."""
    W, V = (p[prefix + n].to(torch.float64) for n in ("dt.weight", "x_dt.weight"))  # (E, r), (r, E)
    Q1, R1 = torch.linalg.qr(W)
    Q2, R2 = torch.linalg.qr(V.T)
    u, s, vh = torch.linalg.svd(R1 @ R2.T)
    U, Vt = Q1 @ u, vh @ Q2.T
    sign = _sign(U.sum(0))
    root = s.sqrt() * sign
    return {prefix + "dt.weight": U * root[None, :], prefix + "x_dt.weight": root[:, None] * Vt}


def canonical_mixer(p: dict, prefix: str) -> dict:
    """Every step above for the block whose Mamba parameters start with `prefix` (after the norm is folded)."""
    return {**balanced_channels(p, prefix), **balanced_states(p, prefix), **factored_dt(p, prefix)}
