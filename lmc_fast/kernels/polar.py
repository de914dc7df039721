"""Batched small SVD and orthogonal polar factor (Procrustes).

Routing (see bench/bench_polar.py and bench/results/ for the measurements behind it):
- CPU, polar factor only (``polar``), n <= CPU_POLAR_MAX_N[dtype]: the C++ scaled Newton
  iteration in double (an n^3 Gauss-Jordan inverse per iteration, 5-7 iterations), which
  falls back to the Jacobi SVD for numerically singular matrices (OpenMP over the batch).
- CPU, singular values or vectors wanted, n <= CPU_MAX_N_BY_DTYPE[dtype]: the C++ one-sided
  Jacobi SVD in double (OpenMP over the batch).
- CUDA, float32/float64, n <= 64: the CUDA kernel (one thread block per matrix).
- CUDA, n > 64, ``polar(M, check_finite=False)`` (a GPU step's own matrices): the scaled Newton
  iteration in torch (polar_newton.py), which never waits for the host; a matrix it cannot
  converge (singular, non-finite) comes out NaN.
- everything else (larger n, other dtypes' fallback, tensors that need autograd, or no
  compiled extension): ``torch.linalg.svd`` (the reference).
Half/bfloat16 inputs are computed in float32 and cast back.

Rank-deficient inputs: U is always orthogonal; the columns of U that belong to zero
singular values are completed to an orthonormal basis (Gram-Schmidt on e_0, e_1, ...), so
``polar(M)`` is orthogonal and is one valid maximiser of tr(R^T M). The reference
(LAPACK / cuSOLVER) may pick a different, equally valid completion.
"""
from __future__ import annotations

import torch

from ..numerics import all_finite
from ._ext import get_ext, has_cuda_kernels
from .polar_newton import newton_polar
from .reference import polar_reference, svd_small_reference

__all__ = ["polar", "svd_small", "polar_and_singular_values", "CPU_MAX_N", "CPU_MAX_N_BY_DTYPE", "CPU_POLAR_MAX_N",
           "CUDA_MAX_N"]

#: Largest n for which the C++ Jacobi SVD is the CPU default, per dtype (torch's LAPACK
#: wins above). Measured on a quiet 2-core CPU with the default threads, where ours runs
#: the batch on both cores and torch's batched SVD on one (bench/results/polar_cpu.json:
#: SVD 1.06x fp32 at n = 48, 1.49x fp64 at 64; polar 2.4x fp32 / 4.0x fp64 at n = 64,
#: 1.2x / 1.7x at 128, where one thread each is 0.5x / 0.85x, so fp32 stops at 64).
#: Jacobi computes in double either way, so float64 inputs gain more.
CPU_MAX_N_BY_DTYPE = {torch.float32: 48, torch.float64: 64}
#: Largest n for which the C++ Newton polar iteration is the CPU default for ``polar``.
CPU_POLAR_MAX_N = {torch.float32: 64, torch.float64: 128}
CPU_MAX_N = max(max(CPU_MAX_N_BY_DTYPE.values()), max(CPU_POLAR_MAX_N.values()))
#: Largest n of the CUDA one-block-per-matrix kernel.
CUDA_MAX_N = 64

_COMPUTE = (torch.float32, torch.float64)


def _check(M: torch.Tensor, fn: str, check_finite: bool = True) -> tuple[torch.Tensor, bool]:
    if not isinstance(M, torch.Tensor):
        raise TypeError(f"{fn}: expected a torch.Tensor, got {type(M).__name__}")
    if M.dim() not in (2, 3):
        raise ValueError(f"{fn}: expected an (n, n) or (B, n, n) tensor, got shape {tuple(M.shape)}")
    if M.shape[-1] != M.shape[-2]:
        raise ValueError(f"{fn}: matrices must be square, got {tuple(M.shape[-2:])}")
    if not M.is_floating_point():
        raise TypeError(f"{fn}: expected a floating-point tensor, got {M.dtype}")
    if check_finite and not all_finite(M):
        raise ValueError(f"{fn}: input contains NaN or inf")
    squeeze = M.dim() == 2
    return (M.unsqueeze(0) if squeeze else M), squeeze


def _route(M: torch.Tensor, polar_only: bool = False) -> str:
    """'cpu' (C++), 'cuda' (CUDA kernel) or 'torch' (reference) for a (B, n, n) batch."""
    n = M.shape[-1]
    if M.numel() == 0 or (torch.is_grad_enabled() and M.requires_grad):
        return "torch"
    if M.device.type == "cpu":
        table = CPU_POLAR_MAX_N if polar_only else CPU_MAX_N_BY_DTYPE
        if n <= table.get(M.dtype, table[torch.float32]) and get_ext() is not None:
            return "cpu"
        return "torch"
    if M.device.type == "cuda" and n <= CUDA_MAX_N and has_cuda_kernels():
        return "cuda"
    return "torch"


