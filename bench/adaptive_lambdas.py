"""Adaptive lambdas against the 25-point grid on the Table 1 pairs whose models are at hand.

For each setting (a grid's trained models: OUT/models/seedN) and each of its 5 disjoint pairs, the
barrier of the raw path ("none") and of the weight-matched path on the 25-point grid and with
lambdas="adaptive" (Adaptive(): 5 coarse points, tol 1e-3), over the Table 1 evaluation data (the first
512 test blocks in batches of 128; masked-token models read their fixed masking). Reports per pair the
evaluations each used, the barriers and their difference, and the sweep seconds.

    python bench/adaptive_lambdas.py --setting llama-shakespeare=G1/models --setting neox-shakespeare=G2/models
Writes bench/results/adaptive_lambdas.json and prints a table and the medians.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.data import loader  # noqa: E402
from lmc_fast.data.masked import for_task  # noqa: E402
from lmc_fast.io import load_model  # noqa: E402
from lmc_fast.models.adapters import adapter_for  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402
from lmc_fast.sweep.metrics import task_of  # noqa: E402

PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))


def test_batches(name: str, model) -> list:
    _, test = recipe(name).datasets()
    test = for_task(test, task_of(adapter_for(model).arch(model)))
    return list(loader(test.subset(range(512)), 128))


def timed_barrier(a, b, data, lambdas, space):
    t0 = time.perf_counter()
    res = lf.barrier(a, b, data, lambdas=lambdas, space=space)
    return res, time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--setting", action="append", required=True, metavar="RECIPE=MODELS",
                   help="a recipe name and the folder of its seedN models (repeatable)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "adaptive_lambdas.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    records = []
    for setting in args.setting:
        name, _, folder = setting.partition("=")
        for seeds in PAIRS:
            a, b = (load_model(Path(folder) / f"seed{s}") for s in seeds)
            data = test_batches(name, a)
            for method in ("none", "weight"):
                b2, space = (b, "raw") if method == "none" else (lf.align(a, b, "weight").apply(b), "canonical")
                grid, t_grid = timed_barrier(a, b2, data, 25, space)
                adapt, t_adapt = timed_barrier(a, b2, data, "adaptive", space)
                rec = {"setting": name, "seeds": list(seeds), "method": method, "grid_barrier": grid.barrier,
                       "adaptive_barrier": adapt.barrier, "difference": adapt.barrier - grid.barrier,
                       "evaluations": adapt.adaptive["evaluations"], "peak_resolved": adapt.adaptive["peak_resolved"],
                       "grid_seconds": t_grid, "adaptive_seconds": t_adapt}
                records.append(rec)
                print(f"{name:18s} {seeds} {method:6s} grid {grid.barrier:.4f} adaptive {adapt.barrier:.4f} "
                      f"({rec['difference']:+.4f}) {rec['evaluations']} points, {t_grid:.1f} s vs {t_adapt:.1f} s",
                      flush=True)
    diffs = [r["difference"] for r in records]
    evals = [r["evaluations"] for r in records]
    summary = {"pairs": len(records), "evaluations_median": statistics.median(evals), "evaluations_max": max(evals),
               "difference_median": statistics.median(diffs), "difference_min": min(diffs),
               "difference_max": max(diffs), "abs_difference_max": max(abs(d) for d in diffs),
               "seconds_ratio_median": statistics.median(r["grid_seconds"] / r["adaptive_seconds"] for r in records),
               "peak_resolved": sum(r["peak_resolved"] for r in records)}
    result = {"kind": "adaptive_lambdas", "machine": cpu_model(), "torch": torch.__version__, "torch_threads": 1,
              "load_average": os.getloadavg(), "grid_points": 25, "adaptive": {"start": 5, "tol": 1e-3},
              "test_blocks": 512, "summary": summary, "records": records}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=1))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
