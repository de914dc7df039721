"""Shared benchmark helpers: machine description, median timing, JSON results."""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def proc_status(key: str) -> int:
    """A memory line of /proc/self/status ("VmRSS:", "VmHWM:"), in bytes; 0 where there is none."""
    path = Path("/proc/self/status")
    for line in (path.read_text().splitlines() if path.exists() else ()):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        m = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
        if m:
            return f"{m.group(1).strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return f"{platform.processor() or platform.machine()} ({os.cpu_count()} cores)"


def device_name(device: str | torch.device = "cpu") -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return cpu_model()


def triton_version() -> str | None:
    try:
        import triton

        return triton.__version__
    except Exception:  # noqa: BLE001 - triton is optional
        return None


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def median_time(fn, *, repeat: int = 5, warmup: int = 1, device="cpu", min_time: float = 0.0):
    """Median wall time of fn() over `repeat` runs after `warmup` runs (seconds)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    t_start = time.perf_counter()
    while len(times) < repeat or (time.perf_counter() - t_start) < min_time:
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t0)
        if len(times) >= 50:
            break
    return statistics.median(times), times


def matmul_peak(device, dtype, n: int, repeat: int = 5) -> float:
    """Measured GFLOP/s of one n x n x n matmul (median of `repeat`): the peak we quote."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    sync(device)
    ts = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        a @ b
        sync(device)
        ts.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(ts) / 1e9


def record(name: str, *, device, dtype, sizes, baseline: str, baseline_s: float, ours_s: float,
           gflops: float | None = None, extra: dict | None = None) -> dict:
    rec = {
        "name": name,
        "device": device_name(device),
        "torch": torch.__version__,
        "triton": triton_version(),
        "dtype": str(dtype).replace("torch.", ""),
        "sizes": sizes,
        "baseline": baseline,
        "baseline_s": baseline_s,
        "ours_s": ours_s,
        "speedup": baseline_s / ours_s if ours_s > 0 else None,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "threads": torch.get_num_threads(),
        "loadavg_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    if gflops is not None:
        rec["ours_gflops"] = gflops / ours_s if ours_s > 0 else None
        rec["baseline_gflops"] = gflops / baseline_s if baseline_s > 0 else None
        rec["gflop"] = gflops
    if extra:
        rec.update(extra)
    return rec


def write_results(stem: str, records: list[dict], device="cpu", out=None) -> Path:
    """Write `<stem>_<cpu|gpu>.json` under `out` (default bench/results/)."""
    folder = Path(out) if out else RESULTS
    folder.mkdir(parents=True, exist_ok=True)
    tag = "gpu" if torch.device(device).type == "cuda" else "cpu"
    path = folder / f"{stem}_{tag}.json"
    path.write_text(json.dumps(records, indent=2) + "\n")
    return path


def write_study(out, record: dict, table: str) -> Path:
    """A study's record as OUT.json and its table as OUT.md (the table printed too); returns OUT."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    out.with_suffix(".md").write_text(table)
    print(table)
    return out


def print_table(records: list[dict]) -> None:
    print(f"{'name':<34} {'dtype':<8} {'sizes':<24} {'baseline_s':>11} {'ours_s':>10} {'speedup':>8}")
    for r in records:
        print(f"{r['name']:<34} {r['dtype']:<8} {json.dumps(r['sizes']):<24} "
              f"{r['baseline_s']:>11.5f} {r['ours_s']:>10.5f} {r['speedup']:>7.2f}x")


#: Table 1's disjoint pairs of seeds
TABLE1_PAIRS = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9))


def setting_arguments(description: str, default_out: str):
    """The pair benches' command line: --setting RECIPE=MODELS (repeatable) and --out; one torch thread."""
    import argparse

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--setting", action="append", required=True, metavar="RECIPE=MODELS",
                   help="a recipe name and the folder of its seedN models (repeatable)")
    p.add_argument("--out", default=str(RESULTS / default_out))
    args = p.parse_args()
    torch.set_num_threads(1)
    return args


def setting_pairs(setting: str, pairs=TABLE1_PAIRS):
    """RECIPE=MODELS -> (recipe name, seeds, model a, model b) for each pair of the folder's seedN models."""
    from lmc_fast.io import load_model

    name, _, folder = setting.partition("=")
    for seeds in pairs:
        a, b = (load_model(Path(folder) / f"seed{s}") for s in seeds)
        yield name, seeds, a, b
