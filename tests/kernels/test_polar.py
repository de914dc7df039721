"""Batched small SVD / polar factor against float64 torch.linalg.svd."""
import numpy as np
import pytest
import torch

import lmc_fast.kernels as K
import importlib

polar_mod = importlib.import_module("lmc_fast.kernels.polar")
from lmc_fast.kernels._ext import get_ext, has_cuda_kernels

needs_ext = pytest.mark.skipif(get_ext() is None, reason="lmc_fast._C not built")


def _well_conditioned(B, n, dtype, seed, cond=10.0):
    """Random matrices with singular values in [1, cond] and random singular vectors."""
    g = torch.Generator().manual_seed(seed)
    Q1, _ = torch.linalg.qr(torch.randn(B, n, n, generator=g, dtype=torch.float64))
    Q2, _ = torch.linalg.qr(torch.randn(B, n, n, generator=g, dtype=torch.float64))
    s = 1.0 + (cond - 1.0) * torch.rand(B, n, generator=g, dtype=torch.float64)
    return ((Q1 * s[:, None, :]) @ Q2).to(dtype)


def _ref64(M):
    U, S, Vh = torch.linalg.svd(M.to(torch.float64))
    return U, S, Vh, U @ Vh


def _orth_err(Q):
    n = Q.shape[-1]
    eye = torch.eye(n, dtype=torch.float64)
    return (Q.to(torch.float64).transpose(-1, -2) @ Q.to(torch.float64) - eye).abs().max().item()


SHAPES = [(1, 16), (7, 16), (64, 32), (16, 48), (17, 64), (3, 17), (5, 1), (4, 2)]


