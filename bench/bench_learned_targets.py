"""Learned matching with the end models' distributions kept per training batch, against recomputing them.

With target="endpoints" every step runs the two end models on its batch to form the target. Those
distributions do not change while the alignment learns, so from the second pass over the training
batches on they can be read back instead (`match/learned_targets.py`). This times both on Table 1
pairs (the grid's own models, matching batches and learned settings), alternated in one process,
and checks that both runs return the same alignment bit for bit.

    python bench/bench_learned_targets.py --grid llama=/tmp/lmc_grids/ls_llama --steps 150

Writes bench/results/learned_targets_cpu.json.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import tomllib
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import record, write_results  # noqa: E402

import lmc_fast as lf  # noqa: E402
import lmc_fast.match.learned_targets as learned_targets  # noqa: E402
from lmc_fast.data_specs import load_data  # noqa: E402
from lmc_fast.grid.runner import _batches  # noqa: E402
from lmc_fast.io import load_model  # noqa: E402

GRIDS = Path(__file__).resolve().parent / "grids"
TABLE1 = {"llama": "table1_llama.toml", "shakespeare": "table1_shakespeare.toml"}


def one_run(a, b, batches, settings: dict, steps: int, keep: bool):
    learned_targets.CACHE_BYTES = (1 << 30) if keep else 0
    t0 = time.perf_counter()
    al = lf.align(a, b, "learned", data=batches, **{**settings, "steps": steps, "eval_every": steps})
    return time.perf_counter() - t0, al


def same(al1, al2) -> bool:
    return all(torch.equal(t, al2.elements[n][k]) for n, e in al1.elements.items() for k, t in e.items())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--grid", nargs="+", required=True, metavar="SETTING=FOLDER",
                    help="a Table 1 setting (llama, shakespeare) and a grid folder holding its models/seedN")
    ap.add_argument("--pair", type=int, nargs=2, default=(0, 1))
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    records = []
    for item in args.grid:
        setting, folder = item.split("=", 1)
        spec = tomllib.loads((GRIDS / TABLE1[setting]).read_text())
        settings = {k: v for k, v in spec["methods"]["learned"].items() if k not in ("method", "steps", "eval_every")}
        a, b = (load_model(Path(folder) / "models" / f"seed{s}", dtype=torch.float32) for s in args.pair)
        train, _ = load_data(spec["data"]["spec"], 64)
        batches = _batches(train, spec["data"].get("match_batch_size", 64), True, spec["data"]["match_max_batches"], "cpu")
        times = {True: [], False: []}
        runs = {}
        for _ in range(args.repeat):
            for keep in (False, True):
                s, runs[keep] = one_run(a, b, batches, settings, args.steps, keep)
                times[keep].append(s)
                print(setting, "kept" if keep else "recomputed", f"{s:.1f} s", flush=True)
        base, ours = statistics.median(times[False]), statistics.median(times[True])
        records.append(record(f"learned_targets_{setting}", device="cpu", dtype=torch.float32,
                              sizes={"pair": list(args.pair), "steps": args.steps, "batches": len(batches),
                                     "batch_shape": list(batches[0][0].shape), **settings},
                              baseline="end-model targets recomputed every step", baseline_s=base, ours_s=ours,
                              extra={"times_s": {"recomputed": times[False], "kept": times[True]},
                                     "targets_reused": runs[True].info["targets_reused"],
                                     "same_alignment": same(runs[True], runs[False]),
                                     "same_val_history": runs[True].info["val_history"] == runs[False].info["val_history"]}))
        print(setting, f"recomputed {base:.1f} s, kept {ours:.1f} s: {base / ours:.2f}x,",
              "same alignment" if records[-1]["same_alignment"] else "ALIGNMENTS DIFFER", flush=True)
    print("->", write_results("learned_targets", records))


if __name__ == "__main__":
    main()
