"""Batched linear assignment against scipy.optimize.linear_sum_assignment."""
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linear_sum_assignment

import lmc_fast.kernels as K
from lmc_fast.kernels._ext import get_ext

needs_ext = pytest.mark.skipif(get_ext() is None, reason="lmc_fast._C not built")


def _scipy_obj(C, maximize):
    C = np.asarray(C, dtype=np.float64)
    out = []
    for b in range(C.shape[0]):
        r, c = linear_sum_assignment(C[b], maximize=maximize)
        out.append(C[b][r, c].sum())
    return np.array(out)


def _check(C, cols, maximize):
    """cols is a valid injective assignment reaching scipy's optimum."""
    Cn = C.detach().cpu().to(torch.float64).numpy()
    cols = cols.cpu().numpy()
    B, n, m = Cn.shape
    assert cols.shape == (B, n) and cols.dtype == np.int64
    for b in range(B):
        assert len(set(cols[b].tolist())) == n
        assert cols[b].min() >= 0 and cols[b].max() < m
    ours = Cn[np.arange(B)[:, None], np.arange(n)[None, :], cols].sum(-1)
    ref = _scipy_obj(Cn, maximize)
    scale = np.abs(Cn).sum(axis=(1, 2)) / max(m, 1) + 1.0
    np.testing.assert_allclose(ours, ref, rtol=0, atol=1e-9 * scale.max())


@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("B,n,m", [(1, 1, 1), (3, 2, 2), (5, 17, 17), (4, 64, 64), (2, 200, 200),
                                   (3, 10, 31), (2, 100, 101), (2, 150, 300), (1, 1, 9)])
def test_random_matches_scipy(B, n, m, dtype, maximize):
    g = torch.Generator().manual_seed(B * 7919 + n * 31 + m)
    C = torch.randn(B, n, m, generator=g, dtype=torch.float64).to(dtype)
    _check(C, K.linear_assignment(C, maximize=maximize), maximize)


@pytest.mark.parametrize("maximize", [True, False])
@pytest.mark.parametrize("B,n,m,levels", [(4, 50, 50, 3), (4, 80, 80, 10), (3, 40, 70, 2),
                                          (2, 128, 128, 1), (2, 300, 300, 5)])
def test_integer_ties(B, n, m, levels, maximize):
    """Integer costs with many ties (levels=1: all equal)."""
    g = torch.Generator().manual_seed(n * levels + m)
    C = torch.randint(0, levels, (B, n, m), generator=g).to(torch.float64)
    _check(C, K.linear_assignment(C, maximize=maximize), maximize)


def test_structured_ties():
    # Identical rows, identical columns, a permutation matrix, a low-rank matrix.
    n = 40
    g = torch.Generator().manual_seed(0)
    row = torch.randn(1, n, generator=g, dtype=torch.float64)
    C = torch.stack([
        row.expand(n, n).clone(),
        row.T.expand(n, n).clone(),
        torch.eye(n, dtype=torch.float64)[torch.randperm(n, generator=g)],
        torch.randn(n, 2, generator=g, dtype=torch.float64) @ torch.randn(2, n, generator=g, dtype=torch.float64),
    ])
    for maximize in (True, False):
        _check(C, K.linear_assignment(C, maximize=maximize), maximize)


def test_integer_dtype_and_unbatched():
    g = torch.Generator().manual_seed(1)
    C = torch.randint(-50, 50, (30, 45), generator=g)
    cols = K.linear_assignment(C)
    assert cols.shape == (30,) and cols.dtype == torch.int64
    _check(C[None].double(), cols[None], True)


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 25),
    extra=st.integers(0, 10),
    levels=st.sampled_from([0, 2, 5, 1000]),
    maximize=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_hypothesis_matches_scipy(n, extra, levels, maximize, seed):
    rng = np.random.default_rng(seed)
    m = n + extra
    C = rng.integers(0, levels, (2, n, m)).astype(np.float64) if levels else rng.standard_normal((2, n, m)) * 1e3
    C = torch.from_numpy(C)
    _check(C, K.linear_assignment(C, maximize=maximize), maximize)


@needs_ext
def test_compiled_matches_reference_objective_large():
    g = torch.Generator().manual_seed(3)
    C = torch.rand(2, 512, 512, generator=g, dtype=torch.float64)
    ours = K.linear_assignment(C)
    ref = K.linear_assignment_reference(C)
    torch.testing.assert_close(K.assignment_objective(C, ours), K.assignment_objective(C, ref),
                               rtol=0, atol=1e-9)


