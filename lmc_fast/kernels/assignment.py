"""Exact batched linear assignment.

``linear_assignment`` uses the C++ Jonker-Volgenant solver (OpenMP over the batch) on
every device (CUDA tensors are copied to the host, solved, and the indices copied back);
without the compiled extension it falls back to scipy's ``linear_sum_assignment`` in a
loop (the reference). Both are exact; with ties they may return different optimal
assignments of the same objective.

Warm start: ``return_duals=True`` also returns the solver's column prices, and passing
them back as ``duals=`` to the next solve of a similar square problem (same shape and
sense, e.g. the next sweep of weight matching) starts from them instead of from scratch.
The optimum does not depend on the prices, only the time does (bench/bench_assignment.py,
"warm" rows). The scipy fallback has no prices: it ignores ``duals`` and returns None.
"""
from __future__ import annotations

import torch

from ..numerics import all_finite
from ._ext import get_ext
from .reference import linear_assignment_reference

__all__ = ["linear_assignment", "assignment_objective"]


def linear_assignment(C: torch.Tensor, maximize: bool = True, *, duals: torch.Tensor | None = None,
                      return_duals: bool = False):
    """(B, n, m) or (n, m) scores with n <= m -> (B, n) / (n,) int64 column index
    assigned to each row, on C's device. ``maximize=False`` minimises the total cost.
    With ``return_duals`` returns ``(cols, duals)``: float64 column prices of shape (B, m) /
    (m,) on the CPU (None without the compiled solver), to pass as ``duals`` next time."""
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
    B, n, m = Cb.shape
    if B == 0 or n == 0:
        out = torch.empty((B, n), dtype=torch.int64, device=C.device)
        out = out[0] if squeeze else out
        return (out, None) if return_duals else out
    ext = get_ext()
    if ext is None:
        # The compiled solver checks finiteness while it copies the scores; scipy needs it here.
        if not all_finite(Cb):
            raise ValueError("linear_assignment: scores contain NaN or inf")
        out = linear_assignment_reference(C, maximize=maximize)
        return (out, None) if return_duals else out
    x = Cb.detach()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.to(torch.float64)
    arr = x.to("cpu").contiguous().numpy()
    v_in = None
    if duals is not None:
        v = duals.detach().to("cpu", torch.float64)
        v = v.unsqueeze(0) if v.dim() == 1 else v
        if tuple(v.shape) != (B, m):
            raise ValueError(f"linear_assignment: duals of shape {tuple(duals.shape)} do not fit scores of "
                             f"shape {tuple(C.shape)}; expected {(B, m) if not squeeze else (m,)}")
        v_in = v.contiguous().numpy()
    res = ext.linear_assignment(arr, bool(maximize), duals=v_in, return_duals=return_duals)
    cols, v_out = res if return_duals else (res, None)
    out = torch.from_numpy(cols).to(C.device)
    out = out[0] if squeeze else out
    if not return_duals:
        return out
    v_out = torch.from_numpy(v_out)
    return out, (v_out[0] if squeeze else v_out)


def assignment_objective(C: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Sum over rows of C[b, i, cols[b, i]] (float64), for (B, n, m) or (n, m) inputs."""
    Cb = C if C.dim() == 3 else C.unsqueeze(0)
    cb = cols if cols.dim() == 2 else cols.unsqueeze(0)
    vals = torch.gather(Cb.to(torch.float64), 2, cb.unsqueeze(-1).to(Cb.device)).squeeze(-1)
    out = vals.sum(-1)
    return out if C.dim() == 3 else out[0]
