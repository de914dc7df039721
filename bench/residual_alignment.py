"""Cheaper residual alignment on the Table 1 pairs at hand: weight matching against the residual
stream's rotation from activations (activation matching with residual_only=True: one Procrustes of
A's and B's normalised residual states, every other group by weight matching given it), from 1 and
from 8 training batches of 128 blocks, same models, same evaluation data as the Table 1 grid (the
first 512 test blocks in batches of 128, 11 lambdas; masked-token models read their fixed masking).

    python bench/residual_alignment.py --setting llama-shakespeare=G1/models --setting neox-shakespeare=G2/models
Writes bench/results/residual_alignment.json and prints per pair and median [min, max] per setting.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from adaptive_lambdas import PAIRS, test_batches  # noqa: E402
from common import cpu_model, setting_arguments, setting_pairs  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.data import loader  # noqa: E402
from lmc_fast.data.masked import for_task  # noqa: E402
from lmc_fast.models.adapters import adapter_for  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402
from lmc_fast.sweep.metrics import task_of  # noqa: E402

VARIANTS = {"weight": ("weight", {}), "residual-act-1": ("activation", {"residual_only": True, "max_batches": 1}),
            "residual-act-8": ("activation", {"residual_only": True, "max_batches": 8})}


def train_batches(name: str, model, n: int = 8) -> list:
    train, _ = recipe(name).datasets()
    train = for_task(train, task_of(adapter_for(model).arch(model)))
    out = []
    for x, y in loader(train, 128, shuffle=True, seed=0):
        if len(out) == n:
            break
        out.append((x, y))
    return out


def main():
    args = setting_arguments(__doc__.splitlines()[0], "residual_alignment.json")
    records, summary = [], {}
    for setting in args.setting:
        rows = []
        for name, seeds, a, b in setting_pairs(setting, PAIRS):
            test, train = test_batches(name, a), train_batches(name, a)
            rec = {"setting": name, "seeds": list(seeds)}
            for variant, (method, opts) in VARIANTS.items():
                t0 = time.perf_counter()
                al = lf.align(a, b, method, data=train if method == "activation" else None, **opts)
                seconds = time.perf_counter() - t0
                rec[variant] = {"barrier": lf.barrier(a, al.apply(b), test, lambdas=11).barrier, "seconds": seconds}
            rows.append(rec)
            print(name, seeds, " ".join(f"{v}={rec[v]['barrier']:.4f} ({rec[v]['seconds']:.1f} s)" for v in VARIANTS),
                  flush=True)
        summary[name] = {v: {"median": statistics.median(r[v]["barrier"] for r in rows),
                             "min": min(r[v]["barrier"] for r in rows), "max": max(r[v]["barrier"] for r in rows),
                             "seconds_median": statistics.median(r[v]["seconds"] for r in rows)} for v in VARIANTS}
        records += rows
    result = {"kind": "residual_alignment", "machine": cpu_model(), "torch": torch.__version__, "torch_threads": 1,
              "load_average": os.getloadavg(), "variants": {k: [m, o] for k, (m, o) in VARIANTS.items()},
              "test_blocks": 512, "lambdas": 11, "summary": summary, "records": records}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, s in summary.items():
        print(name, " ".join(f"{v} {x['median']:.4f} [{x['min']:.4f}, {x['max']:.4f}] {x['seconds_median']:.1f} s"
                             for v, x in s.items()))
    print(f"-> {out}")


if __name__ == "__main__":
    main()
