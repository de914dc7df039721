"""Kernels under the solvers and the sweep. Each entry point picks the compiled path for the
tensor's device and falls back to the plain torch / scipy reference where none is compiled."""
from .reference import linear_assignment_reference, polar_reference, svd_small_reference


def polar(M):
    """(B, n, n) -> orthogonal polar factor U V^T of each matrix."""
    return polar_reference(M)


def svd_small(M):
    """(B, n, n) -> (U, S, Vh)."""
    return svd_small_reference(M)


def linear_assignment(C, maximize: bool = True):
    """(B, n, m) scores (n <= m) -> (B, n) column index assigned to each row."""
    return linear_assignment_reference(C, maximize=maximize)


__all__ = ["polar", "svd_small", "linear_assignment"]
