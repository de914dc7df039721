"""Batched linear assignment: lmc_fast.kernels.linear_assignment (C++ Jonker-Volgenant,
OpenMP over the batch) vs scipy.optimize.linear_sum_assignment in a loop.
"warm" rows: the problem is a Gaussian score matrix plus 1% noise, solved by ours from the
column prices of the unperturbed solve (as weight matching does from sweep to sweep), by
ours cold, and by scipy (which has no warm start).
Usage: python bench/bench_assignment.py [--quick]"""
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


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    if not K.has_ext():
        print("lmc_fast._C is not built; nothing to benchmark", file=sys.stderr)
        return 1
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
    path = write_results("assignment", recs)
    print(f"wrote {path}")
    print_table(recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