def _cpu_call(M: torch.Tensor, want_uv: bool, want_s: bool, want_p: bool):
    ext = get_ext()
    x = M.detach()
    dtype = x.dtype if x.dtype in _COMPUTE else torch.float32
    arr = x.to(dtype).contiguous().numpy()
    # The Newton iteration serves the polar-only request; the extension ignores it otherwise.
    U, S, Vh, P, _ = ext.polar_svd(arr, want_uv, want_s, want_p, method="newton")
    conv = lambda a: None if a is None else torch.from_numpy(a).to(M.dtype)  # noqa: E731
    return conv(U), conv(S), conv(Vh), conv(P)


def _cuda_call(M: torch.Tensor, want_uv: bool, want_s: bool, want_p: bool):
    ext = get_ext()
    x = M.detach()
    dtype = x.dtype if x.dtype in _COMPUTE else torch.float32
    x = x.to(dtype).contiguous()
    B, n, _ = x.shape
    with torch.cuda.device(x.device):
        U = torch.empty_like(x) if want_uv else None
        Vh = torch.empty_like(x) if want_uv else None
        S = torch.empty((B, n), dtype=dtype, device=x.device) if want_s else None
        P = torch.empty_like(x) if want_p else None
        ptr = lambda t: 0 if t is None else t.data_ptr()  # noqa: E731
        stream = torch.cuda.current_stream(x.device).cuda_stream
        ext.polar_cuda(x.data_ptr(), ptr(U), ptr(S), ptr(Vh), ptr(P), B, n,
                       "float32" if dtype == torch.float32 else "float64", 0.0, 60, stream)
    conv = lambda a: None if a is None else a.to(M.dtype)  # noqa: E731
    return conv(U), conv(S), conv(Vh), conv(P)


def _dispatch(M: torch.Tensor, want_uv: bool, want_s: bool, want_p: bool):
    route = _route(M, polar_only=want_p and not (want_uv or want_s))
    if route == "cpu":
        return _cpu_call(M, want_uv, want_s, want_p)
    if route == "cuda":
        return _cuda_call(M, want_uv, want_s, want_p)
    x = M if M.dtype in _COMPUTE else M.to(torch.float32)
    U, S, Vh = svd_small_reference(x)
    P = U @ Vh if want_p else None
    conv = lambda a: None if a is None else a.to(M.dtype)  # noqa: E731
    return conv(U), conv(S), conv(Vh), conv(P)


def svd_small(M: torch.Tensor):
    """(B, n, n) or (n, n) -> (U, S, Vh) with M = U diag(S) Vh, S descending
    (``torch.linalg.svd`` conventions), on M's device and in M's dtype."""
    Mb, squeeze = _check(M, "svd_small")
    U, S, Vh, _ = _dispatch(Mb, True, True, False)
    if squeeze:
        return U[0], S[0], Vh[0]
    return U, S, Vh


def polar(M: torch.Tensor, *, check_finite: bool = True) -> torch.Tensor:
    """(B, n, n) or (n, n) -> orthogonal polar factor U Vh of each matrix (the orthogonal
    R maximising tr(R^T M)), on M's device and in M's dtype. `check_finite=False` skips the
    NaN / inf refusal, which on CUDA is a host synchronisation, and above the CUDA kernel's size
    takes the Newton iteration instead of torch's SVD (which synchronises too): for callers inside a
    GPU step whose input is their own. A NaN / inf (or, there, unconvergeable) matrix comes out NaN."""
    Mb, squeeze = _check(M, "polar", check_finite)
    route = _route(Mb, polar_only=True)
    ok = None
    if not check_finite and route == "torch" and Mb.device.type == "cuda" and not Mb.requires_grad:
        # above the CUDA kernel's size torch.linalg.svd would wait for the host: Newton does not
        P, ok = newton_polar(Mb)
    elif route == "torch" and Mb.dtype in _COMPUTE:
        P = polar_reference(Mb)
    else:
        P = _dispatch(Mb, False, False, True)[3]
    if not check_finite:  # the solvers may return numbers for a NaN input: make it NaN, on the device
        good = torch.isfinite(Mb).all(-1).all(-1)
        good = good if ok is None else good & ok
        P = torch.where(good[:, None, None], P, torch.full((), float("nan"), dtype=P.dtype, device=P.device))
    return P[0] if squeeze else P


def polar_and_singular_values(M: torch.Tensor):
    """(P, S): the polar factor and the singular values (e.g. nuclear norm = S.sum(-1))
    from one decomposition."""
    Mb, squeeze = _check(M, "polar_and_singular_values")
    _, S, _, P = _dispatch(Mb, False, True, True)
    if squeeze:
        return P[0], S[0]
    return P, S
