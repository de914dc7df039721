"""Weight matching of two LLaMA-family models at the 1.1B scale on a CPU: time and peak memory.

    python bench/bench_llama_scale.py                      # TinyLlama-1.1B shapes, float32, 3 sweeps
    python bench/bench_llama_scale.py --preset small --pair planted --dtype float64   # a quick check

Two random models shaped like TinyLlama-1.1B (22 layers, d 2048, SwiGLU 5632, 32 query heads,
4 key / value heads, vocabulary 32000, untied) as standard parameters, the canonical form in the
chosen dtype (computed in float64 tensor by tensor), then `weight_matching` over the full group
(residual O(d), SwiGLU unit permutations, grouped heads with RoPE-commuting QK maps). What `lf.align`
runs, minus building nn.Modules (two 1.1B modules and their parameter copies would not fit here).
Peak memory is the process's high-water mark (VmHWM), against the two models' float32 size; the
goal is under 3x. `--pair planted` makes B a random group element applied to A and checks that
it is recovered (permutations exactly); `--pair random` (default) matches independent models.
`--device cuda`: both models generated, canonicalised and matched on the GPU (peak memory is
then torch's device high-water mark; the matmul peak is the device's float32 one, TF32 off).
Writes bench/results/llama_scale_<preset>_<pair>_<dtype>_<cpu|gpu>.json.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, cpu_model, device_name, matmul_peak  # noqa: E402

PRESETS = {
    "1.1b": dict(n_layer=22, d_model=2048, n_head=32, n_kv_head=4, d_mlp=5632, vocab=32000),
    "small": dict(n_layer=4, d_model=256, n_head=8, n_kv_head=2, d_mlp=688, vocab=1000),
}


def peak_rss_bytes() -> int:
    """The process's resident high-water mark (VmHWM), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def random_params(arch, vocab: int, seed: int, dtype, device="cpu") -> dict:
    """Standard parameters of a LLaMA-family model (no biases), std 0.02 like the usual init,
    norm weights perturbed so the canonical form has work to do."""
    g = torch.Generator(device=device).manual_seed(seed)

    def r(*shape, std=0.02):
        return torch.randn(*shape, generator=g, dtype=dtype, device=device).mul_(std)

    d, H, G, dh, f = arch.d_model, arch.n_head, arch.n_kv_head, arch.head_dim, arch.d_mlp
    p = {"tok_embed.weight": r(vocab, d), "ln_f.weight": 1 + r(d, std=0.1), "lm_head.weight": r(vocab, d)}
    for l in range(arch.n_layer):
        b = f"blocks.{l}."
        p[b + "ln1.weight"], p[b + "ln2.weight"] = 1 + r(d, std=0.1), 1 + r(d, std=0.1)
        p[b + "attn.q.weight"], p[b + "attn.k.weight"] = r(H * dh, d), r(G * dh, d)
        p[b + "attn.v.weight"], p[b + "attn.o.weight"] = r(G * dh, d), r(d, H * dh)
        p[b + "mlp.gate.weight"], p[b + "mlp.fc1.weight"], p[b + "mlp.fc2.weight"] = r(f, d), r(f, d), r(d, f)
    return p


def sweep_gflop(arch, vocab: int) -> float:
    """GEMM work of one structured sweep: the correlations of the layer-local groups (MLP units:
    gate, up rows and down columns; heads: query and output blocks per pair of query heads, key and
    value blocks per pair of key / value heads) and of the residual group (every parameter with a
    residual axis), 2 flops per multiply-add. Assignments and polar factors are extra."""
    d, H, G, dh, f, L = arch.d_model, arch.n_head, arch.n_kv_head, arch.head_dim, arch.d_mlp, arch.n_layer
    mlp = 3 * 2 * f * f * d
    heads = 2 * 2 * (H * dh) ** 2 * d + 2 * 2 * (G * dh) ** 2 * d
    residual_numel = 2 * vocab * d + L * (2 * H * dh * d + 2 * G * dh * d + 3 * f * d)
    return (L * (mlp + heads) + 2 * d * residual_numel) / 1e9


