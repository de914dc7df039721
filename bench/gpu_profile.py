"""What the CUDA defaults are set from, and where GPU time goes, in one short run.

1. Tokens per fused pass: the fused sweep (paper ViT, K = 25, random images) in TF32 and bf16,
   torch GEMMs and the Triton lerp_matmul engine, at several `max_tokens`: the time per sweep for
   each, from which MAX_TOKENS["cuda"] and KERNEL_DEFAULT_ON_CUDA are chosen
   (-> sweep_tokens_gpu.json).
2. torch.profiler tables (top operations by CUDA time, and by CPU time) of one fused bf16 sweep
   and of one learned-matching step (-> profile_gpu.txt): the evidence for any missed target.

Usage: python bench/gpu_profile.py [--images 2048] [--out DIR]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import median_time, record, sync, write_results  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.sweep.evaluate import EvalOptions, evaluate_mixtures  # noqa: E402
from lmc_fast.sweep.interpolate import models_params  # noqa: E402

TOKENS = (32768, 131072, 262144, 1048576)


def timed(fn, device, repeat=3) -> float:
    return median_time(fn, repeat=repeat, warmup=1, device=device)[0]


def vit_case(images: int, device):
    torch.manual_seed(0)
    cfg = lf.models.ViTConfig.paper()
    a, b = lf.models.ViT(cfg).to(device).eval(), lf.models.ViT(cfg).to(device).eval()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(images, cfg.channels, cfg.image_size, cfg.image_size, generator=g)
    y = torch.randint(0, cfg.num_classes, (images,), generator=g)
    data = [(x[i:i + 512], y[i:i + 512]) for i in range(0, images, 512)]
    arch, params = models_params([a, b], "raw")
    W = [[1 - i / 24, i / 24] for i in range(25)]
    return arch, params, W, data


def token_scan(args, device) -> list[dict]:
    arch, params, W, data = vit_case(args.images, device)
    recs = []
    for label, extra in (("tf32", {"tf32": True}), ("bf16", {"dtype": torch.bfloat16})):
        for kernel in (False, True):
            times = {}
            for mt in TOKENS:
                opts = EvalOptions(device=device, max_tokens=mt, kernel=kernel, **extra)
                try:
                    times[mt] = timed(lambda: evaluate_mixtures(arch, params, W, data, opts), device)
                except Exception as e:  # noqa: BLE001 -- a failing setting is a result, not the end of the scan
                    times[mt] = None
                    print(f"  {label} kernel={kernel} max_tokens={mt}: {type(e).__name__}: {str(e)[:200]}")
                print(f"  {label} kernel={kernel} max_tokens={mt}: {times[mt]}")
            ok = {k: v for k, v in times.items() if v is not None}
            if not ok:
                continue
            best = min(ok, key=ok.get)
            recs.append(record(
                f"sweep_tokens_vit_{label}_{'kernel' if kernel else 'torch'}", device=device,
                dtype=torch.bfloat16 if label == "bf16" else torch.float32,
                sizes={"model": "ViT.paper", "images": args.images, "K": 25, "batch": 512},
                baseline=f"max_tokens={TOKENS[0]}", baseline_s=ok.get(TOKENS[0], float("nan")),
                ours_s=ok[best], extra={"seconds_by_max_tokens": {str(k): v for k, v in times.items()},
                                        "best_max_tokens": best, "tf32": label == "tf32", "kernel": kernel}))
            write_results("sweep_tokens", recs, device, out=args.out)
    return recs


def profile_table(fn, device, title: str) -> str:
    from torch.profiler import ProfilerActivity, profile

    fn()
    sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        sync(device)
    avg = prof.key_averages()
    return (f"==== {title}: by CUDA time\n{avg.table(sort_by='cuda_time_total', row_limit=25)}\n"
            f"==== {title}: by CPU time\n{avg.table(sort_by='cpu_time_total', row_limit=25)}\n")


def learned_step(device):
    from bench_learned import make_step, paper_vit_case

    from lmc_fast.match.projection import Latents

    spec, pa, pb, init, x, y = paper_vit_case(device, 128, wm_iter=1)
    return make_step(Latents, spec, pa, pb, init, x, y, 4, device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=2048)
    ap.add_argument("--out", default=None)
    ap.add_argument("--skip-scan", action="store_true")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_profile: no CUDA device; nothing measured")
        return 0
    device = torch.device("cuda")
    out = Path(args.out) if args.out else Path(__file__).resolve().parent / "results"
    out.mkdir(parents=True, exist_ok=True)
    text = []
    arch, params, W, data = vit_case(args.images, device)
    opts = EvalOptions(device=device, dtype=torch.bfloat16, kernel=False)
    text.append(profile_table(lambda: evaluate_mixtures(arch, params, W, data, opts), device,
                              f"fused sweep, paper ViT, K=25, {args.images} images, bf16, torch GEMMs"))
    (out / "profile_gpu.txt").write_text("\n".join(text))
    try:
        text.append(profile_table(learned_step(device), device, "learned matching step, paper ViT, batch 128, 4 lambdas"))
    except Exception as e:  # noqa: BLE001 -- keep the sweep's table
        text.append(f"learned step profile failed: {type(e).__name__}: {e}")
    (out / "profile_gpu.txt").write_text("\n".join(text))
    print(f"wrote {out / 'profile_gpu.txt'}")
    if not args.skip_scan:
        for r in token_scan(args, device):
            print(f"{r['name']}: best max_tokens {r['best_max_tokens']}: {r['ours_s']:.4f} s "
                  f"({r['seconds_by_max_tokens']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