@needs_ext
@pytest.mark.parametrize("B,n", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpp_polar_matches_reference(B, n, dtype):
    M = _well_conditioned(B, n, dtype, seed=B * 1000 + n)
    P = K.polar(M)
    assert P.dtype == dtype and P.shape == M.shape and P.device == M.device
    _, _, _, Pref = _ref64(M)
    tol = 1e-5 if dtype == torch.float32 else 1e-11
    assert (P.to(torch.float64) - Pref).abs().max().item() < tol
    assert _orth_err(P) < tol


@needs_ext
@pytest.mark.parametrize("B,n", SHAPES + [(4, 96), (2, 128)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpp_svd_matches_reference(B, n, dtype):
    """The compiled Jacobi directly (also for n > CPU_MAX_N, which routes to torch)."""
    g = torch.Generator().manual_seed(n + 7 * B)
    M = torch.randn(B, n, n, generator=g, dtype=torch.float64).to(dtype)
    U, S, Vh, P = polar_mod._cpu_call(M, True, True, True)
    _, Sref, _, Pref = _ref64(M)
    tol = 2e-5 if dtype == torch.float32 else 1e-10
    scale = Sref.max().item()
    assert (S.to(torch.float64) - Sref).abs().max().item() < tol * scale
    assert torch.all(S[:, :-1] >= S[:, 1:])
    assert _orth_err(U) < tol and _orth_err(Vh.transpose(-1, -2)) < tol
    rec = (U.to(torch.float64) * S.to(torch.float64)[:, None, :]) @ Vh.to(torch.float64)
    assert (rec - M.to(torch.float64)).abs().max().item() < tol * scale
    assert (P.to(torch.float64) - U.to(torch.float64) @ Vh.to(torch.float64)).abs().max().item() < tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_svd_small_public_api(dtype):
    M = torch.randn(6, 24, 24, dtype=dtype)
    U, S, Vh = K.svd_small(M)
    assert U.shape == M.shape and S.shape == (6, 24) and Vh.shape == M.shape
    assert U.dtype == S.dtype == Vh.dtype == dtype
    Sref = torch.linalg.svdvals(M.to(torch.float64))
    assert (S.to(torch.float64) - Sref).abs().max().item() < (1e-4 if dtype == torch.float32 else 1e-10)
    U2, S2, Vh2 = K.svd_small(M[0])
    assert U2.shape == (24, 24) and S2.shape == (24,)
    P, S3 = K.polar_and_singular_values(M)
    assert torch.allclose(S3, S)
    assert (P.to(torch.float64) - _ref64(M)[3]).abs().max().item() < (1e-4 if dtype == torch.float32 else 1e-10)


@needs_ext
@pytest.mark.parametrize("rank", [0, 1, 5, 15])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rank_deficient(rank, dtype):
    """Zero singular values: U still orthogonal, P orthogonal and a maximiser of tr(R^T M)."""
    n, B = 16, 4
    g = torch.Generator().manual_seed(rank + 3)
    L = torch.randn(B, n, rank, generator=g, dtype=torch.float64)
    R = torch.randn(B, rank, n, generator=g, dtype=torch.float64)
    M = (L @ R).to(dtype)
    U, S, Vh, P = polar_mod._cpu_call(M, True, True, True)
    tol = 1e-5 if dtype == torch.float32 else 1e-10
    assert _orth_err(U) < tol and _orth_err(P) < tol
    Sref = torch.linalg.svdvals(M.to(torch.float64))
    scale = max(Sref.max().item(), 1.0)
    assert (S.to(torch.float64) - Sref).abs().max().item() < tol * scale
    # tr(P^T M) equals the nuclear norm, the maximum over orthogonal R.
    tr = torch.einsum("bij,bij->b", P.to(torch.float64), M.to(torch.float64))
    assert torch.allclose(tr, Sref.sum(-1), rtol=tol, atol=tol * scale)
    rec = (U.to(torch.float64) * S.to(torch.float64)[:, None, :]) @ Vh.to(torch.float64)
    assert (rec - M.to(torch.float64)).abs().max().item() < tol * scale


@needs_ext
@pytest.mark.parametrize("n", [3, 16, 33, 64, 96])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_newton_polar_matches_jacobi_and_reference(n, dtype):
    """The Newton iteration (polar-only path) on general Gaussian matrices (condition numbers
    into the thousands): converges without Jacobi sweeps and agrees with both references."""
    M = torch.randn(6, n, n, generator=torch.Generator().manual_seed(n), dtype=dtype)
    _, _, _, P, sweeps = get_ext().polar_svd(M.numpy(), False, False, True, method="newton")
    P = torch.from_numpy(P)
    assert (sweeps < 0).all() and (sweeps >= -20).all()  # minus the Newton iterations
    cond = torch.linalg.cond(M.double())
    tol = 1e-5 if dtype == torch.float32 else 1e-15 * cond.max().item() * n
    assert (P.double() - _ref64(M)[3]).abs().max().item() < tol
    P_jac = torch.from_numpy(get_ext().polar(M.numpy(), method="jacobi"))
    assert (P.double() - P_jac.double()).abs().max().item() < tol
    assert _orth_err(P) < (1e-5 if dtype == torch.float32 else 1e-12)


@needs_ext
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_newton_polar_falls_back_to_jacobi_when_singular(dtype):
    """Rank-deficient matrices leave the Newton iteration (singular pivot) for the Jacobi
    path, which defines the completion; well-conditioned ones in the same batch do not."""
    g = torch.Generator().manual_seed(5)
    n = 24
    low = (torch.randn(2, n, 3, generator=g, dtype=torch.float64) @ torch.randn(2, 3, n, generator=g, dtype=torch.float64))
    M = torch.cat([low, _well_conditioned(2, n, torch.float64, seed=6)]).to(dtype)
    _, _, _, P, sweeps = get_ext().polar_svd(M.numpy(), False, False, True, method="newton")
    assert (sweeps[:2] > 0).all() and (sweeps[2:] < 0).all()
    np.testing.assert_array_equal(P[:2], get_ext().polar(M[:2].numpy(), method="jacobi"))
    assert _orth_err(torch.from_numpy(P)) < (1e-5 if dtype == torch.float32 else 1e-12)
    with pytest.raises(ValueError, match="method"):
        get_ext().polar(M.numpy(), method="qr")


@needs_ext
def test_zero_matrix_and_repeated_columns():
    M = torch.zeros(2, 8, 8)
    U, S, Vh = K.svd_small(M)
    assert torch.equal(S, torch.zeros(2, 8))
    assert torch.allclose(U, torch.eye(8).expand(2, 8, 8)) and torch.allclose(Vh, torch.eye(8).expand(2, 8, 8))
    x = torch.randn(8, 1, dtype=torch.float64)
    M2 = x.expand(8, 8).clone()[None]  # rank one, equal columns
    P = K.polar(M2)
    assert _orth_err(P) < 1e-12


@needs_ext
def test_tiny_and_huge_scales():
    M = _well_conditioned(4, 32, torch.float64, seed=1)
    for s in (1e-150, 1e150):
        P = K.polar(M * s)
        assert (P - _ref64(M)[3]).abs().max().item() < 1e-11
        S = K.svd_small(M * s)[1]
        assert torch.allclose(S / s, torch.linalg.svdvals(M), rtol=1e-12)


def test_polar_other_dtypes_and_grad_route_to_torch():
    M = torch.randn(3, 16, 16)
    P = K.polar(M.to(torch.bfloat16))
    assert P.dtype == torch.bfloat16
    Mg = M.clone().requires_grad_(True)
    P = K.polar(Mg)
    P.sum().backward()  # differentiable through the reference
    assert Mg.grad is not None and torch.isfinite(Mg.grad).all()


def test_polar_routes_large_n_to_torch():
    M = torch.randn(2, polar_mod.CPU_MAX_N + 8, polar_mod.CPU_MAX_N + 8)
    assert polar_mod._route(M) == "torch" and polar_mod._route(M, polar_only=True) == "torch"
    if get_ext() is not None:
        assert polar_mod._route(torch.randn(2, 16, 16)) == "cpu"
        n = polar_mod.CPU_POLAR_MAX_N[torch.float32]
        assert polar_mod._route(torch.randn(2, n, n), polar_only=True) == "cpu"
    assert _orth_err(K.polar(M)) < 1e-5


@pytest.mark.parametrize(
    "bad,exc,match",
    [
        (torch.randn(3, 4, 5), ValueError, "square"),
        (torch.randn(2, 3, 4, 4), ValueError, r"\(n, n\) or \(B, n, n\)"),
        (torch.randn(5), ValueError, r"\(n, n\) or \(B, n, n\)"),
        (torch.ones(2, 4, 4, dtype=torch.int64), TypeError, "floating-point"),
    ],
)
def test_bad_shapes(bad, exc, match):
    with pytest.raises(exc, match=match):
        K.polar(bad)
    with pytest.raises(exc, match=match):
        K.svd_small(bad)


@pytest.mark.parametrize("val", [float("nan"), float("inf")])
def test_nonfinite_input_raises(val):
    M = torch.randn(2, 8, 8)
    M[1, 3, 4] = val
    with pytest.raises(ValueError, match="NaN or inf"):
        K.polar(M)
    with pytest.raises(ValueError, match="NaN or inf"):
        K.svd_small(M)


@needs_ext
def test_extension_rejects_bad_input_directly():
    ext = get_ext()
    with pytest.raises(ValueError, match="square"):
        ext.polar(np.zeros((2, 3, 4), dtype=np.float32))
    with pytest.raises(ValueError, match="B, n, n"):
        ext.polar(np.zeros((3, 3), dtype=np.float32))
    with pytest.raises(TypeError, match="float32 or float64"):
        ext.polar(np.zeros((1, 3, 3), dtype=np.complex64))


@needs_ext
def test_thread_count_does_not_change_results():
    M = np.random.default_rng(0).standard_normal((9, 24, 24))
    ext = get_ext()
    a = ext.polar(M, num_threads=1)
    b = ext.polar(M, num_threads=2)
    np.testing.assert_array_equal(a, b)


# ---- CUDA ------------------------------------------------------------------------------

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not has_cuda_kernels(), reason="needs CUDA kernels and a CUDA device")


@gpu
@needs_cuda
@pytest.mark.parametrize("n", [1, 2, 16, 17, 32, 48, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cuda_polar_matches_reference(n, dtype):
    M = _well_conditioned(70, n, dtype, seed=n).cuda()
    assert polar_mod._route(M) == "cuda"
    U, S, Vh = K.svd_small(M)
    P = K.polar(M)
    assert P.is_cuda and P.dtype == dtype
    _, Sref, _, Pref = _ref64(M.cpu())
    tol = 1e-5 if dtype == torch.float32 else 1e-11
    assert (P.cpu().double() - Pref).abs().max().item() < tol
    assert (S.cpu().double() - Sref).abs().max().item() < tol * 10
    assert _orth_err(U.cpu()) < tol and _orth_err(Vh.cpu().transpose(-1, -2)) < tol


@gpu
@needs_cuda
def test_cuda_rank_deficient_and_zero():
    n = 32
    L = torch.randn(3, n, 4, dtype=torch.float64)
    M = torch.cat([L @ torch.randn(3, 4, n, dtype=torch.float64), torch.zeros(1, n, n, dtype=torch.float64)])
    P = K.polar(M.cuda()).cpu()
    assert _orth_err(P) < 1e-10
    tr = torch.einsum("bij,bij->b", P, M)
    assert torch.allclose(tr, torch.linalg.svdvals(M).sum(-1), atol=1e-9)


def test_unchecked_polar_turns_a_non_finite_matrix_into_nan_and_leaves_the_rest():
    """check_finite=False (no host sync on CUDA) must still never return a number for a NaN / inf
    input: that matrix's factor is NaN, the others are exactly the checked path's."""
    g = torch.Generator().manual_seed(3)
    M = torch.randn(5, 12, 12, generator=g, dtype=torch.float64)
    M[1, 4, 7], M[3, 0, 0] = float("nan"), float("inf")
    P = K.polar(M, check_finite=False)
    bad = torch.isnan(P).flatten(1).all(1)
    assert bad.tolist() == [False, True, False, True, False]
    keep = torch.tensor([0, 2, 4])
    assert torch.equal(P[keep], K.polar(M[keep]))
    with pytest.raises(ValueError, match="NaN or inf"):
        K.polar(M)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_newton_polar_finds_a_planted_polar_factor(dtype):
    """M = Q H with Q orthogonal and H symmetric positive definite (condition up to 1e6): the
    asynchronous Newton iteration returns Q (float64; a float32 M is a different matrix, so its
    factor is checked against the SVD of that matrix), reports convergence, keeps M's dtype."""
    from lmc_fast.kernels.polar_newton import newton_polar

    g = torch.Generator().manual_seed(11)
    B, n = 4, 96
    Q = torch.linalg.qr(torch.randn(B, n, n, generator=g, dtype=torch.float64))[0]
    W = torch.linalg.qr(torch.randn(B, n, n, generator=g, dtype=torch.float64))[0]
    s = torch.stack([torch.logspace(0, -e, n, dtype=torch.float64) for e in (0.5, 2, 4, 6)])
    M = ((Q @ (W * s[:, None, :]) @ W.mT)).to(dtype)
    P, converged = newton_polar(M)
    assert P.dtype == dtype and converged.all()
    if dtype == torch.float64:
        assert (P - Q).abs().max() < 1e-9
    else:
        assert (P.double() - polar_mod.polar_reference(M.double())).abs().max() < 1e-5


def test_newton_polar_reports_what_it_cannot_converge():
    from lmc_fast.kernels.polar_newton import newton_polar

    M = torch.randn(3, 10, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    M[0, :, 4] = 0.0  # singular
    M[1, 3, 3] = float("nan")
    P, converged = newton_polar(M)
    assert converged.tolist() == [False, False, True]
    assert torch.allclose(P[2], polar_mod.polar_reference(M[2]), atol=1e-12)