def main(argv=None) -> dict:
    from lmc_fast.match.weight import weight_matching
    from lmc_fast.models.arch import Arch
    from lmc_fast.symmetry import elements as E
    from lmc_fast.symmetry.canonical import canonical_params
    from lmc_fast.symmetry.spec import canonical_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=PRESETS, default="1.1b")
    ap.add_argument("--pair", choices=("random", "planted"), default="random")
    ap.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    ap.add_argument("--max-iter", type=int, default=3, help="weight-matching sweeps (each is timed)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    device = torch.device(args.device)
    on_gpu = device.type == "cuda"
    shape = PRESETS[args.preset]
    arch = Arch.llama(shape["n_layer"], shape["d_model"], shape["n_head"], shape["d_mlp"], n_kv_head=shape["n_kv_head"])
    spec = canonical_spec(arch)
    rss0 = peak_rss_bytes()
    phases = {}

    t0 = time.perf_counter()
    raw = random_params(arch, shape["vocab"], 0, torch.float32, device)
    n_params = sum(t.numel() for t in raw.values())
    model_bytes = 4 * n_params  # one model in float32
    phases["init_a_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    pa = canonical_params(arch, raw, dtype)
    del raw
    phases["canonical_a_s"] = time.perf_counter() - t0
    planted = None
    t0 = time.perf_counter()
    if args.pair == "planted":
        planted = {n: E.random_element(g, torch.Generator().manual_seed(1), dtype=dtype) for n, g in spec.groups.items()}
        planted = {n: {k: v.to(device) for k, v in el.items()} for n, el in planted.items()}
        pb = E.apply_spec(spec, pa, planted)
        phases["plant_s"] = time.perf_counter() - t0
    else:
        raw = random_params(arch, shape["vocab"], 1, torch.float32, device)
        pb = canonical_params(arch, raw, dtype)
        del raw
        phases["canonical_b_s"] = time.perf_counter() - t0
    rss_models = peak_rss_bytes()

    if on_gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        dev_models = torch.cuda.memory_allocated()
    t0 = time.perf_counter()
    elements, info = weight_matching(spec, pa, pb, max_iter=args.max_iter, polish_iter=2)
    if on_gpu:
        torch.cuda.synchronize()
    match_s = time.perf_counter() - t0
    rss_peak = peak_rss_bytes()

    recovered = None
    if planted is not None:
        inverse = {n: E.inverse(g, planted[n]) for n, g in spec.groups.items()}
        recovered = {
            "permutations_exact": all(torch.equal(elements[n][k], inverse[n][k]) for n in spec.groups
                                      for k in ("perm", "qperm") if k in inverse[n]),
            "max_map_error": max(float((elements[n][k].double() - inverse[n][k].double()).abs().max())
                                 for n in spec.groups for k in ("qk", "vo", "matrix") if k in inverse[n]),
        }
    gflop = sweep_gflop(arch, shape["vocab"])
    sweeps = info["iterations"]
    peak_gflops = matmul_peak(device, dtype, (8192 if on_gpu else 2048) if args.preset == "1.1b" else 512)
    per_sweep = (match_s - 0.0) / max(sweeps, 1)
    rec = {
        "name": "llama_weight_matching_scale", "preset": args.preset, "shape": shape, "pair": args.pair,
        "dtype": args.dtype, "params_per_model": n_params, "model_fp32_bytes": model_bytes,
        "machine": cpu_model(), "device": device_name(device), "torch": torch.__version__, "threads": torch.get_num_threads(),
        "loadavg_1min": os.getloadavg()[0], "phases_s": phases, "weight_matching_s": match_s,
        "sweeps": sweeps, "polish_iterations": info["polish_iterations"], "objective": info["objective"],
        "rss_at_start_bytes": rss0, "rss_after_models_bytes": rss_models, "peak_rss_bytes": rss_peak,
        "peak_over_two_models_fp32": rss_peak / (2 * model_bytes),
        "sweep_gemm_gflop": gflop, "seconds_per_sweep_incl_polish": per_sweep,
        "achieved_gflops_lower_bound": gflop * sweeps / match_s, "matmul_peak_gflops": peak_gflops,
        "fraction_of_matmul_peak": gflop * sweeps / match_s / peak_gflops, "recovered": recovered,
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if on_gpu:
        rec.update({"device_bytes_models": dev_models, "device_peak_bytes": torch.cuda.max_memory_allocated(),
                    "device_peak_over_two_models_fp32": torch.cuda.max_memory_allocated() / (2 * model_bytes),
                    "tf32": torch.backends.cuda.matmul.allow_tf32})
    out = args.out or RESULTS / f"llama_scale_{args.preset}_{args.pair}_{args.dtype}_{'gpu' if on_gpu else 'cpu'}.json"
    if out.is_dir():
        out = out / f"llama_scale_{args.preset}_{args.pair}_{args.dtype}_{'gpu' if on_gpu else 'cpu'}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=2) + "\n")
    print(f"{args.preset} {args.pair} {args.dtype}: {n_params / 1e9:.3f}B params/model, weight matching "
          f"{match_s:.1f} s ({sweeps} sweeps + {info['polish_iterations']} polish), peak RSS "
          f"{rss_peak / 2**30:.2f} GiB = {rec['peak_over_two_models_fp32']:.2f}x the two models' fp32 size; "
          f"GEMMs {gflop:.0f} GFLOP/sweep, {rec['fraction_of_matmul_peak']:.0%} of matmul peak "
          f"{peak_gflops:.0f} GFLOP/s" + (f"; planted: {recovered}" if recovered else ""))
    print(f"-> {out}")
    return rec


if __name__ == "__main__":
    main()
