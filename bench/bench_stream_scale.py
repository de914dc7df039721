"""Streamed weight matching, alignment and merge of two LLaMA-family checkpoints at the 1B / 7B scale on a
CPU: time, peak memory, bytes read, fraction of the matmul peak.

    python bench/bench_stream_scale.py                                 # TinyLlama-1.1B shapes, bf16 on disk
    python bench/bench_stream_scale.py --preset llama-tiny --planted   # a quick check, planted twin too
    python bench/bench_stream_scale.py --preset mistral-7b             # needs ~60 GB of disk, hours on 2 cores

Two random checkpoints of the preset's published shape are written as Hugging Face folders (bf16 shards,
block by block: never whole in memory; reused when already there), then, each phase with the process's
high-water mark (VmHWM) reset before it:
  match  - what `lf.align(path_a, path_b, "weight", dtype=float32)` runs (its sweep counts set): a layer at a time;
  apply  - `apply_to_path(al, path_b, out)`: the aligned B written shard by shard;
  merge  - `merge_paths([a, b], out, [None, al])`: the aligned midpoint written shard by shard;
  planted (--planted) - B' = g . A written streaming and matched: g^-1 must come back.
--writes-only skips the match and writes with a random element of the group instead: the memory and seconds
of apply and merge do not depend on which element (a quick check of the writers at 7B widths).
The in-memory baseline of the same 1.1B match is bench/bench_llama_scale.py (19.7 GiB peak).
Writes bench/results/stream_scale_<preset>_cpu.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llama_scale import sweep_gflop  # noqa: E402
from common import RESULTS, cpu_model, matmul_peak  # noqa: E402


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key):
            return int(line.split()[1]) * 1024
    return 0


def phase(record: dict, name: str, fn, save=None):
    """Run fn with the high-water mark reset first; record seconds and peak RSS (absolute and over the start)."""
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    rss0 = _status("VmRSS:")
    t0 = time.perf_counter()
    out = fn()
    record[name] = {"seconds": time.perf_counter() - t0, "peak_rss_bytes": _status("VmHWM:"),
                    "rss_at_start_bytes": rss0}
    print(f"{name}: {record[name]['seconds']:.1f} s, peak RSS {record[name]['peak_rss_bytes'] / 2**30:.2f} GiB",
          flush=True)
    if save is not None:
        save()  # each phase's figures kept as it ends: a long run cut short still leaves them
    return out


class GemmMeter:
    """Seconds and flops spent inside the match's GEMMs, by wrapping the three functions that run them:
    the permutation / orthogonal groups' correlations (`solve.axes_correlation`), the heads' (per-circuit
    einsums, `kinds.heads.correlation`) and the residual rotation applied to B's tensors
    (`Orthogonal.apply`). Flops are counted from the operands' shapes (2 per multiply-add): each correlation
    term is a full (n x m) @ (m x n) product, n the axis length, m the rest; the rotation is (n x n) @ (n x m).
    The rate inside them against the measured peak says how good the GEMMs are; their share of the match's
    seconds says how much else there is."""

    def __init__(self):
        self.parts = {k: {"seconds": 0.0, "gflop": 0.0, "calls": 0} for k in ("correlation", "heads", "rotation")}

    @staticmethod
    def _corr_gflop(group, pa) -> float:
        return sum(2 * pa[ax.param].shape[ax.axis] * pa[ax.param].numel() for ax in group.axes) / 1e9

    def _timed(self, part: str, fn, gflop: float):
        t0 = time.perf_counter()
        out = fn()
        rec = self.parts[part]
        rec["seconds"] += time.perf_counter() - t0
        rec["gflop"] += gflop
        rec["calls"] += 1
        return out

    def __enter__(self):
        from lmc_fast.match import solve
        from lmc_fast.match.kinds import heads
        from lmc_fast.symmetry.groups import Orthogonal

        self._saved = [(solve, "axes_correlation", solve.axes_correlation), (heads, "correlation", heads.correlation),
                       (Orthogonal, "apply", Orthogonal.apply)]
        corr, head_corr, rotate = (f for _, _, f in self._saved)
        solve.axes_correlation = lambda g, pa, pb: self._timed(
            "correlation", lambda: corr(g, pa, pb), self._corr_gflop(g, pa))
        heads.correlation = lambda g, pa, pb: self._timed(
            "heads", lambda: head_corr(g, pa, pb), self._corr_gflop(g, pa))
        Orthogonal.apply = lambda kind, flat, g, ax, el: self._timed(
            "rotation", lambda: rotate(kind, flat, g, ax, el), 2 * flat.shape[0] * flat.numel() / 1e9)
        return self

    def __exit__(self, *exc):
        for owner, name, fn in self._saved:
            setattr(owner, name, fn)

    def record(self, peak: float, total_seconds: float) -> dict:
        out = {}
        for k, r in self.parts.items():
            rate = r["gflop"] / r["seconds"] if r["seconds"] else 0.0
            out[k] = {**r, "gflops": rate, "fraction_of_peak": rate / peak,
                      "share_of_match_seconds": r["seconds"] / total_seconds}
        g = sum(r["gflop"] for r in self.parts.values())
        s = sum(r["seconds"] for r in self.parts.values())
        out["all"] = {"gflop": g, "seconds": s, "gflops": g / s, "fraction_of_peak": g / s / peak,
                      "share_of_match_seconds": s / total_seconds,
                      # the whole match as GEMM work at the peak: what the seconds outside the GEMMs cost
                      "end_to_end_fraction_of_peak": g / total_seconds / peak}
        return out


def folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.iterdir() if p.is_file())


def main(argv=None) -> dict:
    import lmc_fast as lf
    from lmc_fast.models.adapters import adapter_for
    from lmc_fast.stream.generate import CONFIGS, llama_on_meta, write_random
    from lmc_fast.stream.paths import apply_to_path, merge_paths
    from lmc_fast.symmetry import Alignment, canonical_spec

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(CONFIGS), default="tinyllama-1.1b")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/lmc_stream_bench"))
    ap.add_argument("--layers", type=int, default=None,
                    help="keep only this many of the preset's layers (same widths: the per-layer memory and "
                         "seconds of the full depth, in a fraction of the time)")
    ap.add_argument("--max-iter", type=int, default=3, help="weight-matching sweeps")
    ap.add_argument("--polish-iter", type=int, default=2)
    ap.add_argument("--planted", action="store_true", help="also match a planted twin B' = g . A")
    ap.add_argument("--keep", action="store_true", help="keep the aligned / merged outputs")
    ap.add_argument("--writes-only", action="store_true",
                    help="no match: apply and merge with a random group element (writer memory and seconds only)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    meta = llama_on_meta(args.preset, **({"num_hidden_layers": args.layers} if args.layers else {}))
    n_params = sum(p.numel() for p in meta.parameters())
    model_bytes = 2 * n_params  # bf16 on disk
    outputs = 2 + 1 + (1 if args.planted else 0)  # aligned, merged (+ the planted twin)
    tag = args.preset + (f"_{args.layers}layers" if args.layers else "")
    args.workdir = args.workdir / tag  # checkpoints of one shape per folder (reused across runs)
    tag += "_writes" if args.writes_only else ""
    args.workdir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.workdir).free
    need = model_bytes * (outputs + sum(not (args.workdir / n / "config.json").exists() for n in "ab"))
    print(f"{args.preset}: {n_params / 1e9:.2f}B parameters, {model_bytes / 1e9:.1f} GB per checkpoint; "
          f"needs {need / 1e9:.1f} GB of disk, {free / 1e9:.1f} GB free", flush=True)
    if need > free:
        raise SystemExit(f"not enough disk in {args.workdir}: need {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")
    shape = {**CONFIGS[args.preset], **({"num_hidden_layers": args.layers} if args.layers else {})}
    rec = {"name": "stream_scale", "preset": args.preset, "shape": shape, "params_per_model": n_params,
           "disk_bytes_per_model": model_bytes, "machine": cpu_model(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "loadavg_1min_start": os.getloadavg()[0], "phases": {}}
    ph = rec["phases"]
    out = args.out or RESULTS / f"stream_scale_{tag}_cpu.json"

    def save():
        out.write_text(json.dumps(rec, indent=2) + "\n")
    pa, pb = args.workdir / "a", args.workdir / "b"
    for seed, path in ((0, pa), (1, pb)):
        if not (path / "config.json").exists():
            phase(ph, f"generate_{path.name}", lambda: write_random(path, meta, seed))
    arch = adapter_for(meta).arch(meta)
    if args.writes_only:
        al = Alignment.random(canonical_spec(arch), seed=3)
    else:
        al = _match_phase(lf, pa, pb, args, arch, model_bytes, ph, rec, save)
    out_a = phase(ph, "apply", lambda: apply_to_path(al, pb, args.workdir / "b_aligned"), save)
    rec["apply_bytes_written"] = folder_bytes(out_a)
    out_m = phase(ph, "merge", lambda: merge_paths([pa, pb], args.workdir / "merged", [None, al]), save)
    rec["merge_bytes_written"] = folder_bytes(out_m)
    if args.planted and not args.writes_only:
        truth = Alignment.random(canonical_spec(arch), seed=7)
        twin = phase(ph, "plant", lambda: apply_to_path(truth, pa, args.workdir / "planted"), save)
        found = phase(ph, "match_planted", lambda: _match(lf, pa, twin, args), save)
        inv = truth.inverse()
        rec["planted"] = {
            "permutations_exact": all(torch.equal(found[n][k], inv[n][k]) for n in inv.elements
                                      for k in inv[n] if not inv[n][k].is_floating_point()),
            "max_map_error": max(float((found[n][k].double() - inv[n][k].double()).abs().max())
                                 for n in inv.elements for k in inv[n] if inv[n][k].is_floating_point())}
        print(f"planted: {rec['planted']}", flush=True)
    if not args.keep:
        for name in ("b_aligned", "merged", "planted"):
            shutil.rmtree(args.workdir / name, ignore_errors=True)
    rec["loadavg_1min_end"] = os.getloadavg()[0]
    rec["peak_rss_bytes"] = max(p["peak_rss_bytes"] for k, p in ph.items() if not k.startswith("generate"))
    rec["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save()
    if args.writes_only:
        print(f"{args.preset}: apply {ph['apply']['seconds']:.0f} s, peak {ph['apply']['peak_rss_bytes'] / 2**30:.2f} GiB; "
              f"merge {ph['merge']['seconds']:.0f} s, peak {ph['merge']['peak_rss_bytes'] / 2**30:.2f} GiB -> {out}")
        return rec
    m, mr = ph["match"], rec["match"]
    for k, r in mr["gemms"].items():
        print(f"  GEMMs, {k:11s}: {r['gflop']:8.0f} GFLOP in {r['seconds']:7.1f} s = {r['gflops']:5.1f} GFLOP/s, "
              f"{r['fraction_of_peak']:.0%} of peak, {r['share_of_match_seconds']:.0%} of the match's seconds")
    print(f"{args.preset}: match {m['seconds']:.0f} s ({mr['sweeps']} sweeps + {mr['polish_iterations']} polish), peak "
          f"RSS {rec['peak_rss_bytes'] / 2**30:.2f} GiB over all phases; GEMMs at "
          f"{mr['gemm_fraction_of_peak']:.0%} of {mr['matmul_peak_gflops']:.0f} GFLOP/s; apply {ph['apply']['seconds']:.0f} s, "
          f"merge {ph['merge']['seconds']:.0f} s -> {out}")
    return rec


def _match_phase(lf, pa, pb, args, arch, model_bytes, ph, rec, save):
    """The streamed match, timed and metered: its GEMMs' seconds and flops, the sweep's fraction of the peak."""
    from lmc_fast.stream.generate import CONFIGS

    with GemmMeter() as meter:
        al = phase(ph, "match", lambda: _match(lf, pa, pb, args), save)
    info = al.info
    gflop = sweep_gflop(arch, CONFIGS[args.preset]["vocab_size"])
    peak = matmul_peak("cpu", torch.float32, 2048)
    sweeps = info["iterations"]
    rec["match"] = {"sweeps": sweeps, "polish_iterations": info["polish_iterations"], "objective": info["objective"],
                    "bytes_read": info["bytes_read"], "bytes_read_per_sweep_pass": 2 * model_bytes,
                    "sweep_gemm_gflop": gflop, "matmul_peak_gflops": peak,
                    "gemm_fraction_of_peak": gflop * sweeps / ph["match"]["seconds"] / peak,
                    "gemms": meter.record(peak, ph["match"]["seconds"])}
    return al


def _match(lf, pa, pb, args):
    """What lf.align(pa, pb, "weight", dtype=torch.float32) runs, with the sweep counts of the in-memory bench."""
    from lmc_fast.match.streamed import align_streamed

    return align_streamed(pa, pb, "canonical", dtype=torch.float32, max_iter=args.max_iter,
                          polish_iter=args.polish_iter)


if __name__ == "__main__":
    main()
