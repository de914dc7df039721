"""Batched linear assignment: lmc_fast.kernels.linear_assignment (C++ Jonker-Volgenant,
OpenMP over the batch) vs scipy.optimize.linear_sum_assignment in a loop.
"warm" rows: the problem is a Gaussian score matrix plus 1% noise, solved by ours from the
column prices of the unperturbed solve (as weight matching does from sweep to sweep), by
ours cold, and by scipy (which has no warm start).
"cuda" rows (--device cuda): the scores start and the indices end on the GPU, as in a GPU
weight-matching or learned-matching step; ours copies them to the host and back (included in
its time), the baseline is the same copies around scipy in a loop. Shapes: what our head and
MLP groups produce (layers x units) and the published GPU-solver benchmark (208 x 300 x 300).
Usage: python bench/bench_assignment.py [--quick] [--device cuda]"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, print_table, record, write_results  # noqa: E402

import lmc_fast.kernels as K  # noqa: E402


def scipy_loop(Cn, maximize=True):
    return [linear_sum_assignment(Cn[b], maximize=maximize)[1] for b in range(Cn.shape[0])]


# (B, n, what): the groups' assignment problems, one per layer, solved as one batch
DEVICE_CASES = [(12, 12, "GPT-2 small heads (12 layers x 12 heads)"), (12, 512, "paper ViT MLP units"),
                (208, 300, "published GPU-solver benchmark shape"), (12, 3072, "GPT-2 small MLP units"),
                (2, 5632, "TinyLlama-1.1B SwiGLU units, 2 of 22 layers")]


def device_rows(dev, args) -> int:
    """Scores on the GPU: ours (host JV, copies included) vs scipy in a loop (copies included)."""
    recs = []
    rng = np.random.default_rng(0)
    for B, n, what in DEVICE_CASES[:3] if args.quick else DEVICE_CASES:
        C = torch.from_numpy(rng.standard_normal((B, n, n))).to(dev, torch.float32)
        rep = 1 if n >= 3072 else 3
        t_ours, _ = median_time(lambda: K.linear_assignment(C), repeat=rep, warmup=1, device=dev)
        last = []

        def base():
            last[:] = [torch.from_numpy(np.stack(scipy_loop(C.cpu().double().numpy()))).to(dev)]

        t_base, _ = median_time(base, repeat=rep, warmup=0, device=dev)
        ours, ref = K.linear_assignment(C), last[0].cpu()
        same = torch.allclose(K.assignment_objective(C.cpu().double(), ours.cpu()),
                              K.assignment_objective(C.cpu().double(), ref), rtol=1e-9, atol=1e-6)
        recs.append(record(
            "linear_assignment_from_cuda", device=dev, dtype=torch.float32,
            sizes={"B": B, "n": n, "m": n, "scores": "gauss", "what": what},
            baseline="C.cpu(), scipy.optimize.linear_sum_assignment in a loop, indices .to(cuda)",
            baseline_s=t_base, ours_s=t_ours,
            extra={"same_objective": bool(same), "ours": "C++ Jonker-Volgenant on the host (OpenMP over the batch), "
                   "copies both ways included", "omp_threads": K.build_info().get("openmp_threads")}))
        print_table(recs[-1:])
        path = write_results("assignment", recs, dev, out=args.out)  # after each case: a timeout keeps the rest
    print(f"wrote {path}")
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not K.has_ext():
        print("lmc_fast._C is not built; nothing to benchmark", file=sys.stderr)
        return 1
    if torch.device(args.device).type == "cuda":
        return device_rows(torch.device(args.device), args)
    # (B, n, m, kind): kind "rand" = uniform scores (weight-matching-like correlations are
    # close to this), "gauss" = Gaussian, "int" = integer scores with ties.
    cases = [(1, 512, 512, "rand"), (4, 512, 512, "rand"), (8, 768, 768, "gauss"),
             (4, 1024, 1024, "rand"), (4, 2048, 2048, "rand"), (4, 3072, 3072, "gauss"),
             (4, 1024, 1024, "int"), (4, 768, 3072, "rand")]
    if args.quick:
        cases = cases[:3]
    recs = []
    rng = np.random.default_rng(0)
    for B, n, m, kind in cases:
        if kind == "rand":
            Cn = rng.random((B, n, m))
        elif kind == "gauss":
            Cn = rng.standard_normal((B, n, m))
        else:
            Cn = rng.integers(0, 100, (B, n, m)).astype(np.float64)
        C = torch.from_numpy(Cn)
        rep = 3 if n * m * B >= 4 * 2048 * 2048 else 5
        t_ours, _ = median_time(lambda: K.linear_assignment(C), repeat=rep, warmup=1)
        t_base, _ = median_time(lambda: scipy_loop(Cn), repeat=rep, warmup=0)
        ours = K.linear_assignment(C)
        obj_ours = K.assignment_objective(C, ours)
        obj_ref = torch.tensor([Cn[b][np.arange(n), c].sum() for b, c in enumerate(scipy_loop(Cn))])
        recs.append(record(
            "linear_assignment_cpp_jv", device="cpu", dtype=torch.float64,
            sizes={"B": B, "n": n, "m": m, "scores": kind},
            baseline="scipy.optimize.linear_sum_assignment in a loop", baseline_s=t_base,
            ours_s=t_ours, extra={"same_objective": bool(torch.allclose(obj_ours, obj_ref, rtol=1e-12, atol=1e-9)),
                                  "omp_threads": K.build_info().get("openmp_threads")}))
        print_table(recs[-1:])
    warm_cases = [(4, 1024, 1024, 0.01), (4, 3072, 3072, 0.01)]
    for B, n, m, eps in warm_cases[:1] if args.quick else warm_cases:
        base = torch.from_numpy(rng.standard_normal((B, n, m)))
        C = base + eps * torch.from_numpy(rng.standard_normal((B, n, m)))
        Cn = C.numpy()
        _, duals = K.linear_assignment(base, return_duals=True)
        t_warm, _ = median_time(lambda: K.linear_assignment(C, duals=duals), repeat=3, warmup=1)
        ours = K.linear_assignment(C, duals=duals)
        t_cold, _ = median_time(lambda: K.linear_assignment(C), repeat=3, warmup=1)
        t_base, _ = median_time(lambda: scipy_loop(Cn), repeat=3, warmup=0)
        obj_ref = torch.tensor([Cn[b][np.arange(n), c].sum() for b, c in enumerate(scipy_loop(Cn))])
        recs.append(record(
            "linear_assignment_cpp_jv_warm", device="cpu", dtype=torch.float64,
            sizes={"B": B, "n": n, "m": m, "scores": f"gauss + {eps} noise, warm prices"},
            baseline="scipy.optimize.linear_sum_assignment in a loop", baseline_s=t_base, ours_s=t_warm,
            extra={"ours_cold_s": t_cold, "warm_vs_cold": t_cold / t_warm,
                   "same_objective": bool(torch.allclose(K.assignment_objective(C, ours), obj_ref, rtol=1e-12,
                                                         atol=1e-9)),
                   "omp_threads": K.build_info().get("openmp_threads")}))
        print_table(recs[-1:])
    path = write_results("assignment", recs, out=args.out)
    print(f"wrote {path}")
    print_table(recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