@needs_ext
def test_threads_agree():
    ext = get_ext()
    C = np.random.default_rng(5).standard_normal((6, 60, 70))
    np.testing.assert_array_equal(ext.linear_assignment(C, True, 1), ext.linear_assignment(C, True, 2))


def test_empty():
    assert K.linear_assignment(torch.zeros(3, 0, 5)).shape == (3, 0)
    assert K.linear_assignment(torch.zeros(0, 4, 5)).shape == (0, 4)


def test_bad_inputs():
    with pytest.raises(ValueError, match="rows <= columns"):
        K.linear_assignment(torch.randn(2, 6, 5))
    with pytest.raises(ValueError, match="rows <= columns"):
        K.linear_assignment(torch.randn(6, 5))
    with pytest.raises(ValueError, match=r"\(n, m\) or \(B, n, m\)"):
        K.linear_assignment(torch.randn(2, 2, 3, 3))
    C = torch.randn(2, 4, 4)
    C[1, 2, 2] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        K.linear_assignment(C)
    C[1, 2, 2] = float("-inf")
    with pytest.raises(ValueError, match="NaN or inf"):
        K.linear_assignment(C)


@needs_ext
def test_extension_errors_directly():
    ext = get_ext()
    with pytest.raises(ValueError, match="rows <= columns"):
        ext.linear_assignment(np.zeros((1, 3, 2)))
    with pytest.raises(ValueError, match="finite"):
        ext.linear_assignment(np.full((1, 2, 2), np.nan))
    with pytest.raises(ValueError, match="B, n, m"):
        ext.linear_assignment(np.zeros((3, 3)))


def test_fallback_without_extension(monkeypatch):
    import importlib

    amod = importlib.import_module("lmc_fast.kernels.assignment")
    monkeypatch.setattr(amod, "get_ext", lambda: None)
    C = torch.randn(2, 20, 25, dtype=torch.float64)
    _check(C, K.linear_assignment(C), True)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_tensor_roundtrip():
    C = torch.randn(3, 64, 80, device="cuda")
    cols = K.linear_assignment(C)
    assert cols.is_cuda and cols.dtype == torch.int64
    _check(C.cpu(), cols.cpu(), True)


@needs_ext
@pytest.mark.parametrize("init_level", [0, 1, 2])
@pytest.mark.parametrize("kind", ["gauss", "int"])
def test_all_init_levels_exact(init_level, kind):
    """Every initialisation variant of the JV solver (none / column reduction + transfer /
    + augmenting row reduction) reaches scipy's optimum, with and without ties."""
    rng = np.random.default_rng(init_level * 10 + len(kind))
    C = rng.standard_normal((3, 90, 90)) if kind == "gauss" else rng.integers(0, 4, (3, 90, 90)).astype(float)
    for maximize in (True, False):
        cols = get_ext().linear_assignment(C, maximize, 0, init_level)
        _check(torch.from_numpy(C), torch.from_numpy(cols), maximize)


@needs_ext
@pytest.mark.parametrize("prices", ["previous", "random", "huge", "zeros"])
@pytest.mark.parametrize("kind", ["gauss", "int"])
def test_warm_start_reaches_the_optimum_from_any_prices(prices, kind):
    """Warm-started solves are exact whatever prices they start from: prices of a similar
    earlier problem (the intended use), random or huge prices, and zeros; with ties too."""
    rng = np.random.default_rng(len(prices) * 7 + len(kind))
    B, n = 3, 120
    base = rng.standard_normal((B, n, n)) if kind == "gauss" else rng.integers(0, 4, (B, n, n)).astype(float)
    C = torch.from_numpy(base + (0.05 * rng.standard_normal((B, n, n)) if kind == "gauss" else 0))
    for maximize in (True, False):
        _, v_prev = K.linear_assignment(torch.from_numpy(base), maximize=maximize, return_duals=True)
        duals = {"previous": v_prev, "random": torch.from_numpy(rng.standard_normal((B, n))),
                 "huge": torch.from_numpy(1e6 * rng.standard_normal((B, n))),
                 "zeros": torch.zeros(B, n, dtype=torch.float64)}[prices]
        cols, v = K.linear_assignment(C, maximize=maximize, duals=duals, return_duals=True)
        _check(C, cols, maximize)
        assert v.shape == (B, n) and v.dtype == torch.float64 and bool(torch.isfinite(v).all())


