"""MergeMany on checkpoint paths, streamed, against the in-memory merge_many a user would otherwise run: seconds,
peak memory, bytes read, and that both find the same alignments.

    python bench/bench_merge_many_stream.py                      # 3 random LLaMA checkpoints, 8 layers, 2 rounds
    python bench/bench_merge_many_stream.py --models 4 --layers 12

N random checkpoints of a LLaMA shape are written as Hugging Face folders (bf16, block by block), then in one
process, the high-water mark (VmHWM) reset before each:
  streamed  - `lf.merge_many(paths, "weight", rounds=R)`: every model read a block at a time, never whole;
  in_memory - the models loaded (`load_model`) and `lf.merge_many(models, "weight", rounds=R)`.
The streamed run goes first: the heap it leaves behind lowers what the in-memory run adds to the resident set,
so the memory ratio is conservative; both run once on tiny checkpoints first, so the libraries they load count for
neither. Both solve in float64. Writes bench/results/merge_many_stream_cpu.json.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import RESULTS, cpu_model, proc_status  # noqa: E402


def measured(fn):
    """(result, seconds, bytes the resident set rose above its level at the start)."""
    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = proc_status("VmRSS:")
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, proc_status("VmHWM:") - start


def max_difference(mem, streamed) -> tuple[float, bool]:
    """Largest difference of the maps, and whether every permutation is equal."""
    diff, perms = 0.0, True
    for a, b in zip(mem, streamed):
        for name, el in a.elements.items():
            for key, t in el.items():
                u = b.elements[name][key]
                if t.is_floating_point():
                    diff = max(diff, float((t - u).abs().max()))
                else:
                    perms = perms and torch.equal(t, u)
    return diff, perms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2, help="MergeMany rounds (at most)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--mlp", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--out", type=Path, default=RESULTS / "merge_many_stream_cpu.json")
    args = ap.parse_args()

    import lmc_fast as lf
    from lmc_fast.io import load_model
    from lmc_fast.stream.generate import llama_on_meta, write_random

    shape = dict(hidden_size=args.hidden, intermediate_size=args.mlp, num_attention_heads=args.heads,
                 num_key_value_heads=args.heads, vocab_size=args.vocab, num_hidden_layers=args.layers)
    model = llama_on_meta("llama-tiny", **shape)
    n_params = sum(p.numel() for p in model.parameters())
    work = args.workdir or Path(tempfile.mkdtemp(prefix="merge_many_bench_"))
    paths = [write_random(work / f"m{i}", model, i) for i in range(args.models)]
    print(f"{args.models} checkpoints of {n_params / 1e6:.1f}M parameters in {work}", flush=True)
    # both routes once on tiny checkpoints first: the libraries they load (transformers, safetensors) are then
    # resident before the high-water marks are reset, and count for neither
    tiny = llama_on_meta("llama-tiny", hidden_size=64, intermediate_size=128, vocab_size=64, num_hidden_layers=1)
    warm = [write_random(work / f"warm{i}", tiny, i) for i in range(args.models)]
    lf.merge_many(warm, "weight", rounds=1)
    lf.merge_many([load_model(p) for p in warm], "weight", rounds=1)
    load = os.getloadavg()

    streamed, s_seconds, s_peak = measured(lambda: lf.merge_many(paths, "weight", rounds=args.rounds))
    print(f"streamed: {s_seconds:.1f} s, peak +{s_peak / 2**20:.0f} MiB", flush=True)
    (_, mem), m_seconds, m_peak = measured(
        lambda: lf.merge_many([load_model(p) for p in paths], "weight", rounds=args.rounds, return_alignments=True))
    print(f"in memory: {m_seconds:.1f} s, peak +{m_peak / 2**20:.0f} MiB", flush=True)
    diff, perms = max_difference(mem, streamed)
    sizes = {"float64_models_bytes": 8 * n_params * args.models, "layer_float64_bytes":
             8 * sum(p.numel() for n, p in model.named_parameters() if ".0." in n)}
    result = {
        "bench": "merge_many_stream",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu": cpu_model(), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
                    "load_average_before": load, "load_average_after": os.getloadavg(),
                    "python": platform.python_version(), "torch": torch.__version__},
        "shape": shape, "parameters_per_model": n_params, "models": args.models, "rounds": args.rounds,
        "dtype": "float64", "disk": "bf16 Hugging Face folders", **sizes,
        "streamed": {"seconds": s_seconds, "peak_rss_over_start_bytes": s_peak,
                     "rounds_done": streamed[0].info["merge_rounds"],
                     # what the last re-alignment of each model read (every model's blocks, every pass)
                     "bytes_read_last_realignments": sum(al.info.get("bytes_read", 0) for al in streamed)},
        "in_memory": {"seconds": m_seconds, "peak_rss_over_start_bytes": m_peak,
                      "rounds_done": mem[0].info["merge_rounds"]},
        "ratio_seconds_streamed_over_in_memory": s_seconds / m_seconds,
        "ratio_peak_in_memory_over_streamed": m_peak / max(s_peak, 1),
        "same_alignments": {"max_map_difference": diff, "permutations_equal": perms},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'':10} {'seconds':>9} {'peak MiB':>9}\n{'streamed':10} {s_seconds:9.1f} {s_peak / 2**20:9.0f}\n"
          f"{'in memory':10} {m_seconds:9.1f} {m_peak / 2**20:9.0f}\n"
          f"peak ratio {result['ratio_peak_in_memory_over_streamed']:.1f}x, time ratio "
          f"{result['ratio_seconds_streamed_over_in_memory']:.2f}x; maps differ by {diff:.1e}, permutations "
          f"{'equal' if perms else 'DIFFER'} -> {args.out}")


if __name__ == "__main__":
    main()
