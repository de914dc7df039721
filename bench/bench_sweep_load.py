"""The fused sweep against the per-lambda loop on a busy machine: pass sizes x thread settings.

    python bench/bench_sweep_load.py [--note loaded]  # ViT (paper) and GPT-2, K = 25, 2k / 8k tokens and the default

Each (model, threads, OMP_WAIT_POLICY) condition runs in its own process (OpenMP reads its settings
once), the loop and the fused engine at each token budget interleaved in it, medians of --repeat. The
machine's load average is recorded with every row: run it on a loaded machine and on a quiet one.
Writes bench/results/sweep_load_cpu.json (rows appended to what is there, one run per date).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, cpu_model  # noqa: E402

#: One mixture of the whole batch is the per-lambda loop's own pass shape: 8192 for the ViT (64 x 65 tokens: 4096
#: splits it into 63 + 1 images), 4096 for GPT-2 (32 x 128; 8192 puts two mixtures in a pass). Earlier runs
#: (rows with 4096 and 32768) showed 32k losing in most conditions; "fused_default" is what a user gets.
BUDGETS = (2048, 8192)


def one(model: str, n: int, repeat: int) -> dict:
    import torch

    import lmc_fast as lf
    from lmc_fast.sweep.evaluate import EvalOptions, evaluate_mixtures
    from lmc_fast.sweep.interpolate import models_params

    torch.manual_seed(0)
    if model == "vit":
        cfg = lf.models.ViTConfig.paper()
        a, b = lf.models.ViT(cfg), lf.models.ViT(cfg)
        x, y = torch.randn(n, 3, 32, 32), torch.randint(0, 10, (n,))
    else:
        cfg = lf.models.GPT2Config(n_layer=6, n_embd=256, n_head=8, block_size=128, vocab_size=256)
        a, b = lf.models.GPT2(cfg), lf.models.GPT2(cfg)
        x = torch.randint(0, 256, (n, 128))
        y = x
    arch, params = models_params([a, b], "raw")
    W = [[1 - k / 24, k / 24] for k in range(25)]
    run = {"loop": lambda: evaluate_mixtures(arch, params, W, [(x, y)], EvalOptions(engine="per_point"), template=a)}
    for t in BUDGETS:
        run[f"fused_{t}"] = lambda t=t: evaluate_mixtures(arch, params, W, [(x, y)],
                                                          EvalOptions(engine="batched", max_tokens=t))
    run["fused_default"] = lambda: evaluate_mixtures(arch, params, W, [(x, y)], EvalOptions(engine="batched"))
    for f in run.values():
        f()
    times = {k: [] for k in run}
    for _ in range(repeat):
        for k, f in run.items():
            t0 = time.perf_counter()
            f()
            times[k].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    from lmc_fast.sweep.batched import token_budget

    return {"model": model, "n": n, "threads": torch.get_num_threads(),
            "default_max_tokens": token_budget(None, "cpu", "tokens" if model == "gpt2" else "patches"),
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"), "loadavg_1min": os.getloadavg()[0],
            "median_s": med, "fused_over_loop": {k: med["loop"] / v for k, v in med.items() if k != "loop"}}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--note", default="", help="what the run's conditions were (e.g. 'loaded: one spinning process')")
    ap.add_argument("--one", nargs=2, metavar=("MODEL", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one[0], int(args.one[1]), args.repeat)))
        return
    rows = []
    for model, n in (("vit", 64), ("gpt2", 32)):
        for threads, policy in ((1, None), (2, None), (2, "passive")):
            env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
            env.pop("OMP_WAIT_POLICY", None)
            if policy:
                env["OMP_WAIT_POLICY"] = policy
            out = subprocess.run([sys.executable, __file__, "--one", model, str(n), "--repeat", str(args.repeat)],
                                 env=env, capture_output=True, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(model, threads, policy, f"load {row['loadavg_1min']:.1f}",
                  {k: round(v, 2) for k, v in row["fused_over_loop"].items()}, flush=True)
    import torch

    path = RESULTS / "sweep_load_cpu.json"
    old = json.loads(path.read_text()) if path.exists() else []
    old.append({"machine": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "K": 25, "repeat": args.repeat, "note": args.note, "rows": rows})
    path.write_text(json.dumps(old, indent=2) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
