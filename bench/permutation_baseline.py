"""Is our permutation baseline as strong as Git Re-Basin's own loop? Both on the same pairs, by the algorithm's own criterion.

The permutation baseline (method "permutation": residual, MLP and whole-head permutations on raw
parameters) runs our structured schedule (the residual from the anchor parameters, then sweeps of
layer groups and residual). Git Re-Basin's published loop (samuela/git-re-basin, src/weight_matching.py)
starts every permutation at the identity, visits the groups in a random order each pass, solves each
exactly given the others, and stops when a whole pass improves nothing: here `order="random",
init="identity", tol=0`, with several seeds (its order is random). Per pair: the objective each reaches
(sum over groups of <A, P . B>, as a fraction of the best found) and the loss barrier of its solution.

    python bench/permutation_baseline.py --setting vit-digits=/tmp/lmc_grids/ls_digits/models [--setting ...]
Writes bench/results/permutation_baseline.json; prints per pair and median [min, max] per setting.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import TABLE1_PAIRS, cpu_model, setting_arguments, setting_pairs  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.data import loader  # noqa: E402
from lmc_fast.data.masked import for_task  # noqa: E402
from lmc_fast.match.pair import params_pair, solved_alignment  # noqa: E402
from lmc_fast.match.weight import weight_matching  # noqa: E402
from lmc_fast.models.adapters import adapter_for  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402
from lmc_fast.sweep.metrics import task_of  # noqa: E402

SEEDS = (0, 1, 2, 3, 4)


def test_batches(name: str, model) -> list:
    """Table 1's evaluation data: the test split's first 512 examples (all of digits' 450), batches of 128."""
    _, test = recipe(name).datasets()
    test = for_task(test, task_of(adapter_for(model).arch(model)))
    return list(loader(test.subset(range(min(512, len(test)))), 128))


def run(spec, pa, pb, a, b, data, **options) -> dict:
    elements, info = weight_matching(spec, pa, pb, max_iter=100, **options)
    info["method"], info["heads"] = "permutation", True
    al = solved_alignment(spec, elements, info, torch.float64)
    return {"objective": info["objective"][-1], "iterations": info["iterations"], "seconds": info["seconds"],
            "barrier": lf.barrier(a, al.apply(b), data, lambdas=11).barrier}


def _stats(values) -> dict:
    values = list(values)
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    args = setting_arguments(__doc__.splitlines()[0], "permutation_baseline.json")
    records, summary = [], {}
    for setting in args.setting:
        rows = []
        for name, seeds, a, b in setting_pairs(setting, TABLE1_PAIRS):
            data = test_batches(name, a)
            spec, pa, pb = params_pair(a, b, "raw", heads=True, dtype=torch.float64)
            ours = run(spec, pa, pb, a, b, data, order="structured")
            grb = [run(spec, pa, pb, a, b, data, order="random", init="identity", tol=0.0, seed=s) for s in SEEDS]
            best = max([ours["objective"]] + [g["objective"] for g in grb])
            rec = {"setting": name, "seeds": list(seeds), "ours": ours, "git_re_basin": grb,
                   "ours_objective_share": ours["objective"] / best,
                   "grb_objective_share": [g["objective"] / best for g in grb]}
            rows.append(rec)
            print(name, seeds, f"ours obj {rec['ours_objective_share']:.5f} barrier {ours['barrier']:.3f} | GRB obj "
                  + " ".join(f"{s:.5f}" for s in rec["grb_objective_share"]) + " barrier "
                  + " ".join(f"{g['barrier']:.3f}" for g in grb), flush=True)
        summary[name] = {
            "ours_barrier": _stats(r["ours"]["barrier"] for r in rows),
            "grb_barrier": _stats(g["barrier"] for r in rows for g in r["git_re_basin"]),
            "grb_barrier_per_pair_median": _stats(statistics.median(g["barrier"] for g in r["git_re_basin"])
                                                  for r in rows),
            "ours_objective_share": _stats(r["ours_objective_share"] for r in rows),
            "grb_objective_share": _stats(s for r in rows for s in r["grb_objective_share"]),
            "pairs_ours_objective_above_every_grb_seed": sum(
                r["ours"]["objective"] >= max(g["objective"] for g in r["git_re_basin"]) for r in rows),
            "pairs_ours_objective_above_grb_median": sum(
                r["ours"]["objective"] >= statistics.median(g["objective"] for g in r["git_re_basin"]) for r in rows),
            "pairs": len(rows),
        }
        records += rows
    result = {"kind": "permutation_baseline", "machine": cpu_model(),
              "cpu_capability": torch.backends.cpu.get_cpu_capability(), "torch_threads": 1,
              "load_average": os.getloadavg(), "git_re_basin_seeds": list(SEEDS), "lambdas": 11,
              "summary": summary, "records": records}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, s in summary.items():
        print(name, json.dumps(s))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
