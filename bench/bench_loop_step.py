"""Learned matching's cost per run: the labels preset at N two-lambda steps against labels-loop (the authors'
loop) at 2N one-lambda steps, on one trained pair, in one process, interleaved.

The library's default changed from the first to the second at equal steps' cost (a loop step evaluates one
mixture, not two); this measures that claim. Each run is a whole `lf.align(a, b, "learned", ...)`: the
weight-matching start, the steps, one validation barrier at the end (eval_every = the steps), as a grid unit
pays. One torch thread; say the machine's load when quoting.

    python bench/bench_loop_step.py --models /tmp/lmc_grids/gpt2_models/models --data shakespeare --steps 60
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import record, write_results  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.data import loader  # noqa: E402
from lmc_fast.data_specs import load_data  # noqa: E402
from lmc_fast.io import load_model  # noqa: E402


def run_seconds(a, b, data, preset: str, steps: int) -> float:
    t0 = time.perf_counter()
    lf.align(a, b, "learned", data=data, preset=preset, steps=steps, eval_every=steps)
    return time.perf_counter() - t0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True, help="a folder holding seed0 and seed1 (a grid's models/)")
    ap.add_argument("--data", required=True, help="the data spec the models were trained on (e.g. shakespeare)")
    ap.add_argument("--steps", type=int, default=60, help="labels' steps; labels-loop runs twice as many")
    ap.add_argument("--batch-size", type=int, default=128)
    ap.add_argument("--batches", type=int, default=20, help="matching batches (the grid's match_max_batches)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--name", default=None, help="the results file's name (default: loop_step_<models' type>)")
    args = ap.parse_args(argv)
    for seed in ("seed0", "seed1"):
        if not (Path(args.models) / seed).is_dir():
            raise SystemExit(f"{args.models}: no {seed} folder (a grid's models/ holds seed0, seed1, ...)")
    torch.set_num_threads(1)
    a, b = (load_model(Path(args.models) / s).float().eval() for s in ("seed0", "seed1"))
    train, _ = load_data(args.data)
    data = []
    for x, y in loader(train, args.batch_size, shuffle=True, seed=0):
        data.append((x, y))
        if len(data) == args.batches:
            break
    labels, loop = [], []
    for _ in range(args.repeat):  # interleaved, so drift hits both alike
        labels.append(run_seconds(a, b, data, "labels", args.steps))
        loop.append(run_seconds(a, b, data, "labels-loop", 2 * args.steps))
    med_labels, med_loop = statistics.median(labels), statistics.median(loop)
    kind = type(a).__name__
    rec = record("learned_run_seconds", device=torch.device("cpu"), dtype="float32",
                 sizes={"models": str(args.models), "model": kind, "data": args.data, "batch_size": args.batch_size,
                        "batches": args.batches, "labels_steps": args.steps, "loop_steps": 2 * args.steps},
                 baseline=f'preset="labels", {args.steps} steps of two lambdas',
                 baseline_s=med_labels, ours_s=med_loop,
                 extra={"ours": f'preset="labels-loop", {2 * args.steps} steps of one lambda',
                        "labels_seconds": labels, "loop_seconds": loop, "load_average": os.getloadavg()})
    path = write_results(args.name or f"loop_step_{kind.lower()}", [rec], torch.device("cpu"))
    print(f"{kind}: labels {args.steps} steps {med_labels:.1f} s, labels-loop {2 * args.steps} steps {med_loop:.1f} s "
          f"(loop / labels {med_loop / med_labels:.2f}x) -> {path}")


if __name__ == "__main__":
    main()
