"""Interpolated-weight GEMM for lambda sweeps: one op, one file.

    Y[k] = X[k] @ W(lam_k)^T + b(lam_k),
    W(lam) = (1 - lam) W_A + lam W_B[row_index][:, col_index],
    b(lam) = (1 - lam) b_A + lam b_B[row_index]

for K interpolation points at once. The Triton kernel forms each interpolated weight tile
in registers inside the GEMM (the K weight copies are never materialised in memory) and,
when index vectors are given, gathers the permuted rows / columns of W_B on the fly, so an
alignment that is a permutation never needs a permuted copy of model B either.

- ``lerp_matmul``: the launcher (shape / dtype / device checks with clear errors, block
  sizes); the Triton kernel on CUDA, or under ``TRITON_INTERPRET=1`` for CPU tensors
  (tests only: the interpreter is not a speed path). Elsewhere it falls back to the reference.
- ``lerp_matmul_reference``: plain torch (materialise the K weights, then one batched GEMM).

dtypes: float32, bfloat16 and float16 inputs; accumulation in float32 always; the output
has X's dtype. In float32 the kernel's dot uses IEEE fp32 products by default
(``allow_tf32=False``) so that a sweep matches the per-lambda loop to 1e-5 relative.
"""
from __future__ import annotations

import os

import torch