@needs_ext
def test_warm_prices_are_dual_optimal():
    """The returned prices certify optimality: with u_i = min_j (c_ij - v_j) the dual
    objective sum(u) + sum(v) equals the primal optimum (minimisation sense)."""
    rng = np.random.default_rng(11)
    C = torch.from_numpy(rng.standard_normal((2, 80, 80)))
    cols, v = K.linear_assignment(C, maximize=False, return_duals=True)
    u = (C - v[:, None, :]).amin(-1)
    primal = K.assignment_objective(C, cols)
    torch.testing.assert_close(u.sum(-1) + v.sum(-1), primal, rtol=0, atol=1e-9)


@needs_ext
def test_warm_start_unbatched_rectangular_and_errors():
    rng = np.random.default_rng(12)
    C = torch.from_numpy(rng.standard_normal((50, 50)))
    cols, v = K.linear_assignment(C, return_duals=True)
    assert cols.shape == (50,) and v.shape == (50,)
    _check(C[None], K.linear_assignment(C + 0.01, duals=v)[None], True)
    # Rectangular problems ignore the prices (documented): still exact.
    R = torch.from_numpy(rng.standard_normal((2, 30, 45)))
    _check(R, K.linear_assignment(R, duals=torch.from_numpy(rng.standard_normal((2, 45)))), True)
    with pytest.raises(ValueError, match="duals of shape"):
        K.linear_assignment(C, duals=torch.zeros(49, dtype=torch.float64))
    bad = v.clone()
    bad[3] = float("nan")
    with pytest.raises(ValueError, match="NaN or inf"):
        K.linear_assignment(C, duals=bad)


def test_warm_start_fallback_returns_no_prices(monkeypatch):
    import importlib

    amod = importlib.import_module("lmc_fast.kernels.assignment")
    monkeypatch.setattr(amod, "get_ext", lambda: None)
    C = torch.randn(2, 20, 20, dtype=torch.float64)
    cols, v = K.linear_assignment(C, return_duals=True)
    assert v is None
    _check(C, cols, True)
    _check(C, K.linear_assignment(C, duals=torch.zeros(2, 20)), True)



@needs_ext
@pytest.mark.parametrize("maximize", [True, False])
def test_float32_scores_read_in_place_equal_their_float64_copy(maximize):
    """The solver reads float32 scores as doubles in place: the same assignment and the same prices as
    the exact float64 copy of those scores, cold and warm."""
    rng = np.random.default_rng(21)
    C32 = torch.from_numpy(rng.standard_normal((3, 120, 120)).astype(np.float32))
    C64 = C32.double()
    c32, v32 = K.linear_assignment(C32, maximize=maximize, return_duals=True)
    c64, v64 = K.linear_assignment(C64, maximize=maximize, return_duals=True)
    assert torch.equal(c32, c64) and torch.equal(v32, v64)
    moved = C32 + torch.from_numpy(0.05 * rng.standard_normal((3, 120, 120)).astype(np.float32))
    w32 = K.linear_assignment(moved, maximize=maximize, duals=v32)
    assert torch.equal(w32, K.linear_assignment(moved.double(), maximize=maximize, duals=v64))
    _check(moved, w32, maximize)


_PEAK_PROBE = r"""
import numpy as np, torch
import lmc_fast.kernels as K
def hwm():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
n = int(__import__("sys").argv[1])
C = torch.from_numpy(np.random.default_rng(0).standard_normal((1, n, n)).astype(np.float32))
K.linear_assignment(C[:, :50, :50])  # the extension loaded before the mark
open("/proc/self/clear_refs", "w").write("5")
base = hwm()
K.linear_assignment(C)
print(hwm() - base)
"""


@needs_ext
@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux's /proc/self/clear_refs")
def test_float32_scores_are_not_copied():
    """At 7B widths (n = 14336) a double copy of the scores is 1.6 GB: the solver must not make one. Its
    own process: the high-water mark over the solve stays below a third of such a copy."""
    n = 2048
    out = subprocess.run([sys.executable, "-c", _PEAK_PROBE, str(n)], capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.strip().splitlines()[-1]) < 8 * n * n / 3
