"""What a matcher is, and the straight-through projections the latents of every kind share.

A matcher is how one kind of symmetry group (symmetry/groups.py holds its algebra) is matched:
- `batch_key(group)`: groups of equal keys are solved as one batched call (all layers at once);
- `correlation(group, pa, pb)`: weight matching's statistic, sum over the group's axes of A's
  weights against B's; `activation_term(group, rec_a, rec_b)`: the same statistic from one
  batch of both models' activations (the records `models/functional.py` makes);
- `solve(groups, stats, warm=, key=, current=)`: the elements maximising sum <A, g . B> given
  the statistics (with `current`, the discrete part stays and only the continuous maps move);
- `value(group, stat, element)`: the objective the element reaches on that statistic;
- `has_maps(group)`: whether its elements have a continuous part (weight matching polishes those
  with the permutations frozen);
- `latent(groups, elements, dtype)`: the module learned matching trains, whose `project()`
  gives dense differentiable elements and the hard elements they equal.
"""
from __future__ import annotations

import torch

from ... import kernels
from .. import solve

NS_STEPS = 10


class Matcher:
    kind = ""

    def batch_key(self, group):
        return group.name

    def correlation(self, group, pa: dict, pb: dict):
        raise NotImplementedError

    def activation_term(self, group, rec_a: dict, rec_b: dict):
        raise NotImplementedError

    def solve(self, groups, stats, *, warm=None, key=None, current=None) -> list[dict]:
        raise NotImplementedError

    def has_maps(self, group) -> bool:
        return False

    def value(self, group, stat, element) -> float:
        raise NotImplementedError(f"{self.kind} groups have no closed-form objective value")

    def latent(self, groups, elements, dtype=torch.float32):
        raise NotImplementedError(f"learned matching has no latent for {self.kind} groups")


def stacked(t: torch.Tensor) -> torch.Tensor:
    """Activations (..., n) as (tokens, n) float64 rows."""
    return t.reshape(-1, t.shape[-1]).double()


def _rms_normalised(t: torch.Tensor) -> torch.Tensor:
    t = stacked(t)
    return t / t.pow(2).mean(-1, keepdim=True).add(1e-12).sqrt()


def residual_term(rec_a: dict, rec_b: dict) -> torch.Tensor:
    """The residual stream's statistic from one batch: the normalised states h / rms(h) at every
    block boundary (rotation-equivariant; normalising keeps deep layers from dominating)."""
    out = None
    for name, a in rec_a.items():
        if name.split(".")[0] == "resid":
            term = _rms_normalised(a).T @ _rms_normalised(rec_b[name])
            out = term if out is None else out + term
    return out


def newton_schulz_polar(M: torch.Tensor, sigma_max: torch.Tensor, steps: int = NS_STEPS) -> torch.Tensor:
    """Differentiable polar factor of a batch (..., n, n): X <- 1.5 X - 0.5 X X^T X after
    scaling by the largest singular value (held constant: the polar factor ignores scale)."""
    X = M / (sigma_max.detach() * 1.001).clamp_min(1e-30)[..., None, None]
    for _ in range(steps):
        X = 1.5 * X - 0.5 * X @ (X.transpose(-1, -2) @ X)
    return X


class _ExactPolar(torch.autograd.Function):
    """The polar factor U of (B, n, n) latents M with its exact derivative. With H = U^T M = V S V^T
    (the symmetric factor, from one eigendecomposition), dU = U Omega where Omega is the skew
    solution of Omega H + H Omega = U^T dM - dM^T U, so the gradient of <G, U> is
    U V [(A - A^T) / (s_i + s_j)] V^T with A = V^T U^T G V: one n x n eigendecomposition and six
    products, in float64, where the Newton-Schulz map needs about sixty."""

    @staticmethod
    def forward(ctx, M):
        U = kernels.polar(M)  # (on the CPU: a non-finite latent is one line, not NaN elements)
        ctx.save_for_backward(M, U)
        return U.to(M.dtype)

    @staticmethod
    def backward(ctx, grad):
        M, U = (t.double() for t in ctx.saved_tensors)
        Ut = U.transpose(-1, -2)
        H = Ut @ M
        s, V = torch.linalg.eigh(0.5 * (H + H.transpose(-1, -2)))
        Vt = V.transpose(-1, -2)
        A = Vt @ (Ut @ grad.double()) @ V
        # s_i + s_j vanishes only for two zero singular values (a singular latent): no gradient there
        denom = (s.unsqueeze(-1) + s.unsqueeze(-2)).clamp_min(1e-12 * s.amax(-1, keepdim=True).unsqueeze(-1))
        Z = V @ ((A - A.transpose(-1, -2)) / denom) @ Vt
        return (U @ Z).to(grad.dtype)


def polar_ste(M: torch.Tensor) -> torch.Tensor:
    """The exact polar factor of a (B, n, n) batch, differentiable. On the CPU its exact gradient
    (`_ExactPolar`); elsewhere the gradient of Newton-Schulz iterations, which are products only
    (an eigendecomposition on CUDA waits for the host)."""
    Md = M.detach()
    if Md.device.type == "cpu":
        return _ExactPolar.apply(M)
    # the latents are the optimiser's own: no finiteness check on CUDA (a host sync per call)
    exact = kernels.polar(Md, check_finite=Md.device.type != "cuda")
    return exact.to(M.dtype) + polar_ste_newton_schulz(M, exact)


def polar_ste_newton_schulz(M: torch.Tensor, exact: torch.Tensor) -> torch.Tensor:
    """Zero in value, the gradient of the Newton-Schulz polar map of M in backward (`exact`: M's
    polar factor, which bounds the singular values)."""
    Md = M.detach()
    # Newton-Schulz needs an upper bound on the largest singular value: H = P^T M is
    # symmetric positive semi-definite with the singular values as eigenvalues, so its
    # max row sum bounds them, and is tight for the near-orthogonal latents met here.
    H = exact.transpose(-1, -2).to(Md.dtype) @ Md
    sigma_bound = H.abs().sum(-1).amax(-1)
    soft = newton_schulz_polar(M, sigma_bound)
    return soft - soft.detach()


def permutation_ste(latent: torch.Tensor, warm: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(G, n, n) latents -> hard permutation matrices with identity gradient, and the perms.
    `warm` (a dict kept between steps) holds the assignment's column prices: one optimiser
    step moves the latents a little, so the next solve starts from the last one's prices."""
    perm = solve.solve_permutations(latent.detach(), warm, "duals")
    hard = torch.zeros_like(latent).scatter_(-1, perm.unsqueeze(-1), 1.0)
    return hard + (latent - latent.detach()), perm


def one_hot(perm: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    return torch.zeros(*perm.shape, perm.shape[-1], dtype=dtype).scatter_(-1, perm.unsqueeze(-1), 1.0)
