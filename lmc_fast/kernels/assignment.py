"""Exact batched linear assignment.

``linear_assignment`` uses the C++ Jonker-Volgenant solver (OpenMP over the batch) on
every device (CUDA tensors are copied to the host, solved, and the indices copied back);
without the compiled extension it falls back to scipy's ``linear_sum_assignment`` in a
loop (the reference). Both are exact; with ties they may return different optimal
assignments of the same objective.
"""
from __future__ import annotations

import torch

from ._ext import get_ext
from .reference import linear_assignment_reference

__all__ = ["linear_assignment", "assignment_objective"]


def linear_assignment(C: torch.Tensor, maximize: bool = True) -> torch.Tensor:
    """(B, n, m) or (n, m) scores with n <= m -> (B, n) / (n,) int64 column index
    assigned to each row, on C's device. ``maximize=False`` minimises the total cost."""
    if not isinstance(C, torch.Tensor):
        raise TypeError(f"linear_assignment: expected a torch.Tensor, got {type(C).__name__}")
    if C.dim() not in (2, 3):
        raise ValueError(
            f"linear_assignment: expected an (n, m) or (B, n, m) tensor, got shape {tuple(C.shape)}")
    if C.shape[-2] > C.shape[-1]:
        raise ValueError(
            f"linear_assignment needs rows <= columns, got {tuple(C.shape[-2:])}; "
            "pass the transpose and invert the result")
    if C.is_complex() or C.dtype == torch.bool:
        raise TypeError(f"linear_assignment: expected real scores, got {C.dtype}")
    squeeze = C.dim() == 2
    Cb = C.unsqueeze(0) if squeeze else C
    if Cb.is_floating_point() and Cb.numel() and not bool(torch.isfinite(Cb).all()):
        raise ValueError("linear_assignment: scores contain NaN or inf")
    B, n, m = Cb.shape
    if B == 0 or n == 0:
        out = torch.empty((B, n), dtype=torch.int64, device=C.device)
        return out[0] if squeeze else out
    ext = get_ext()
    if ext is None:
        return linear_assignment_reference(C, maximize=maximize)
    x = Cb.detach()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float64)
    arr = x.to("cpu").contiguous().numpy()
    out = torch.from_numpy(ext.linear_assignment(arr, bool(maximize)))
    out = out.to(C.device)
    return out[0] if squeeze else out


def assignment_objective(C: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Sum over rows of C[b, i, cols[b, i]] (float64), for (B, n, m) or (n, m) inputs."""
    Cb = C if C.dim() == 3 else C.unsqueeze(0)
    cb = cols if cols.dim() == 2 else cols.unsqueeze(0)
    vals = torch.gather(Cb.to(torch.float64), 2, cb.unsqueeze(-1).to(Cb.device)).squeeze(-1)
    out = vals.sum(-1)
    return out if C.dim() == 3 else out[0]
