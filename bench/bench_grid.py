"""`lmc-fast grid` with 1 and 2 torchrun ranks: wall time, ratio, and the records compared.

    python bench/bench_grid.py            # CPU: 1 vs 2 ranks, one thread each -> bench/results/grid_cpu.json
    python bench/bench_grid.py --gpu      # also 1 vs every GPU (one per rank) -> bench/results/grid_gpu.json

The grid: 4 ViT-digits models (the recipe's architecture, 60 training steps each: enough for
non-trivial barriers, cheap to make), all 6 pairs x none / permutation / weight / activation =
24 units, 25 lambdas on the full test split. Each run is a fresh process tree started through
`python -m torch.distributed.run` (the 1-rank run too), with --no-resume, so both pay the same
start-up; the ratio is 1-rank seconds / N-rank seconds (goal >= 1.7 for 2 ranks on 2 free cores).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, device_name, write_results  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
METHODS = ["none", "permutation", "weight", "activation"]


def make_models(folder: Path, n: int = 4, steps: int = 60) -> list[str]:
    from lmc_fast.io import save_model
    from lmc_fast.recipes import recipe
    from lmc_fast.train import train

    r = recipe("vit-digits")
    train_ds, _ = r.datasets()
    paths = []
    for seed in range(n):
        m = r.model(seed=seed)
        train(m, train_ds, steps=steps, batch_size=r.batch_size, lr=3e-3, seed=seed, progress=False)
        paths.append(str(save_model(m, folder / f"seed{seed}")))
    return paths


def write_spec(path: Path, models: list[str], device: str) -> Path:
    path.write_text(f"""[data]
spec = "digits"
[models]
paths = {json.dumps(models)}
[grid]
pairs = "all"
methods = {json.dumps(METHODS)}
lambdas = 25
device = "{device}"
""")
    return path


def run_grid(spec: Path, out: Path, ranks: int) -> float:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks),
           "-m", "lmc_fast.cli", "grid", str(spec), "--out", str(out), "--no-resume", "--quiet", "--threads", "1"]
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]


def max_rel_diff(a: list[dict], b: list[dict]) -> float:
    worst = 0.0
    for x, y in zip(a, b):
        for u, v in zip(x["curve"]["loss"] + [x["barrier"]], y["curve"]["loss"] + [y["barrier"]]):
            worst = max(worst, abs(u - v) / max(abs(u), abs(v), 1e-12))
    return worst


def compare(tmp: Path, spec: Path, many: int, tag: str) -> dict:
    load_before = os.getloadavg()
    one = run_grid(spec, tmp / f"{tag}1", 1)
    several = run_grid(spec, tmp / f"{tag}{many}", many)
    r1, rn = records(tmp / f"{tag}1"), records(tmp / f"{tag}{many}")
    return {"units": len(r1), "ranks": many, "seconds_1_rank": one, f"seconds_{many}_ranks": several,
            "ratio": one / several, "max_rel_diff": max_rel_diff(r1, rn),
            "unit_seconds_sum": sum(sum(r["seconds"].values()) for r in r1),
            "load_average_before": [round(x, 2) for x in load_before],
            "load_average_after": [round(x, 2) for x in os.getloadavg()]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpu", action="store_true", help="also compare 1 GPU rank with one rank per GPU")
    args = p.parse_args()
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="bench_grid_") as tmp:
        tmp = Path(tmp)
        models = make_models(tmp / "models")
        base = {"machine": cpu_model(), "torch": torch.__version__, "cores": os.cpu_count(), "threads_per_rank": 1,
                "grid": {"models": len(models), "pairs": 6, "methods": METHODS, "lambdas": 25, "data": "digits test"},
                "date": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        cpu = {**base, **compare(tmp, write_spec(tmp / "cpu.toml", models, "cpu"), 2, "cpu")}
        print(json.dumps(cpu, indent=2))
        print("->", write_results("grid", [cpu], "cpu"))
        if args.gpu and torch.cuda.is_available() and torch.cuda.device_count() >= 1:
            n = max(2, torch.cuda.device_count())  # one GPU: two ranks share it
            gpu = {**base, "gpu": device_name("cuda"), "gpus": torch.cuda.device_count(),
                   **compare(tmp, write_spec(tmp / "gpu.toml", models, "cuda"), n, "gpu")}
            print(json.dumps(gpu, indent=2))
            print("->", write_results("grid", [gpu], "cuda"))


if __name__ == "__main__":
    main()
