"""lerp_matmul (Triton) against its plain-torch reference on fresh random inputs.

On CPU the kernel runs under TRITON_INTERPRET=1 (set by conftest) in float32; on a CUDA
machine (TRITON_INTERPRET=0) the same tests run the compiled kernel, plus bf16 ones."""
import zlib

import pytest
import torch

from lmc_fast.kernels.lerp_matmul import lerp_matmul, lerp_matmul_reference, triton_available

if torch.cuda.is_available() and triton_available("cuda"):
    DEV = "cuda"
elif triton_available("cpu"):
    DEV = "cpu"
else:
    DEV = None
needs_kernel = pytest.mark.skipif(DEV is None, reason="no Triton path here (no CUDA, TRITON_INTERPRET unset)")


def _inputs(K, lead, N, D, seed, dtype=torch.float32, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    lam = torch.rand(K, generator=g)
    if K >= 2:  # the end points exactly
        lam[0], lam[-1] = 0.0, 1.0
    out = dict(x=r(K, *lead, D), w_a=r(N, D) / D**0.5, w_b=r(N, D) / D**0.5, lam=lam,
               b_a=r(N), b_b=r(N), row_index=torch.randperm(N, generator=g), col_index=torch.randperm(D, generator=g))
    return {k: (v.to(device=device, dtype=dtype) if v.is_floating_point() and k != "lam" else v.to(device))
            for k, v in out.items()}


# (K, leading dims, out, in): block multiples and not, K from 1 to 25, 2-D and 3-D inputs
SHAPES = [
    (1, (16,), 16, 16),
    (3, (37,), 50, 70),
    (25, (5,), 33, 17),
    (2, (130,), 20, 96),
    (4, (3, 7), 65, 40),
]


@needs_kernel
@pytest.mark.parametrize("K,lead,N,D", SHAPES)
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("gather", ["none", "rows", "cols", "both"])
def test_matches_reference_fp32(K, lead, N, D, bias, gather):
    t = _inputs(K, lead, N, D, seed=zlib.crc32(repr((K, lead, N, D, bias, gather)).encode()), device=DEV)
    kw = dict(b_a=t["b_a"] if bias else None, b_b=t["b_b"] if bias else None,
              row_index=t["row_index"] if gather in ("rows", "both") else None,
              col_index=t["col_index"] if gather in ("cols", "both") else None)
    y = lerp_matmul(t["x"], t["w_a"], t["w_b"], t["lam"], **kw)
    ref = lerp_matmul_reference(t["x"], t["w_a"], t["w_b"], t["lam"], **kw)
    assert y.shape == (K, *lead, N) and y.dtype == torch.float32
    torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)


@needs_kernel
def test_end_points_are_the_plain_models():
    t = _inputs(2, (19,), 24, 40, seed=7, device=DEV)
    lam = torch.tensor([0.0, 1.0], device=DEV)
    ri = t["row_index"]
    y = lerp_matmul(t["x"], t["w_a"], t["w_b"], lam, t["b_a"], t["b_b"], row_index=ri)
    torch.testing.assert_close(y[0], t["x"][0] @ t["w_a"].T + t["b_a"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y[1], t["x"][1] @ t["w_b"][ri].T + t["b_b"][ri], rtol=1e-5, atol=1e-5)


@needs_kernel
def test_non_contiguous_inputs():
    t = _inputs(3, (21,), 18, 34, seed=3, device=DEV)
    x = t["x"].transpose(1, 2).contiguous().transpose(1, 2)  # same values, other strides
    wb = t["w_b"].T.contiguous().T
    y = lerp_matmul(x, t["w_a"], wb, t["lam"], t["b_a"], t["b_b"])
    torch.testing.assert_close(y, lerp_matmul_reference(t["x"], t["w_a"], t["w_b"], t["lam"], t["b_a"], t["b_b"]),
                               rtol=1e-5, atol=1e-5)


def test_reference_is_the_materialised_interpolation():
    t = _inputs(3, (6,), 8, 5, seed=11)
    y = lerp_matmul_reference(t["x"], t["w_a"], t["w_b"], t["lam"], t["b_a"], t["b_b"], t["row_index"], t["col_index"])
    wb = t["w_b"][t["row_index"]][:, t["col_index"]]
    for k, l in enumerate(t["lam"].tolist()):
        W = (1 - l) * t["w_a"].double() + l * wb.double()
        b = (1 - l) * t["b_a"].double() + l * t["b_b"][t["row_index"]].double()
        torch.testing.assert_close(y[k].double(), t["x"][k].double() @ W.T + b, rtol=1e-5, atol=1e-5)


def test_reference_bf16_accumulates_in_fp32():
    t = _inputs(2, (9,), 12, 64, seed=5, dtype=torch.bfloat16)
    y = lerp_matmul_reference(t["x"], t["w_a"], t["w_b"], t["lam"])
    assert y.dtype == torch.bfloat16
    f = {k: v.float() if v.is_floating_point() else v for k, v in t.items()}
    ref = lerp_matmul_reference(f["x"], f["w_a"], f["w_b"], f["lam"])
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("bad,match", [
    (dict(w_b=torch.zeros(7, 8)), "one shape"),
    (dict(x=torch.zeros(2, 4, 9)), "input features"),
    (dict(lam=torch.zeros(3)), "K=2"),
    (dict(b_a=torch.zeros(6)), "both biases"),
    (dict(row_index=torch.arange(5)), "row_index has 5"),
    (dict(col_index=torch.arange(8.0)), "int32/int64"),
    (dict(x=torch.zeros(2, 4, 8, dtype=torch.float64)), "float64"),
    (dict(w_a=torch.zeros(6, 8, dtype=torch.bfloat16), w_b=torch.zeros(6, 8, dtype=torch.bfloat16)), "share a dtype"),
])
def test_clear_errors(bad, match):
    args = dict(x=torch.zeros(2, 4, 8), w_a=torch.zeros(6, 8), w_b=torch.zeros(6, 8), lam=torch.zeros(2))
    args.update(bad)
    with pytest.raises((ValueError, TypeError), match=match):
        lerp_matmul(**args)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gather", [False, True])
def test_cuda_low_precision(dtype, gather):
    if not triton_available("cuda"):
        pytest.skip("Triton CUDA path unavailable (TRITON_INTERPRET set?)")
    t = _inputs(25, (2, 65), 512, 256, seed=1, dtype=dtype, device="cuda")
    kw = dict(row_index=t["row_index"], col_index=t["col_index"]) if gather else {}
    y = lerp_matmul(t["x"], t["w_a"], t["w_b"], t["lam"], t["b_a"], t["b_b"], **kw)
    ref = lerp_matmul_reference(t["x"], t["w_a"], t["w_b"], t["lam"], t["b_a"], t["b_b"], **kw)
    assert y.dtype == dtype
    torch.testing.assert_close(y.float(), ref.float(), rtol=3e-2, atol=3e-2)


@pytest.mark.gpu
def test_cuda_fp32_large_ieee():
    if not triton_available("cuda"):
        pytest.skip("Triton CUDA path unavailable (TRITON_INTERPRET set?)")
    t = _inputs(25, (8, 129), 768, 256, seed=2, device="cuda")
    y = lerp_matmul(t["x"], t["w_a"], t["w_b"], t["lam"], t["b_a"], t["b_b"], t["row_index"])
    ref = lerp_matmul_reference(t["x"], t["w_a"], t["w_b"], t["lam"], t["b_a"], t["b_b"], t["row_index"])
    torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
