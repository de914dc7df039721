"""Which of our differences from the authors' learned matching matters: an ablation on 4 Shakespeare GPT-2 pairs.

The authors' code (GPT-2 only) differs from our paper preset in its optimiser (AdamW with weight
decay 0.01, cosine schedule with 5% linear warm-up, gradients clipped to norm 1) and in its start
(weight matching with the token-frequency prior). Both share the 90% training split and the
best-validation return. Every variant: 300 steps, lr 3e-3, one lambda ~ U[0.4, 0.6] per step, the
task loss, the same training batches; then the loss barrier on the first 384 test blocks, 11 lambdas.
Also our default preset at the same 300 steps.

Pairs: seeds (0,1) (2,3) (4,5) (6,7) of the gpt2-shakespeare recipe at 300 steps, trained with the
AVX-512 kernels (cached by bench/real_data_pairs.py, or the models of bench/grids/table1_shakespeare.toml).

    nice -n 10 python bench/learned_ablation.py [--study presets]
Writes bench/results/learned_ablation[_presets].json and prints per pair and median [min, max].
`--study presets` instead varies the default preset one setting at a time (and the paper preset).
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
from lmc_fast.io import load_model  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402

STEPS = 300
COMMON = dict(preset="paper", steps=STEPS, lr=3e-3, lambdas_per_step=1, val_fraction=0.1, eval_every=50)
AUTHORS = dict(weight_decay=0.01, warmup=0.05, clip=1.0)
#: name -> (learned-matching options, whether the start is weight matching with the token prior)
VARIANTS = {
    "paper preset": ({}, False),
    "+ AdamW wd 0.01": (dict(weight_decay=0.01), False),
    "+ 5% warm-up": (dict(warmup=0.05), False),
    "+ clip 1": (dict(clip=1.0), False),
    "authors' optimiser": (AUTHORS, False),
    "+ token-prior start": ({}, True),
    "authors' optimiser + token-prior start": (AUTHORS, True),
}
DEFAULT = "default preset (300 steps)"
#: --study presets: which of the default preset's settings costs it on text (all at 300 steps, weight-matching start)
PRESET_VARIANTS = {
    "default preset": dict(),
    "default, 4 lambdas per step": dict(lambdas_per_step=4),
    "default, lambda ~ U[0.4, 0.6]": dict(lam="narrow"),
    "default, task loss (labels)": dict(target="labels"),
    "default, lr 3e-3": dict(lr=3e-3),
    "default, 10% validation": dict(val_fraction=0.1),
    "paper preset": dict(preset="paper"),
}


def find_pair(seeds, roots) -> list[Path]:
    for root in roots:
        paths = [root / f"gpt2-shakespeare-seed{s}" for s in seeds]
        paths = paths if all(p.exists() for p in paths) else [root / f"seed{s}" for s in seeds]
        if all(p.exists() for p in paths):
            return paths
    raise SystemExit(f"no trained pair {seeds} under {[str(r) for r in roots]}: run bench/real_data_pairs.py "
                     "or the table1_shakespeare grid first")


def pair_record(paths, train_batches, counts, test, study: str) -> dict:
    a, b = (load_model(p) for p in paths)
    starts = {False: lf.align(a, b, "weight"), True: lf.align(a, b, "weight", token_counts=counts)}
    rec = {"pair": [str(p) for p in paths],
           "weight": lf.barrier(a, starts[False].apply(b), test, 11).barrier,
           "weight_token_prior": lf.barrier(a, starts[True].apply(b), test, 11).barrier}
    if study == "presets":
        runs = [(name, dict(steps=STEPS, **opts), False) for name, opts in PRESET_VARIANTS.items()]
    else:
        runs = [(name, {**COMMON, **opts}, prior) for name, (opts, prior) in VARIANTS.items()]
        runs.append((DEFAULT, dict(steps=STEPS), False))
    for name, opts, prior in runs:
        t0 = time.perf_counter()
        al = lf.align(a, b, "learned", data=train_batches, init=starts[prior], **opts)
        seconds = time.perf_counter() - t0
        rec[name] = {"barrier": lf.barrier(a, al.apply(b), test, 11).barrier, "seconds": seconds,
                     "best_step": al.info["best_step"], "steps_per_second": al.info["steps_per_second"]}
        print(f"  {name:42s} {rec[name]['barrier']:.4f} ({seconds:.0f} s, best step {al.info['best_step']})",
              flush=True)
    return rec


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache", nargs="*", default=["/tmp/lmc_fast_pairs/AVX512", "/tmp/lmc_grids/table1_shakespeare/models"])
    p.add_argument("--study", choices=("optimiser", "presets"), default="optimiser",
                   help="optimiser: the authors' optimiser and start against our paper preset; presets: which of "
                        "the default preset's settings matter on text")
    p.add_argument("--out", default=None, help="default bench/results/learned_ablation[_presets].json")
    args = p.parse_args()
    if args.out is None:
        suffix = "" if args.study == "optimiser" else "_presets"
        args.out = str(Path(__file__).parent / "results" / f"learned_ablation{suffix}.json")
    torch.set_num_threads(1)
    train, test_ds = recipe("gpt2-shakespeare").datasets()
    counts = torch.bincount(train.ids.reshape(-1), minlength=train.vocab_size)
    train_batches = [b for b, _ in zip(loader(train, 64, shuffle=True, seed=0), range(60))]
    test = list(loader(test_ds.subset(range(384)), 128))
    records = []
    for i in range(4):
        seeds = (2 * i, 2 * i + 1)
        print(f"pair {seeds}", flush=True)
        records.append(pair_record(find_pair(seeds, [Path(c) for c in args.cache]), train_batches, counts, test,
                                   args.study))
    names = ["weight", "weight_token_prior"] + (list(PRESET_VARIANTS) if args.study == "presets"
                                                else list(VARIANTS) + [DEFAULT])
    summary = {}
    for name in names:
        values = [r[name] if isinstance(r[name], float) else r[name]["barrier"] for r in records]
        summary[name] = {"median": statistics.median(values), "min": min(values), "max": max(values),
                         "values": values}
    result = {"kind": "learned_ablation", "study": args.study, "machine": cpu_model(), "torch": torch.__version__, "torch_threads": 1,
              "load_average": os.getloadavg(), "common": COMMON, "authors_optimiser": AUTHORS,
              "train_batches": len(train_batches), "batch_size": 64, "test_blocks": 384, "lambdas": 11,
              "summary": summary, "records": records}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    for name, s in summary.items():
        print(f"{name:42s} {s['median']:.4f} [{s['min']:.4f}, {s['max']:.4f}]")
    print(f"-> {out}")


if __name__ == "__main__":
    main()
