"""lerp_matmul (Triton: interpolated weight tiles formed inside the GEMM) vs materialising the
K interpolated weights then torch.baddbmm (cuBLAS), on CUDA, fp32 (IEEE, no TF32) and bf16,
with and without a row gather. On CPU it only says why it does not run: the Triton
interpreter is a correctness tool, not a speed path, and no JSON is written.

Usage: python bench/bench_lerp_matmul.py --device cuda [--quick] [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, print_table, record, write_results  # noqa: E402

from lmc_fast.kernels.lerp_matmul import lerp_matmul, lerp_matmul_reference, triton_available  # noqa: E402

# (K, tokens per point, out, in): the paper ViT's layers at 512 images (65 tokens), GPT-2 small's
CASES = [
    (25, 512 * 65, 768, 256),    # ViT qkv (fused as one)
    (25, 512 * 65, 512, 256),    # ViT fc1
    (25, 512 * 65, 256, 512),    # ViT fc2
    (25, 8 * 128, 3072, 768),    # GPT-2 small fc1, 8 sequences
    (25, 8 * 128, 768, 3072),    # GPT-2 small fc2
]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--all-fp32", action="store_true", help="IEEE fp32 on every case, not the first only")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if dev.type != "cuda" or not torch.cuda.is_available() or not triton_available(dev):
        why = ("TRITON_INTERPRET is set" if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
               else "no CUDA device")
        print(f"bench_lerp_matmul: skipped ({why}); the Triton kernel is benchmarked on CUDA only. Nothing written.")
        return 0
    torch.backends.cuda.matmul.allow_tf32 = False
    cases = CASES[:2] if args.quick else CASES
    recs = []
    for i, (K, M, N, D) in enumerate(cases):
        # IEEE fp32 dots run at ~0.02x cuBLAS on an H200 (2026-12-04): one case says so, the
        # rest would take most of a device session's minutes
        for dtype in (torch.float32, torch.bfloat16) if i == 0 or args.all_fp32 else (torch.bfloat16,):
            for gather in (False, True):
                g = torch.Generator(device=dev).manual_seed(K + M + N + D)
                x = torch.randn(K, M, D, device=dev, dtype=dtype, generator=g)
                wa = torch.randn(N, D, device=dev, dtype=dtype, generator=g) / D**0.5
                wb = torch.randn(N, D, device=dev, dtype=dtype, generator=g) / D**0.5
                ba = torch.randn(N, device=dev, dtype=dtype, generator=g)
                bb = torch.randn(N, device=dev, dtype=dtype, generator=g)
                lam = torch.linspace(0, 1, K, device=dev)
                ri = torch.randperm(N, device=dev) if gather else None

                def base():
                    # materialise in x's dtype (what a torch sweep does), then one batched GEMM
                    wbb = wb if ri is None else wb[ri]
                    bbb = bb if ri is None else bb[ri]
                    l3 = lam.to(dtype)[:, None, None]
                    W = (1 - l3) * wa + l3 * wbb
                    bias = (1 - l3[:, :, 0]) * ba + l3[:, :, 0] * bbb
                    return torch.baddbmm(bias.unsqueeze(1), x, W.transpose(1, 2))

                ours = lambda: lerp_matmul(x, wa, wb, lam, ba, bb, row_index=ri)  # noqa: E731
                t_ours, _ = median_time(ours, repeat=10, warmup=2, device=dev)
                t_base, _ = median_time(base, repeat=10, warmup=2, device=dev)
                ref = lerp_matmul_reference(x.float(), wa.float(), wb.float(), lam, ba.float(), bb.float(), ri)
                err = ((ours().float() - ref).abs().max() / ref.abs().max()).item()
                err_base = ((base().float() - ref).abs().max() / ref.abs().max()).item()
                flop = 2.0 * K * M * N * D / 1e9
                recs.append(record(
                    "lerp_matmul" + ("_gather" if gather else ""), device=dev, dtype=dtype,
                    sizes={"K": K, "M": M, "N": N, "D": D}, gflops=flop,
                    baseline="materialise K weights, then torch.baddbmm", baseline_s=t_base, ours_s=t_ours,
                    extra={"max_rel_err_vs_fp32_ref": err, "baseline_max_rel_err": err_base}))
                print_table(recs[-1:])
                path = write_results("lerp_matmul", recs, dev, out=args.out)  # each case: a timeout keeps the rest
    print(f"wrote {path}")
    print_table(recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
