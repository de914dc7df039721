"""SwiGLU's unit-scale symmetry on the tiny-LLaMA Table 1 pairs: the canonical form with each unit's
up row and down column balanced (the library's) against the form without it, same models, same data.

Weight and activation matching of each pair under both canonical forms, and the barrier of each
(canonical space, 11 lambdas over the first 512 test blocks of 64 bytes in batches of 128, as the
Table 1 grid); the raw "none" barrier as the pair's reference. Activation statistics: the first 60
shuffled training batches of 128 (seed 0). The unbalanced form is the library's with
`symmetry.canonical.balanced_units` replaced by the identity for the run (nothing else differs).

    lmc-fast grid bench/grids/table1_llama.toml --out G    # or any grid that trained its models
    python bench/swiglu_scales.py --models G/models
Writes bench/results/swiglu_scales.json and prints per pair and median [min, max].
"""
from __future__ import annotations

import argparse
import contextlib
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
from lmc_fast.io import load_model  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402
from lmc_fast.symmetry import canonical  # noqa: E402

PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))
VARIANTS = ("unbalanced", "balanced")
METHODS = ("weight", "activation")


@contextlib.contextmanager
def canonical_form(variant: str):
    saved = canonical.balanced_units
    if variant == "unbalanced":
        canonical.balanced_units = lambda p, prefix: {}
    try:
        yield
    finally:
        canonical.balanced_units = saved


def pair_record(models: Path, seeds, test, train) -> dict:
    a, b = (load_model(models / f"seed{s}") for s in seeds)
    rec = {"seeds": list(seeds), "none": lf.barrier(a, b, test, lambdas=11).barrier}
    for variant in VARIANTS:
        with canonical_form(variant):
            for method in METHODS:
                t0 = time.perf_counter()
                al = lf.align(a, b, method, data=train if method == "activation" else None)
                seconds = time.perf_counter() - t0
                res = lf.barrier(a, al.apply(b), test, lambdas=11, space="canonical")
                rec[f"{variant}/{method}"] = {"barrier": res.barrier, "loss_mid": res.loss[5], "seconds": seconds}
    return rec


def stats(values) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", required=True, help="a folder of seedN model folders (a grid's OUT/models)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "swiglu_scales.json"))
    args = p.parse_args()
    torch.set_num_threads(1)
    train_ds, test_ds = recipe("llama-shakespeare").datasets()
    test = list(loader(test_ds.subset(range(512)), 128))
    train = []
    for x, y in loader(train_ds, 128, shuffle=True, seed=0):
        if len(train) == 60:
            break
        train.append((x, y))
    records = []
    for seeds in PAIRS:
        records.append(pair_record(Path(args.models), seeds, test, train))
        r = records[-1]
        print(seeds, f"none={r['none']:.4f}", " ".join(f"{k}={r[k]['barrier']:.4f}" for k in r if "/" in k), flush=True)
    keys = [f"{v}/{m}" for v in VARIANTS for m in METHODS]
    summary = {"none": stats([r["none"] for r in records]), **{k: stats([r[k]["barrier"] for r in records]) for k in keys}}
    summary["balanced_minus_unbalanced"] = {
        m: stats([r[f"balanced/{m}"]["barrier"] - r[f"unbalanced/{m}"]["barrier"] for r in records]) for m in METHODS}
    result = {"kind": "swiglu_scales", "machine": cpu_model(), "torch": torch.__version__, "torch_threads": 1,
              "load_average": os.getloadavg(), "dtype": "float64", "pairs": [list(s) for s in PAIRS],
              "test_blocks": 512, "lambdas": 11, "activation_batches": [60, 128], "summary": summary,
              "records": records}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for k, s in summary.items():
        if "median" in s:
            print(f"{k:22s} {s['median']:.4f} [{s['min']:.4f}, {s['max']:.4f}]")
        else:
            print(k, {m: f"{v['median']:+.4f} [{v['min']:+.4f}, {v['max']:+.4f}]" for m, v in s.items()})
    print(f"-> {out}")


if __name__ == "__main__":
    main()
