"""End-to-end weight matching of two GPT-2-small-sized random models: the C++ solvers
(lmc_fast._C: batched Jacobi polar/SVD, Jonker-Volgenant assignment) vs the plain
torch / scipy path (torch.linalg.svd, scipy.optimize.linear_sum_assignment in a loop), in
one process, toggled with lmc_fast.kernels.switch.use_extension.

Both runs use the same canonical parameters, the same max_iter and tol (so the same number
of sweeps unless one converges earlier: reported), and are timed as
`match.weight.weight_matching` (canonicalisation, identical for both, is timed once
separately). A breakdown of where the time goes (assignment, polar/SVD, correlation GEMMs,
apply_spec, objective) is measured by wrapping those functions with timers.

Usage: python bench/bench_weight_matching.py [--device cuda] [--max-iter 3] [--polish-iter 10] [--quick] [--out DIR]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import matmul_peak, print_table, record, sync, write_results  # noqa: E402

import lmc_fast as lf  # noqa: E402
import lmc_fast.kernels as kernels  # noqa: E402
from lmc_fast.kernels.switch import use_extension  # noqa: E402
from lmc_fast.match import solve as solve_mod  # noqa: E402
from lmc_fast.match.kinds import MATCHERS  # noqa: E402
from lmc_fast.match import weight as weight_mod  # noqa: E402
from lmc_fast.match.align import params_pair  # noqa: E402


def correlation_flops(group, pa) -> float:
    """FLOPs of a matcher's correlation for one group: 2 n n k per axis (heads: 2 H^2 d^2 r)."""
    total = 0.0
    for ax in group.axes:
        W = pa[ax.param]
        n = W.shape[ax.axis]
        k = W.numel() // n
        if group.kind == "heads":
            H, dh = group.n_heads, group.head_dim
            total += 2.0 * H * H * dh * dh * (W.numel() // (H * dh))
        else:
            total += 2.0 * n * n * k
    return total


@contextlib.contextmanager
def timed_calls(device):
    """Accumulate wall time per function family while active: {name: seconds}."""
    acc = defaultdict(float)
    counts = defaultdict(int)
    flops = defaultdict(float)
    patches = [(kernels, "linear_assignment", "assignment"), (kernels, "polar", "polar/svd"),
               (kernels, "svd_small", "polar/svd"), (weight_mod, "apply_spec", "apply_spec"),
               (solve_mod, "objective", "objective")]
    patches += [(m, "correlation", "correlation GEMMs") for m in MATCHERS.values()]  # each kind's statistic
    saved = []
    for mod, attr, label in patches:
        fn = getattr(mod, attr)
        saved.append((mod, attr, fn))

        def wrapper(*a, _fn=fn, _label=label, **kw):
            if _label == "correlation GEMMs":
                flops[_label] += correlation_flops(a[0], a[1])
            t0 = time.perf_counter()
            out = _fn(*a, **kw)
            sync(device)
            acc[_label] += time.perf_counter() - t0
            counts[_label] += 1
            return out

        setattr(mod, attr, wrapper)
    try:
        yield acc, counts, flops
    finally:
        for mod, attr, fn in saved:
            setattr(mod, attr, fn)


def run(spec, pa, pb, args, device, enabled: bool):
    with use_extension(enabled), timed_calls(device) as (acc, counts, flops):
        sync(device)
        t0 = time.perf_counter()
        elements, info = weight_mod.weight_matching(spec, pa, pb, max_iter=args.max_iter, tol=args.tol,
                                                   polish_iter=args.polish_iter)
        sync(device)
        total = time.perf_counter() - t0
    breakdown = {k: round(v, 4) for k, v in sorted(acc.items(), key=lambda kv: -kv[1])}
    breakdown["other"] = round(total - sum(acc.values()), 4)
    gemm = {"correlation_gflop": flops["correlation GEMMs"] / 1e9,
            "correlation_gflops_per_s": flops["correlation GEMMs"] / 1e9 / max(acc["correlation GEMMs"], 1e-12)}
    return total, info, breakdown, dict(counts), elements, gemm


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-iter", type=int, default=3)
    ap.add_argument("--tol", type=float, default=1e-6)
    ap.add_argument("--polish-iter", type=int, default=10, help="frozen-permutation polish sweeps (at most)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per path (alternating)")
    ap.add_argument("--quick", action="store_true", help="4 layers instead of 12")
    ap.add_argument("--out", default=None, help="directory for the JSON (default bench/results/)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    torch.manual_seed(0)
    n_layer = 4 if args.quick else 12
    cfg = lf.models.GPT2Config(n_layer=n_layer, n_embd=768, n_head=12, d_mlp=3072, vocab_size=1024, block_size=128)
    a, b = lf.models.GPT2(cfg).eval(), lf.models.GPT2(cfg).eval()
    t0 = time.perf_counter()
    spec, pa, pb = params_pair(a, b, "canonical")
    canon_s = time.perf_counter() - t0
    if device.type == "cuda":
        pa = {k: v.to(device) for k, v in pa.items()}
        pb = {k: v.to(device) for k, v in pb.items()}
    n_params = sum(v.numel() for v in pa.values())
    print(f"GPT-2 {n_layer}x768, {n_params / 1e6:.1f}M parameters (float64 canonical); "
          f"canonicalisation {canon_s:.1f} s; extension: {kernels.build_info().get('available')}", flush=True)
    if not kernels.has_ext():
        print("lmc_fast._C is not built: nothing to compare", file=sys.stderr)
        return 1
    runs = {True: [], False: []}
    for _ in range(args.repeat):
        for enabled in (True, False):
            runs[enabled].append(run(spec, pa, pb, args, device, enabled))
            tot, info, br, cnt, _, _ = runs[enabled][-1]
            print(f"{'C++ ext ' if enabled else 'torch/scipy'}: {tot:.2f} s, iterations {info['iterations']} "
                  f"(+{info['polish_iterations']} polish), breakdown {br}", flush=True)
    peak64 = matmul_peak(device, torch.float64, 2048)
    ours = statistics.median(r[0] for r in runs[True])
    base = statistics.median(r[0] for r in runs[False])
    o, bse = runs[True][0], runs[False][0]
    same = all(torch.equal(o[4][n]["perm"], bse[4][n]["perm"]) for n in o[4] if "perm" in o[4][n])
    rec = record(
        "weight_matching_gpt2", device=device, dtype=torch.float64,
        sizes={"n_layer": n_layer, "n_embd": 768, "n_head": 12, "d_mlp": 3072, "vocab": 1024, "block": 128,
               "params_millions": round(n_params / 1e6, 2), "max_iter": args.max_iter, "tol": args.tol,
               "polish_iter": args.polish_iter},
        baseline="same weight_matching with torch.linalg.svd + scipy linear_sum_assignment (use_extension(False))",
        baseline_s=base, ours_s=ours,
        extra={"iterations": o[1]["iterations"], "polish_iterations": o[1]["polish_iterations"],
               "baseline_iterations": bse[1]["iterations"], "baseline_polish_iterations": bse[1]["polish_iterations"],
               "objective_final": o[1]["objective"][-1], "baseline_objective_final": bse[1]["objective"][-1],
               "same_permutations": same, "breakdown_s": o[2], "baseline_breakdown_s": bse[2],
               "calls": o[3], "canonicalise_s": canon_s, **o[5], "fp64_matmul_peak_gflops": peak64,
               "correlation_fraction_of_peak": o[5]["correlation_gflops_per_s"] / peak64, "times_s": [r[0] for r in runs[True]],
               "baseline_times_s": [r[0] for r in runs[False]]})
    path = write_results("weight_matching", [rec], device, out=args.out)
    print(f"correlation GEMMs: {o[5]['correlation_gflop']:.0f} GFLOP at {o[5]['correlation_gflops_per_s']:.1f} GFLOP/s "
          f"= {o[5]['correlation_gflops_per_s'] / peak64:.0%} of the measured float64 matmul peak ({peak64:.1f} GFLOP/s)")
    print(f"wrote {path}")
    print_table([rec])
    return 0


if __name__ == "__main__":
    sys.exit(main())
