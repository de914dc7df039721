"""Batched small SVD / polar factor: lmc_fast.kernels.polar vs batched torch.linalg.svd
(then U @ Vh). Usage: python bench/bench_polar.py [--device cuda] [--quick]"""
from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import matmul_peak, median_time, print_table, record, write_results  # noqa: E402

import lmc_fast.kernels as K  # noqa: E402
import lmc_fast.kernels._ext  # noqa: E402,F401
from lmc_fast.kernels.polar_newton import newton_polar  # noqa: E402

polar_mod = importlib.import_module("lmc_fast.kernels.polar")


def torch_polar(M):
    U, _, Vh = torch.linalg.svd(M)
    return U @ Vh


def nominal_flops(ext, M: torch.Tensor, what: str, method: str) -> dict:
    """Operation counts of our CPU kernels on this batch, from the iterations they report:
    Newton polar, 2 n^3 + 4 n^2 per iteration (a Gauss-Jordan inverse, the update, a
    transpose); one-sided Jacobi SVD, 9 n^2 (n - 1) per sweep (three dot products and two
    column rotations, of A and of V, for each of the n (n - 1) / 2 pairs)."""
    arr = M.numpy()
    n = M.shape[-1]
    if what == "polar":
        sweeps = ext.polar_svd(arr, False, False, True, method="newton")[4].astype("int64")
        iters = -sweeps[sweeps < 0]
        jacobi = sweeps[sweeps > 0]
        flops = iters.sum() * (2 * n**3 + 4 * n**2) + jacobi.sum() * 9 * n**2 * (n - 1)
        return {"gflop": float(flops) / 1e9, "newton_iterations_mean": float(iters.mean()) if iters.size else None,
                "jacobi_fallbacks": int(jacobi.size)}
    sweeps = ext.polar_svd(arr, True, True, False)[4].astype("int64")
    return {"gflop": float(sweeps.sum() * 9 * n**2 * (n - 1)) / 1e9, "jacobi_sweeps_mean": float(sweeps.mean())}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--quick", action="store_true", help="fewer sizes and repeats")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads for both torch and ours (0 = defaults); 1 = per-core comparison")
    ap.add_argument("--out", default=None, help="directory for the JSON (default bench/results/)")
    args = ap.parse_args(argv)
    dev = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    ext = K._ext.get_ext() if hasattr(K, "_ext") else None
    cases = [(16, 256), (32, 128), (48, 64), (64, 64), (128, 16), (256, 4)]
    if dev.type == "cuda":
        # n <= 64: the CUDA kernel; above, the asynchronous Newton iteration (a learned step's residual:
        # one matrix of the model width; weight matching's: 2048 for a 1.1B LLaMA)
        cases = [(16, 1024), (32, 1024), (64, 512), (256, 1), (2048, 1), (64, 4096), (128, 256), (256, 64)]
    if args.quick:
        cases = cases[:5] if dev.type == "cuda" else cases[:3]
    dtypes = [torch.float32, torch.float64]
    # Ours computes in double whatever the input dtype: the float64 matmul peak (at the same
    # thread count) is the yardstick for both.
    peak64 = matmul_peak(dev, torch.float64, 1024) if dev.type == "cpu" else None
    recs = []
    for n, B in cases:
        for dtype in dtypes:
            g = torch.Generator().manual_seed(n * 13 + B)
            M = torch.randn(B, n, n, generator=g, dtype=dtype).to(dev)
            if K.build_info().get("available") is False:
                print("lmc_fast._C is not built; nothing to benchmark", file=sys.stderr)
                return 1
            rep = 3 if n >= 128 else 5
            threads = args.threads if args.threads > 0 else 0
            # Ours, forced through the compiled path where one exists for this device:
            # the polar factor (CPU: Newton iteration) and the full SVD (Jacobi).
            if dev.type == "cpu":
                arr = M.numpy()
                ours_polar = lambda: ext.polar(arr, num_threads=threads)  # noqa: E731
                ours_svd = lambda: ext.polar_svd(arr, True, True, False, num_threads=threads)  # noqa: E731
                suffix = "cpu" + (f"-{args.threads}thread" if args.threads > 0 else "")
                kinds = (("polar", "newton", ours_polar, lambda: torch_polar(M),
                          "torch.linalg.svd batched, then U @ Vh"),
                         ("svd", "jacobi", ours_svd, lambda: torch.linalg.svd(M), "torch.linalg.svd batched"))
            elif n <= polar_mod.CUDA_MAX_N and K.has_cuda_kernels():
                suffix = "cuda"
                kinds = (("polar", "jacobi", lambda: polar_mod._cuda_call(M, False, False, True), lambda: torch_polar(M),
                          "torch.linalg.svd batched, then U @ Vh"),)
            elif dev.type == "cuda":
                suffix = "cuda"
                kinds = (("polar", "newton", lambda: newton_polar(M)[0], lambda: torch_polar(M),
                          "torch.linalg.svd batched, then U @ Vh"),)
            else:
                continue
            Pref = torch_polar(M.double())
            P_ours = (newton_polar(M)[0] if n > polar_mod.CUDA_MAX_N else K.polar(M)) if dev.type != "cpu" \
                else torch.from_numpy(ours_polar())
            err = (P_ours.double() - Pref).abs().max().item()
            for what, method, ours, base, base_name in kinds:
                t_ours, _ = median_time(ours, repeat=rep, device=dev)
                t_base, _ = median_time(base, repeat=rep, device=dev)
                work = nominal_flops(ext, M, what, method) if dev.type == "cpu" else {}
                if work:
                    work["fraction_of_fp64_peak"] = work["gflop"] / t_ours / peak64
                    work["gflops"] = work["gflop"] / t_ours
                recs.append(record(
                    f"{what}_{suffix}-{method}", device=dev, dtype=dtype, sizes={"B": B, "n": n},
                    baseline=base_name, baseline_s=t_base, ours_s=t_ours,
                    extra={"method": method, "ours_threads": threads or "default",
                           "default_route": polar_mod._route(M, polar_only=what == "polar"),
                           **work, **({"fp64_matmul_peak_gflops": peak64} if work else {}),
                           **({"polar_max_abs_err_vs_fp64": err} if what == "polar" else {})}))
            print_table(recs[-len(kinds):])
    path = write_results("polar" + (f"_{args.threads}thread" if args.threads > 0 else ""), recs, dev, out=args.out)
    print(f"wrote {path}")
    print_table(recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
