"""Batched small SVD / polar factor: lmc_fast.kernels.polar vs batched torch.linalg.svd
(then U @ Vh). Usage: python bench/bench_polar.py [--device cuda] [--quick]"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, print_table, record, write_results  # noqa: E402

import lmc_fast.kernels as K  # noqa: E402
import lmc_fast.kernels._ext  # noqa: E402,F401

polar_mod = importlib.import_module("lmc_fast.kernels.polar")


def torch_polar(M):
    U, _, Vh = torch.linalg.svd(M)
    return U @ Vh


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads for both torch and ours (0 = defaults); 1 = per-core comparison")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    ext = K._ext.get_ext() if hasattr(K, "_ext") else None
    cases = [(16, 256), (32, 128), (48, 64), (64, 64), (128, 16), (256, 4)]
    if dev.type == "cuda":
        cases = [(16, 1024), (32, 1024), (64, 512), (64, 4096), (128, 256), (256, 64)]
    if args.quick:
        cases = cases[:3]
    dtypes = [torch.float32, torch.float64]
    recs = []
    for n, B in cases:
        for dtype in dtypes:
            g = torch.Generator().manual_seed(n * 13 + B)
            M = torch.randn(B, n, n, generator=g, dtype=dtype).to(dev)
            # Ours, forced through the compiled path where one exists for this device.
            if dev.type == "cpu":
                if args.threads > 0:
                    arr = M.numpy()
                    ours = lambda: (None, None, None, torch.from_numpy(ext.polar(arr, num_threads=args.threads)))  # noqa: E731
                else:
                    ours = lambda: polar_mod._cpu_call(M, False, False, True)  # noqa: E731
                path = "cpu-jacobi" + (f"-{args.threads}thread" if args.threads > 0 else "")
            elif n <= polar_mod.CUDA_MAX_N and K.has_cuda_kernels():
                ours = lambda: polar_mod._cuda_call(M, False, False, True)  # noqa: E731
                path = "cuda-jacobi"
            else:
                continue
            if K.build_info().get("available") is False:
                print("lmc_fast._C is not built; nothing to benchmark", file=sys.stderr)
                return 1
            rep = 3 if n >= 128 else 5
            t_ours, _ = median_time(ours, repeat=rep, device=dev)
            t_base, _ = median_time(lambda: torch_polar(M), repeat=rep, device=dev)
            err = (ours()[3].double() - torch_polar(M.double())).abs().max().item()
            recs.append(record(
                f"polar_{path}", device=dev, dtype=dtype, sizes={"B": B, "n": n},
                baseline="torch.linalg.svd batched, then U @ Vh", baseline_s=t_base, ours_s=t_ours,
                extra={"max_abs_err_vs_fp64": err, "default_route": polar_mod._route(M)}))
            print_table(recs[-1:])
    path = write_results("polar" + (f"_{args.threads}thread" if args.threads > 0 else ""), recs, dev)
    print(f"wrote {path}")
    print_table(recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
