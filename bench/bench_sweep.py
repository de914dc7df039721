"""Lambda sweep (K points of the linear path between two models): the per-lambda loop vs the
fused engines, in one process, on the paper ViT and a GPT-2 config.

Variants (all return one metrics dict per lambda; losses are compared to the loop's):
  loop         the per_point engine: per point mix, build a model, evaluate (baseline)
  fused        the batched engine (fp32, what lf.barrier runs): mixtures stacked along
               K, batched GEMMs, passes of at most --max-tokens tokens (default: per device)
  kernel_*     the lerp_kernel engine: the Triton lerp_matmul in every linear
               layer (CUDA only; TF32 and bf16: its IEEE-fp32 mode runs at ~0.02x cuBLAS on an
               H200, bench_lerp_matmul.py, and is not worth a sweep's time here)
  *_tf32       the same with TF32 tensor-core GEMMs (CUDA only; loss error vs the fp32 loop reported)
  *_bf16       the same in bfloat16 (loss error vs the fp32 loop reported)

Repeats are interleaved (round robin over the variants) so that load from other processes
falls on all of them alike; medians are reported. FLOPs: the nominal work of K forward
passes (exact GEMM counts incl. attention's QK^T and AV at full T x T, causal or not),
the same number for every variant, so GFLOP/s compare directly; the CPU peak is a
2048^3 fp32 torch.matmul measured in the same run.

bf16 on a CPU without native bf16 GEMMs (no AVX-512 BF16 / AMX: oneDNN reports it) is a
slow fallback: there the bf16 variants run on a small slice of the data (recorded in
`sizes`) and are compared with fp32 `fused` on that same slice.

Usage: python bench/bench_sweep.py [--device cuda] [--images 256] [--seqs 32] [--repeat 3]
       [--quick] [--out DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import matmul_peak, print_table, record, sync, write_results  # noqa: E402

import lmc_fast as lf  # noqa: E402
from lmc_fast.sweep.evaluate import EvalOptions, evaluate_mixtures  # noqa: E402
from lmc_fast.sweep.lerp_kernel import bf16_fast_here  # noqa: E402
from lmc_fast.sweep.per_point import evaluate_per_point  # noqa: E402
from lmc_fast.sweep.interpolate import models_params  # noqa: E402


def forward_flops(arch, batch: int, tokens: int, in_features: int, classes: int) -> float:
    """Exact GEMM FLOPs of one forward pass (multiply-add = 2)."""
    d, m, L = arch.d_model, arch.d_mlp, arch.n_layer
    BT = batch * tokens
    per_layer = 2 * BT * (4 * d * d + 2 * d * m) + 2 * 2 * batch * tokens * tokens * d
    if arch.family == "vit":
        embed = 2 * batch * (tokens - 1) * in_features * d  # patch embedding (no cls token)
        head = 2 * batch * d * classes  # cls token only
    else:
        embed = 0  # a gather
        head = 2 * BT * d * classes
    return float(L * per_layer + embed + head)

def interleaved(fns: dict, repeat: int, device) -> dict:
    """name -> list of wall times, the variants run round robin `repeat` times (after one warm-up each)."""
    for fn in fns.values():
        fn()
    sync(device)
    times = {k: [] for k in fns}
    for _ in range(repeat):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            sync(device)
            times[k].append(time.perf_counter() - t0)
    return times


def build_case(family: str, args, device):
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    if family == "vit":
        cfg = lf.models.ViTConfig.paper()
        a, b = lf.models.ViT(cfg), lf.models.ViT(cfg)
        n = args.images
        x = torch.randn(n, cfg.channels, cfg.image_size, cfg.image_size, generator=g)
        y = torch.randint(0, cfg.num_classes, (n,), generator=g)
        tokens = (cfg.image_size // cfg.patch_size) ** 2 + 1
        sizes = {"model": "ViT.paper", "images": n, "batch": min(n, args.batch), "tokens": tokens}
        info = (tokens, cfg.channels * cfg.patch_size**2, cfg.num_classes)
    else:
        cfg = lf.models.GPT2Config(n_layer=6, n_embd=256, n_head=8, block_size=128, vocab_size=256)
        a, b = lf.models.GPT2(cfg), lf.models.GPT2(cfg)
        n = args.seqs
        x = torch.randint(0, cfg.vocab_size, (n, cfg.block_size), generator=g)
        y = x
        sizes = {"model": "GPT2(n_layer=6, n_embd=256, n_head=8, block=128, vocab=256)", "sequences": n,
                 "batch": min(n, args.batch), "tokens": cfg.block_size}
        info = (cfg.block_size, 0, cfg.vocab_size)
    a, b = a.to(device).eval(), b.to(device).eval()
    bs = sizes["batch"]
    data = [(x[i:i + bs], y[i:i + bs]) for i in range(0, n, bs)]
    return a, b, data, n, sizes, info


def run_family(family: str, args, device, peak32: float, peak16: float | None, peak_tf32: float | None = None) -> list[dict]:
    a, b, data, n, sizes, (tokens, in_feat, classes) = build_case(family, args, device)
    arch, params = models_params([a, b], "raw")
    lams = [i / (args.K - 1) for i in range(args.K)]
    W = [[1.0 - l, l] for l in lams]
    sizes = {**sizes, "K": args.K}
    flops = args.K * forward_flops(arch, n, tokens, in_feat, classes) / 1e9
    opts = EvalOptions(device=device, chunk=args.chunk, max_tokens=args.max_tokens)
    variants = {
        "loop": lambda: evaluate_per_point(a, params, W, data),
        "fused": lambda: evaluate_mixtures(arch, params, W, data, opts.replace(kernel=False)),
    }
    if device.type == "cuda":
        def tf32(kernel):
            return evaluate_mixtures(arch, params, W, data, opts.replace(kernel=kernel, tf32=True))

        variants["fused_tf32"] = lambda: tf32(False)  # fp32 storage, TF32 tensor-core GEMMs
        variants["kernel_tf32"] = lambda: tf32(True)
    results = {k: fn() for k, fn in variants.items()}  # also the warm-up
    times = interleaved(variants, args.repeat, device)
    med = {k: statistics.median(v) for k, v in times.items()}
    loop_loss = [r["loss"] for r in results["loop"]]

    def loss_err(res, ref):
        diffs = [abs(r["loss"] - l) for r, l in zip(res, ref)]
        return max(diffs), max(d / abs(l) for d, l in zip(diffs, ref))

    recs = []
    base = med["loop"]
    for name in [k for k in variants if k != "loop"]:
        abs_err, rel_err = loss_err(results[name], loop_loss)
        peak = peak_tf32 if name.endswith("_tf32") and peak_tf32 else peak32
        recs.append(record(
            f"sweep_{family}_{name}", device=device, dtype=torch.float32, sizes=sizes,
            baseline="per-lambda loop (engine='loop'): mix, build model, evaluate", baseline_s=base,
            ours_s=med[name], gflops=flops,
            extra={"variant": name, "gflops": flops / med[name], "peak_gflops": peak,
                   "peak_dtype": "tf32" if peak is peak_tf32 else "float32",
                   "fraction_of_peak": flops / med[name] / peak, "baseline_fraction_of_peak": flops / base / peak32,
                   "loss_max_abs_diff": abs_err, "loss_max_rel_diff": rel_err, "times_s": times[name],
                   "baseline_times_s": times["loop"]}))
    # bf16: full data where bf16 GEMMs are native, else a slice (CPU fallback is very slow)
    native = bf16_fast_here(device)
    bdata = data if native else [(data[0][0][: args.bf16_slice], data[0][1][: args.bf16_slice])]
    bn = n if native else min(args.bf16_slice, data[0][0].shape[0])
    bflops = args.K * forward_flops(arch, bn, tokens, in_feat, classes) / 1e9
    bvar = {"fused_fp32": lambda: evaluate_mixtures(arch, params, W, bdata, opts.replace(kernel=False)),
            "fused_bf16": lambda: evaluate_mixtures(arch, params, W, bdata,
                                                    opts.replace(kernel=False, dtype=torch.bfloat16))}
    if device.type == "cuda":
        bvar["kernel_bf16"] = lambda: evaluate_mixtures(arch, params, W, bdata,
                                                        opts.replace(kernel=True, dtype=torch.bfloat16, max_tokens=None))
    bres = {k: fn() for k, fn in bvar.items()}
    if native:
        bvar["loop"] = variants["loop"]
    btimes = interleaved(bvar, args.repeat if native else 1, device)
    bmed = {k: statistics.median(v) for k, v in btimes.items()}
    ref32 = [r["loss"] for r in bres["fused_fp32"]]
    bbase_name = "loop" if native else "fused_fp32"
    for name in [k for k in bvar if k.endswith("bf16")]:
        abs_err, rel_err = loss_err(bres[name], ref32)
        bsizes = {**sizes, **({} if native else {"bf16_slice": bn, ("images" if family == "vit" else "sequences"): bn})}
        recs.append(record(
            f"sweep_{family}_{name}", device=device, dtype=torch.bfloat16, sizes=bsizes,
            baseline=("per-lambda loop, fp32" if native else
                      "fused engine in fp32 on the same slice (no native bf16 GEMM on this CPU: "
                      "the loop at full size is in the fp32 records)"),
            baseline_s=bmed[bbase_name], ours_s=bmed[name], gflops=bflops,
            extra={"variant": name, "gflops": bflops / bmed[name],
                   "peak_gflops": peak16 if peak16 else peak32,
                   "peak_dtype": "bfloat16" if peak16 else "float32",
                   "fraction_of_peak": bflops / bmed[name] / (peak16 if peak16 else peak32),
                   "native_bf16_gemm": native,
                   "loss_max_abs_diff": abs_err, "loss_max_rel_diff": rel_err,
                   "loss_error_reference": "the same sweep in fp32",
                   "times_s": btimes[name]}))
    return recs


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--K", type=int, default=25)
    ap.add_argument("--images", type=int, default=256, help="ViT: random 32x32x3 images")
    ap.add_argument("--seqs", type=int, default=32, help="GPT-2: random sequences of 128 ids")
    ap.add_argument("--batch", type=int, default=512, help="data batch size")
    ap.add_argument("--chunk", type=int, default=32, help="lambda points per fused pass (at most)")
    ap.add_argument("--max-tokens", type=int, default=None, help="tokens per fused pass (default: per device)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bf16-slice", type=int, default=2, help="images/sequences for bf16 without native bf16 GEMMs")
    ap.add_argument("--models", default="vit,gpt2")
    ap.add_argument("--quick", action="store_true", help="small data, 1 repeat")
    ap.add_argument("--out", default=None, help="directory for the JSON (default bench/results/)")
    args = ap.parse_args(argv)
    if args.quick:
        args.images, args.seqs, args.repeat = min(args.images, 16), min(args.seqs, 2), 1
    device = torch.device(args.device)
    torch.manual_seed(0)
    peak_n = 2048 if device.type == "cpu" else 8192
    peak32 = matmul_peak(device, torch.float32, peak_n)
    peak16 = matmul_peak(device, torch.bfloat16, peak_n) if bf16_fast_here(device) else None
    peak_tf32 = None
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        peak_tf32 = matmul_peak(device, torch.float32, peak_n)  # the TF32 variants' yardstick
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 sweeps must match the loop to 1e-5
    print(f"fp32 matmul peak {peak32:.1f} GFLOP/s" + (f", bf16 {peak16:.1f}" if peak16 else
                                                       ", no native bf16 GEMM here"), flush=True)
    recs = []
    for fam in [m.strip() for m in args.models.split(",") if m.strip()]:
        out = run_family(fam, args, device, peak32, peak16, peak_tf32)
        print_table(out)
        for r in out:
            print(f"  {r['name']}: {r['gflops']:.1f} GFLOP/s = {r['fraction_of_peak']:.0%} of peak; "
                  f"loss max |diff| {r['loss_max_abs_diff']:.2e} (rel {r['loss_max_rel_diff']:.2e})", flush=True)
        recs += out
    for r in recs:
        r["peak_matmul_n"] = peak_n
    path = write_results("sweep_quick" if args.quick else "sweep", recs, device, out=args.out)
    print(f"wrote {path}")
    print_table(recs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
