"""Instability analysis of the Shakespeare GPT-2 recipe (Frankle et al. 2020, with symmetries).

    nice -n 10 env OMP_NUM_THREADS=1 LMC_FAST_DATA=data_cache .venv/bin/python bench/instability_shakespeare.py \
        --units /tmp/instability_shakespeare

Trains recipe gpt2-shakespeare for a reduced 400 steps, forks 2 copies at steps 0, 50, 100 and 200
(each continues on its own data order), and writes the barrier of each pair, raw and after weight
matching, to bench/results/instability_shakespeare.json and .png. The trained units go to --units
(reused by a re-run, see lmc_fast.instability).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS  # noqa: E402

from lmc_fast.instability import format_table, instability  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--units", default="/tmp/instability_shakespeare", help="folder for the trained units")
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--spawn-steps", type=int, nargs="+", default=[0, 50, 100, 200])
    p.add_argument("--copies", type=int, default=2)
    p.add_argument("--eval-batches", type=int, default=4, help="test batches of 512 blocks per barrier")
    args = p.parse_args()
    torch.set_num_threads(1)
    res = instability("gpt2-shakespeare", args.units, spawn_steps=args.spawn_steps, copies=args.copies,
                      steps=args.steps, lambdas=11, eval_batches=args.eval_batches,
                      json_path=RESULTS / "instability_shakespeare.json",
                      plot_path=RESULTS / "instability_shakespeare.png",
                      log=lambda msg: print(msg, file=sys.stderr, flush=True))
    print(format_table(res))
    print(f"seconds: {res['seconds']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