__all__ = ["lerp_matmul", "lerp_matmul_reference", "triton_available", "pick_blocks"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

try:  # triton is optional: CPU-only installs run the reference
    import triton
    import triton.language as tl

    _HAVE_TRITON = True
except Exception:  # noqa: BLE001 - any import failure means "no Triton here"
    triton = tl = None
    _HAVE_TRITON = False


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_available(device: torch.device | str) -> bool:
    """True when the Triton kernel can run for tensors on `device` (CUDA, or CPU tensors
    under the Triton interpreter)."""
    if not _HAVE_TRITON:
        return False
    device = torch.device(device)
    if device.type == "cuda":
        return not _interpreting() and torch.cuda.is_available()
    return device.type == "cpu" and _interpreting()


if _HAVE_TRITON:

    @triton.jit
    def _lerp_matmul_kernel(
        x_ptr, wa_ptr, wb_ptr, lam_ptr, ba_ptr, bb_ptr, ridx_ptr, cidx_ptr, y_ptr,
        M, N, D: tl.constexpr,
        sxk, sxm, sxd,
        swan, swad,
        swbn, swbd,
        syk, sym, syn,
        HAS_BIAS: tl.constexpr, HAS_RIDX: tl.constexpr, HAS_CIDX: tl.constexpr,
        DOT_F32: tl.constexpr, PRECISION: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, GROUP_M: tl.constexpr,
    ):
        # D (the input width) is a compile-time constant: one compile per layer width (few in
        # a model), and the interpreter cannot loop over a runtime scalar with numpy >= 2.
        # program_id(0): an (m, n) output tile, grouped along m for L2 reuse of weight tiles;
        # program_id(1): the interpolation point k.
        pid = tl.program_id(0)
        k = tl.program_id(1)
        n_m = tl.cdiv(M, BM)
        n_n = tl.cdiv(N, BN)
        per_group = GROUP_M * n_n
        group = pid // per_group
        first_m = group * GROUP_M
        size_m = tl.minimum(n_m - first_m, GROUP_M)
        pm = first_m + (pid % per_group) % size_m
        pn = (pid % per_group) // size_m

        lam = tl.load(lam_ptr + k).to(tl.float32)
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        mask_m = rm < M
        mask_n = rn < N
        if HAS_RIDX:
            rows_b = tl.load(ridx_ptr + rn, mask=mask_n, other=0)
        else:
            rows_b = rn
        x_base = x_ptr + k * sxk
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for d0 in range(0, D, BD):
            rd = d0 + tl.arange(0, BD)
            mask_d = rd < D
            if HAS_CIDX:
                cols_b = tl.load(cidx_ptr + rd, mask=mask_d, other=0)
            else:
                cols_b = rd
            xt = tl.load(x_base + rm[:, None] * sxm + rd[None, :] * sxd,
                         mask=mask_m[:, None] & mask_d[None, :], other=0.0)
            wmask = mask_n[:, None] & mask_d[None, :]
            wa = tl.load(wa_ptr + rn[:, None] * swan + rd[None, :] * swad, mask=wmask, other=0.0).to(tl.float32)
            wb = tl.load(wb_ptr + rows_b[:, None] * swbn + cols_b[None, :] * swbd, mask=wmask, other=0.0).to(tl.float32)
            w = (1.0 - lam) * wa + lam * wb  # (BN, BD) interpolated tile, fp32
            if DOT_F32:
                acc = tl.dot(xt.to(tl.float32), tl.trans(w), acc, input_precision=PRECISION)
            else:  # bf16 / fp16 operands on tensor cores, fp32 accumulation
                acc = tl.dot(xt, tl.trans(w.to(xt.dtype)), acc)
        if HAS_BIAS:
            bias_a = tl.load(ba_ptr + rn, mask=mask_n, other=0.0).to(tl.float32)
            bias_b = tl.load(bb_ptr + rows_b, mask=mask_n, other=0.0).to(tl.float32)
            acc += ((1.0 - lam) * bias_a + lam * bias_b)[None, :]
        y = y_ptr + k * syk + rm[:, None] * sym + rn[None, :] * syn
        tl.store(y, acc.to(y_ptr.dtype.element_ty), mask=mask_m[:, None] & mask_n[None, :])


def _pow2_clamp(n: int, lo: int, hi: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return max(lo, min(hi, p))


def pick_blocks(M: int, N: int, D: int, dtype: torch.dtype, interpret: bool) -> dict:
    """Block sizes (powers of two, >= 16 as tl.dot requires) and launch settings."""
    if interpret:  # fewer, larger programs make the numpy interpreter faster
        return dict(BM=_pow2_clamp(M, 16, 64), BN=_pow2_clamp(N, 16, 64), BD=_pow2_clamp(D, 16, 64),
                    GROUP_M=4, num_warps=4, num_stages=1)
    wide = dtype != torch.float32
    BM = 128 if M >= 128 else _pow2_clamp(M, 16, 64)
    BN = 128 if N >= 128 else _pow2_clamp(N, 16, 64)
    BD = (64 if wide else 32) if D >= 64 else _pow2_clamp(D, 16, 32)
    num_warps = 8 if BM * BN >= 128 * 128 else 4
    return dict(BM=BM, BN=BN, BD=BD, GROUP_M=8, num_warps=num_warps, num_stages=3)


def _as_index(idx, n: int, what: str, device) -> torch.Tensor | None:
    if idx is None:
        return None
    if not isinstance(idx, torch.Tensor):
        idx = torch.as_tensor(idx)
    if idx.dtype not in (torch.int32, torch.int64) or idx.dim() != 1:
        raise TypeError(f"lerp_matmul: {what} must be a 1-D int32/int64 tensor, got {idx.dtype} of shape {tuple(idx.shape)}")
    if idx.shape[0] != n:
        raise ValueError(f"lerp_matmul: {what} has {idx.shape[0]} entries, expected {n}")
    if idx.device != torch.device(device):
        raise ValueError(f"lerp_matmul: {what} is on {idx.device}, the inputs on {device}")
    return idx


def _check(x, w_a, w_b, lam, b_a, b_b, row_index, col_index):
    for name, t in (("x", x), ("w_a", w_a), ("w_b", w_b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"lerp_matmul: {name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in _DTYPES:
            raise TypeError(f"lerp_matmul: {name} has dtype {t.dtype}; supported: float32, bfloat16, float16")
    if x.dim() < 2:
        raise ValueError(f"lerp_matmul: x must be (K, ..., in), got shape {tuple(x.shape)}")
    if w_a.dim() != 2 or w_a.shape != w_b.shape:
        raise ValueError(f"lerp_matmul: w_a and w_b must both be (out, in) of one shape, got "
                         f"{tuple(w_a.shape)} and {tuple(w_b.shape)}")
    if x.shape[-1] != w_a.shape[1]:
        raise ValueError(f"lerp_matmul: x has {x.shape[-1]} input features, the weights {w_a.shape[1]}")
    if not (x.dtype == w_a.dtype == w_b.dtype):
        raise TypeError(f"lerp_matmul: x, w_a, w_b must share a dtype, got {x.dtype}, {w_a.dtype}, {w_b.dtype}")
    K = x.shape[0]
    lam = torch.as_tensor(lam, device=x.device)
    if lam.dim() != 1 or lam.shape[0] != K:
        raise ValueError(f"lerp_matmul: lam must be a 1-D tensor of K={K} values, got shape {tuple(lam.shape)}")
    if not lam.is_floating_point():
        lam = lam.to(torch.float32)
    if (b_a is None) != (b_b is None):
        raise ValueError("lerp_matmul: pass both biases b_a and b_b or neither")
    if b_a is not None:
        if b_a.shape != (w_a.shape[0],) or b_b.shape != (w_a.shape[0],):
            raise ValueError(f"lerp_matmul: biases must be ({w_a.shape[0]},), got {tuple(b_a.shape)} and {tuple(b_b.shape)}")
    devs = {t.device for t in (x, w_a, w_b, lam) + ((b_a, b_b) if b_a is not None else ())}
    if len(devs) != 1:
        raise ValueError(f"lerp_matmul: all inputs must be on one device, got {sorted(map(str, devs))}")
    ridx = _as_index(row_index, w_a.shape[0], "row_index", x.device)
    cidx = _as_index(col_index, w_a.shape[1], "col_index", x.device)
    return lam, ridx, cidx


def lerp_matmul_reference(x, w_a, w_b, lam, b_a=None, b_b=None, row_index=None, col_index=None):
    """Plain torch: materialise W(lam_k) for every k (float32), then one batched GEMM."""
    lam, ridx, cidx = _check(x, w_a, w_b, lam, b_a, b_b, row_index, col_index)
    K, lead, D = x.shape[0], x.shape[1:-1], x.shape[-1]
    wb = w_b if ridx is None else w_b[ridx]
    wb = wb if cidx is None else wb[:, cidx]
    lam32 = lam.to(torch.float32)
    l3 = lam32[:, None, None]
    W = (1.0 - l3) * w_a.float() + l3 * wb.float()
    x3 = x.reshape(K, -1, D).float()
    if b_a is None:
        y = torch.bmm(x3, W.transpose(1, 2))
    else:
        bb = b_b if ridx is None else b_b[ridx]
        l2 = lam32[:, None]
        bias = (1.0 - l2) * b_a.float() + l2 * bb.float()
        y = torch.baddbmm(bias.unsqueeze(1), x3, W.transpose(1, 2))
    return y.to(x.dtype).reshape(K, *lead, w_a.shape[0])


def lerp_matmul(x, w_a, w_b, lam, b_a=None, b_b=None, row_index=None, col_index=None, *,
                allow_tf32: bool = False, force_reference: bool = False):
    """x (K, ..., in), w_a / w_b (out, in), lam (K,), b_a / b_b (out,) or None, row_index (out,) /
    col_index (in,) optional gathers into w_b (and b_b) -> (K, ..., out) in x's dtype.

    Runs the Triton kernel where `triton_available(x.device)`, else the reference.
    """
    lam, ridx, cidx = _check(x, w_a, w_b, lam, b_a, b_b, row_index, col_index)
    if force_reference or not triton_available(x.device):
        return lerp_matmul_reference(x, w_a, w_b, lam, b_a, b_b, ridx, cidx)
    K, lead, D = x.shape[0], x.shape[1:-1], x.shape[-1]
    N = w_a.shape[0]
    x3 = x.reshape(K, -1, D)
    M = x3.shape[1]
    y = torch.empty((K, M, N), dtype=x.dtype, device=x.device)
    if K == 0 or M == 0 or N == 0:
        return y.reshape(K, *lead, N)
    if D == 0:
        return lerp_matmul_reference(x, w_a, w_b, lam, b_a, b_b, ridx, cidx)
    interp = _interpreting()
    cfg = pick_blocks(M, N, D, x.dtype, interp)
    # fp32 operands for fp32 inputs (IEEE unless tf32 is allowed) and in the interpreter,
    # whose bf16 arithmetic is wrong; bf16 / fp16 operands on the GPU.
    dot_f32 = x.dtype == torch.float32 or interp
    precision = "tf32" if (allow_tf32 and not interp) else "ieee"
    lam32 = lam.to(torch.float32).contiguous()
    b_a = b_a.contiguous() if b_a is not None else None
    b_b = b_b.contiguous() if b_b is not None else None
    ridx = ridx.contiguous() if ridx is not None else None
    cidx = cidx.contiguous() if cidx is not None else None
    dummy = lam32  # stands in for absent optional pointers (never read)
    grid = (triton.cdiv(M, cfg["BM"]) * triton.cdiv(N, cfg["BN"]), K)
    _lerp_matmul_kernel[grid](
        x3, w_a, w_b, lam32,
        b_a if b_a is not None else dummy, b_b if b_b is not None else dummy,
        ridx if ridx is not None else dummy, cidx if cidx is not None else dummy, y,
        M, N, D,
        x3.stride(0), x3.stride(1), x3.stride(2),
        w_a.stride(0), w_a.stride(1),
        w_b.stride(0), w_b.stride(1),
        y.stride(0), y.stride(1), y.stride(2),
        HAS_BIAS=b_a is not None, HAS_RIDX=ridx is not None, HAS_CIDX=cidx is not None,
        DOT_F32=dot_f32, PRECISION=precision,
        BM=cfg["BM"], BN=cfg["BN"], BD=cfg["BD"], GROUP_M=cfg["GROUP_M"],
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return y.reshape(K, *lead, N)
