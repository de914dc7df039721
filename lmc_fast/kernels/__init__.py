"""Kernels under the solvers and the sweep. Each entry point picks the compiled path for the
tensor's device and falls back to the plain torch / scipy reference where none is compiled."""
from ._ext import build_info, has_cuda_kernels, has_ext
from .assignment import assignment_objective
from .assignment import linear_assignment as _linear_assignment
from .polar import polar as _polar
from .polar import polar_and_singular_values
from .polar import svd_small as _svd_small
from .reference import linear_assignment_reference, polar_reference, svd_small_reference


def polar(M, *, check_finite: bool = True):
    """(B, n, n) -> orthogonal polar factor U V^T of each matrix (`check_finite=False`: no NaN /
    inf refusal, which is a host sync on CUDA)."""
    return _polar(M, check_finite=check_finite)


def svd_small(M):
    """(B, n, n) -> (U, S, Vh)."""
    return _svd_small(M)


def linear_assignment(C, maximize: bool = True, *, duals=None, return_duals: bool = False):
    """(B, n, m) scores (n <= m) -> (B, n) column index assigned to each row (and the column
    prices for a warm start of the next similar solve, with ``return_duals``)."""
    return _linear_assignment(C, maximize=maximize, duals=duals, return_duals=return_duals)


__all__ = [
    "polar",
    "svd_small",
    "linear_assignment",
    "polar_and_singular_values",
    "assignment_objective",
    "build_info",
    "has_ext",
    "has_cuda_kernels",
    "linear_assignment_reference",
    "polar_reference",
    "svd_small_reference",
]
