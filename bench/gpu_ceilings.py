"""The two ceilings every GPU number is quoted against, measured on the card in hand:
device-to-device copy bandwidth (bytes read + written) and dense matrix-product rates
(bf16, fp16, TF32, IEEE fp32, fp64) on random data, timed with CUDA events (median of 10
after 3 warm-ups). Datasheet rates are leads only: bench/results/ceilings_gpu.json is what
the fractions of peak in the other *_gpu.json files are fractions of.

Usage: python bench/gpu_ceilings.py [--out DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import device_name, write_results  # noqa: E402


def event_median(fn, repeat: int = 10, warmup: int = 3) -> float:
    """Median seconds of fn() between CUDA events."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def copy_bandwidth(gib: float = 4.0) -> dict:
    n = int(gib * 2**30) // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    t = event_median(lambda: dst.copy_(src))
    moved = 2 * src.numel() * src.element_size()
    return {"bytes_moved": moved, "seconds": t, "gb_per_s": moved / t / 1e9}


def matmul_rate(dtype, n: int, tf32: bool = False) -> dict:
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    try:
        a = torch.randn(n, n, device="cuda").to(dtype)
        b = torch.randn(n, n, device="cuda").to(dtype)
        t = event_median(lambda: a @ b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    return {"n": n, "seconds": t, "tflops": 2 * n**3 / t / 1e12}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_ceilings: no CUDA device; nothing measured")
        return 0
    rec = {"name": "gpu_ceilings", "device": device_name("cuda"), "torch": torch.__version__,
           "cuda": torch.version.cuda, "copy": copy_bandwidth()}
    rates = {}
    for label, dtype, tf32, n in (("bfloat16", torch.bfloat16, False, 8192), ("float16", torch.float16, False, 8192),
                                  ("tf32", torch.float32, True, 8192), ("float32", torch.float32, False, 8192),
                                  ("float64", torch.float64, False, 4096)):
        rates[label] = matmul_rate(dtype, n, tf32)
    rec["matmul"] = rates
    path = write_results("ceilings", [rec], "cuda", out=args.out)
    print(f"copy {rec['copy']['gb_per_s']:.0f} GB/s; matmul TFLOP/s: "
          + ", ".join(f"{k} {v['tflops']:.1f}" for k, v in rates.items()) + f" -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
