"""Plain torch / scipy references for the solver kernels. Every compiled kernel is tested
against these, and they are the fallback wherever no compiled path exists."""
from __future__ import annotations

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment


def svd_small_reference(M: torch.Tensor):
    """Batched SVD (B, n, n) -> (U, S, Vh) with torch.linalg.svd."""
    return torch.linalg.svd(M)


def polar_reference(M: torch.Tensor) -> torch.Tensor:
    """Orthogonal polar factor U V^T of each matrix in a (..., n, n) batch: the orthogonal
    matrix closest to M, i.e. the maximiser of tr(R^T M) (orthogonal Procrustes)."""
    U, _, Vh = torch.linalg.svd(M)
    return U @ Vh


def linear_assignment_reference(C: torch.Tensor, maximize: bool = True) -> torch.Tensor:
    """(B, n, m) costs, n <= m -> (B, n) column index of each row, via scipy in a loop."""
    squeeze = C.dim() == 2
    Cb = C.unsqueeze(0) if squeeze else C
    if Cb.shape[-2] > Cb.shape[-1]:
        raise ValueError(f"linear_assignment needs rows <= columns, got {tuple(Cb.shape[-2:])}")
    arr = Cb.detach().to("cpu", torch.float64).numpy()
    out = np.empty(arr.shape[:2], dtype=np.int64)
    for b in range(arr.shape[0]):
        rows, cols = linear_sum_assignment(arr[b], maximize=maximize)
        out[b, rows] = cols
    res = torch.from_numpy(out).to(C.device)
    return res[0] if squeeze else res
