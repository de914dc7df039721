"""Streamed weight matching, alignment, merge and barrier of two LLaMA-family checkpoints at the 1B / 7B scale
on a CPU: time, peak memory, bytes read, fraction of the matmul peak.

    python bench/bench_stream_scale.py                                 # TinyLlama-1.1B shapes, bf16 on disk
    python bench/bench_stream_scale.py --preset llama-tiny --planted   # a quick check, planted twin too
    torchrun --standalone --nproc_per_node 2 bench/bench_stream_scale.py --preset mistral-7b --planted \
        --barrier-tokens 1024 --max-iter 1 --polish-iter 0             # ~45 GB of disk free, ~2 h on 2 cores

Two random checkpoints of the preset's published shape are written as Hugging Face folders (bf16 shards,
block by block: never whole in memory; reused when already there), then, each phase with the process's
high-water mark (VmHWM) reset before it:
  match  - what `lf.align(path_a, path_b, "weight", dtype=float32)` runs (its sweep counts set): a layer at a time;
  apply  - `apply_to_path(al, path_b, out)`: the aligned B written shard by shard;
  merge  - `merge_paths([a, b], out, [None, al])`: the aligned midpoint written shard by shard;
  barrier (--barrier-tokens) - `lf.barrier(path_a, path_b, data, align=al)` streamed on random tokens;
  planted (--planted) - B' = g . A written streaming and matched: g^-1 must come back.
The aligned B and the merge are deleted before the planted twin is written (unless --keep), so the disk
holds at most four checkpoints. Under torchrun the match, the barrier and the planted match split their work
over the ranks (layers, batches), and the two writers run side by side (apply on rank 0, merge on rank 1);
each phase is reported by its slowest rank and largest process, every rank's figures in rank_phases.
Each match saves its alignment in the workdir; `--only PHASE` (repeatable) runs some phases and reads the
alignments the others saved, so a 7B run can be split over sessions, e.g. the planted twin kept, then its
barrier (aligned twin = A up to bf16 rounding, so the barrier must be ~0):
    ... --only planted --keep;   ... --only barrier --barrier-pair planted --barrier-tokens 1024
--random-element skips the match: the writers and the barrier use a random element of the group instead (their
memory and seconds do not depend on which: a quick check at 7B widths, e.g. with --layers 2); --writes-only
is that with the write phase alone.
The in-memory baseline of the same 1.1B match is bench/bench_llama_scale.py (19.7 GiB peak).
Writes bench/results/stream_scale_<preset>_cpu.json.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_llama_scale import sweep_gflop  # noqa: E402
from common import RESULTS, cpu_model, matmul_peak, proc_status  # noqa: E402


def phase(record: dict, name: str, fn, save=None):
    """Run fn with the high-water mark reset first; record seconds and peak RSS (absolute and over the start)."""
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")
    rss0 = proc_status("VmRSS:")
    t0 = time.perf_counter()
    out = fn()
    record[name] = {"seconds": time.perf_counter() - t0, "peak_rss_bytes": proc_status("VmHWM:"),
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


def _join() -> tuple[int, int]:
    """(rank, world): torchrun's gloo group joined when there is one, else (0, 1)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0, 1
    import torch.distributed as dist

    # a rank waits at a barrier while the other writes a 7B checkpoint alone (gloo's default: 30 minutes)
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=6))
    return dist.get_rank(), dist.get_world_size()


def _sync(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


def token_batches(vocab: int, tokens: int, seq_len: int, per_batch: int = 1) -> list:
    """Random token sequences (seeded) as (inputs, targets) batches of a next-token model: `tokens` in all."""
    n_seq = max(1, tokens // seq_len)
    x = torch.randint(0, vocab, (n_seq, seq_len), generator=torch.Generator().manual_seed(0))
    return [(x[i:i + per_batch], x[i:i + per_batch]) for i in range(0, n_seq, per_batch)]


def main(argv=None) -> dict:
    import lmc_fast as lf
    from lmc_fast.models.adapters import adapter_for
    from lmc_fast.stream.generate import CONFIGS, llama_on_meta, write_random
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
    ap.add_argument("--barrier-tokens", type=int, default=0,
                    help="also sweep the aligned pair's barrier on this many random tokens (0: no sweep)")
    ap.add_argument("--lambdas", type=int, default=11, help="lambdas of that sweep")
    ap.add_argument("--seq-len", type=int, default=256, help="sequence length of that sweep's batches")
    ap.add_argument("--keep", action="store_true", help="keep the aligned / merged outputs and the planted twin")
    ap.add_argument("--random-element", action="store_true",
                    help="no match: the writers and the barrier use a random group element (memory and seconds only)")
    ap.add_argument("--writes-only", action="store_true", help="--random-element, the write phase alone")
    ap.add_argument("--only", action="append", choices=PHASES, default=None,
                    help="run only this phase (repeatable); an alignment it needs that this run does not compute is "
                         "read from the workdir, where each match saves its own (a long run split over sessions)")
    ap.add_argument("--barrier-pair", choices=("ab", "planted"), default="ab",
                    help="the barrier's pair: A and B aligned by the match, or A and the planted twin aligned by "
                         "the planted match (the aligned twin is A up to bf16 rounding: a barrier of ~0 at scale)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    phases = _phases(args)
    rank, world = _join()
    meta = llama_on_meta(args.preset, **({"num_hidden_layers": args.layers} if args.layers else {}))
    n_params = sum(p.numel() for p in meta.parameters())
    model_bytes = 2 * n_params  # bf16 on disk
    # besides the pair: the aligned B and the merge (deleted before the planted twin is written unless --keep)
    outputs = max(2 * ("write" in phases), 1 * ("planted" in phases)) if not args.keep else \
        2 * ("write" in phases) + ("planted" in phases)
    tag = args.preset + (f"_{args.layers}layers" if args.layers else "")
    args.workdir = args.workdir / tag  # checkpoints of one shape per folder (reused across runs)
    tag += "_writes" if args.writes_only else "_random" if args.random_element else ""
    args.workdir.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(args.workdir).free
    need = model_bytes * (outputs + sum(not (args.workdir / n / "config.json").exists() for n in "ab"))
    if rank == 0:
        print(f"{args.preset}: {n_params / 1e9:.2f}B parameters, {model_bytes / 1e9:.1f} GB per checkpoint; "
              f"needs {need / 1e9:.1f} GB of disk, {free / 1e9:.1f} GB free; {world} rank(s); "
              f"phases {', '.join(phases)}", flush=True)
    if need > free:
        raise SystemExit(f"not enough disk in {args.workdir}: need {need / 1e9:.1f} GB, {free / 1e9:.1f} GB free")
    shape = {**CONFIGS[args.preset], **({"num_hidden_layers": args.layers} if args.layers else {})}
    rec = {"name": "stream_scale", "preset": args.preset, "shape": shape, "params_per_model": n_params,
           "disk_bytes_per_model": model_bytes, "machine": cpu_model(), "torch": torch.__version__,
           "threads": torch.get_num_threads(), "ranks": world, "loadavg_1min_start": os.getloadavg()[0],
           "run_phases": phases, "phases": {}}
    ph = rec["phases"]
    out = args.out or RESULTS / f"stream_scale_{tag}{'' if args.only is None else '_' + '_'.join(phases)}_cpu.json"
    # every rank keeps its figures as each phase ends (a long run cut short still leaves them); rank 0's
    # file is the result, joined with the others' at the end
    mine = out if rank == 0 else args.workdir / f"rank{rank}.json"

    def save():
        mine.write_text(json.dumps(rec, indent=2) + "\n")
    pa, pb, twin = args.workdir / "a", args.workdir / "b", args.workdir / "planted"
    if rank == 0:
        for seed, path in ((0, pa), (1, pb)):
            if not (path / "config.json").exists():
                phase(ph, f"generate_{path.name}", lambda: write_random(path, meta, seed))
    _sync(world)
    arch = adapter_for(meta).arch(meta)
    saved = {"ab": args.workdir / "alignment_ab.safetensors", "planted": args.workdir / "alignment_planted.safetensors"}
    al = None
    if args.writes_only or args.random_element:
        al = Alignment.random(canonical_spec(arch), seed=3)
    elif "match" in phases:
        al = _match_phase(lf, pa, pb, args, arch, model_bytes, ph, rec, save)
        if rank == 0:
            al.save(saved["ab"])
    if "write" in phases:
        al = al or _saved_alignment(saved["ab"], rec)
        _write_phase(pa, pb, al, args, ph, rec, save, rank, world)
    if "barrier" in phases and args.barrier_pair == "ab":
        _barrier_phase(lf, pa, pb, al or _saved_alignment(saved["ab"], rec), shape, args, ph, rec, save, rank)
    if "planted" in phases:
        found = _planted_phase(lf, pa, twin, arch, args, ph, rec, save, rank, world)
        if rank == 0:
            found.save(saved["planted"])
    if "barrier" in phases and args.barrier_pair == "planted":
        found = found if "planted" in phases else _saved_alignment(saved["planted"], rec)
        if not (twin / "config.json").exists():
            raise SystemExit(f"no planted twin in {twin}: run the planted phase with --keep first")
        _barrier_phase(lf, pa, twin, found, shape, args, ph, rec, save, rank)
    _sync(world)
    if rank == 0 and not args.keep:
        shutil.rmtree(twin, ignore_errors=True)
    rec["loadavg_1min_end"] = os.getloadavg()[0]
    rec["date"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    save()
    rec = _joined(rec, world)
    if rank != 0:
        mine.unlink(missing_ok=True)
        return rec
    save()
    _summary(rec, args, out, world)
    return rec


#: the phases a run can be limited to (--only), in the order they run
PHASES = ("match", "write", "barrier", "planted")


def _phases(args) -> list:
    """The phases this run does: --only's, else what the other flags ask for."""
    if args.only is not None:
        if "barrier" in args.only and not args.barrier_tokens:
            raise SystemExit("--only barrier needs --barrier-tokens N")
        if args.writes_only and set(args.only) != {"write"}:
            raise SystemExit("--writes-only runs the write phase only")
        if args.random_element and {"match", "planted"} & set(args.only):
            raise SystemExit("--random-element has no match: --only write and / or barrier")
        return [p for p in PHASES if p in args.only]
    if args.writes_only:
        return ["write"]
    if args.random_element:
        return ["write"] + ["barrier"] * bool(args.barrier_tokens)
    return ["match", "write"] + ["barrier"] * bool(args.barrier_tokens) + ["planted"] * args.planted


def _saved_alignment(path: Path, rec: dict):
    """An alignment an earlier run's match saved (this run did not compute it)."""
    from lmc_fast.symmetry import Alignment

    if not path.is_file():
        raise SystemExit(f"no saved alignment {path}: run the phase that computes it first")
    rec.setdefault("alignments_read", []).append(str(path))
    return Alignment.load(path)


def _write_phase(pa, pb, al, args, ph, rec, save, rank, world):
    """The aligned B and the merge written; the two writers run in one process each (side by side on two
    ranks, one after the other on one), their outputs deleted after unless --keep."""
    from lmc_fast.stream.paths import apply_to_path, merge_paths

    def write_aligned():
        rec["apply_bytes_written"] = folder_bytes(
            phase(ph, "apply", lambda: apply_to_path(al, pb, args.workdir / "b_aligned"), save))
        save()

    def write_merged():
        rec["merge_bytes_written"] = folder_bytes(
            phase(ph, "merge", lambda: merge_paths([pa, pb], args.workdir / "merged", [None, al]), save))
        save()
    for r, write in enumerate((write_aligned, write_merged)):
        if rank == r % world:
            write()
    _sync(world)
    if rank == 0 and not args.keep:
        for name in ("b_aligned", "merged"):
            shutil.rmtree(args.workdir / name, ignore_errors=True)


def _barrier_phase(lf, pa, pb, al, shape, args, ph, rec, save, rank):
    """lf.barrier of (pa, pb moved by al) streamed on seeded random tokens."""
    data = token_batches(shape["vocab_size"], args.barrier_tokens, args.seq_len)
    res = phase(ph, "barrier", lambda: lf.barrier(pa, pb, data, lambdas=args.lambdas, align=al), save)
    rec["barrier"] = {"pair": args.barrier_pair, "lambdas": args.lambdas, "tokens": res.streamed["tokens"],
                      "seq_len": args.seq_len, "barrier": res.barrier, "loss": [float(v) for v in res.loss],
                      "bytes_read": res.streamed["bytes_read"], "ranks": res.streamed["ranks"]}
    # this rank's seconds by part (per rank in rank_phases): the cost of a pass against that of its K mixtures
    ph["barrier"].update(parts=res.streamed["seconds"], groups=res.streamed["groups"],
                         aligned_here=res.streamed["aligned_here"], planned_bytes=res.streamed["planned_bytes"])
    save()
    if rank == 0:
        print(f"barrier ({args.barrier_pair}): {res.barrier:.4g} over {args.lambdas} lambdas on "
              f"{res.streamed['tokens']} tokens", flush=True)


def _planted_phase(lf, pa, twin, arch, args, ph, rec, save, rank, world):
    """B' = g . A written streaming and matched against A: g^-1 must come back (permutations exactly)."""
    from lmc_fast.stream.paths import apply_to_path
    from lmc_fast.symmetry import Alignment, canonical_spec

    truth = Alignment.random(canonical_spec(arch), seed=7)
    if rank == 0:
        shutil.rmtree(twin, ignore_errors=True)  # the bench's own folder: a twin from an earlier run
        phase(ph, "plant", lambda: apply_to_path(truth, pa, twin), save)
    _sync(world)
    found = phase(ph, "match_planted", lambda: _match(lf, pa, twin, args), save)
    inv = truth.inverse()
    rec["planted"] = {
        "permutations_exact": all(torch.equal(found[n][k], inv[n][k]) for n in inv.elements
                                  for k in inv[n] if not inv[n][k].is_floating_point()),
        "max_map_error": max(float((found[n][k].double() - inv[n][k].double()).abs().max())
                             for n in inv.elements for k in inv[n] if inv[n][k].is_floating_point())}
    save()
    if rank == 0:
        print(f"planted: {rec['planted']}", flush=True)
    return found


def _summary(rec: dict, args, out: Path, world: int) -> None:
    ph = rec["phases"]
    if "match" not in ph:
        print(f"{args.preset}: " + "; ".join(f"{k} {p['seconds']:.0f} s, peak {p['peak_rss_bytes'] / 2**30:.2f} GiB"
                                             for k, p in ph.items()) + f" -> {out}")
        return
    m, mr = ph["match"], rec["match"]
    for k, r in mr["gemms"].items():
        print(f"  GEMMs, {k:11s}: {r['gflop']:8.0f} GFLOP in {r['seconds']:7.1f} s = {r['gflops']:5.1f} GFLOP/s, "
              f"{r['fraction_of_peak']:.0%} of peak, {r['share_of_match_seconds']:.0%} of the match's seconds")
    writes = "".join(f", {k} {ph[k]['seconds']:.0f} s" for k in ("apply", "merge") if k in ph)
    print(f"{args.preset}: match {m['seconds']:.0f} s ({mr['sweeps']} sweeps + {mr['polish_iterations']} polish, "
          f"{world} rank(s)), peak RSS {rec['peak_rss_bytes'] / 2**30:.2f} GiB per process over all phases; GEMMs at "
          f"{mr['gemm_fraction_of_peak']:.0%} of {world} x {mr['matmul_peak_gflops']:.0f} GFLOP/s{writes} -> {out}")


def join_ranks(ranks: list) -> dict:
    """Every rank's (phases, match) joined: `phases` has each phase's slowest rank (seconds) and highest peak
    RSS (a phase that ran on one rank only, as is); `peak_rss_bytes` is the largest process of the run."""
    joined = {}
    for phases, _ in ranks:
        for name, p in phases.items():
            j = joined.setdefault(name, dict(p))
            j["seconds"] = max(j["seconds"], p["seconds"])
            j["peak_rss_bytes"] = max(j["peak_rss_bytes"], p["peak_rss_bytes"])
    out = {"phases": joined,
           "peak_rss_bytes": max(p["peak_rss_bytes"] for k, p in joined.items() if not k.startswith("generate"))}
    if len(ranks) > 1:
        out["rank_phases"] = [ph for ph, _ in ranks]
        out["rank_match"] = [m for _, m in ranks]  # each rank's GEMMs: its own share of the sweeps
    return out


def _joined(rec: dict, world: int) -> dict:
    """Rank 0's record with every rank's phases and GEMM figures (join_ranks)."""
    own = (rec["phases"], rec.get("match"))
    ranks = [own]
    if world > 1:
        import torch.distributed as dist

        ranks = [None] * world
        dist.all_gather_object(ranks, own)  # our own ranks' dicts of numbers
    return {**rec, **join_ranks(ranks)}


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
                    # the sweeps' flops split over the ranks, each on a core of its own
                    "gemm_fraction_of_peak": gflop * sweeps / ph["match"]["seconds"] / (peak * rec["ranks"]),
                    "gemms": meter.record(peak, ph["match"]["seconds"])}
    return al


def _match(lf, pa, pb, args):
    """What lf.align(pa, pb, "weight", dtype=torch.float32) runs, with the sweep counts of the in-memory bench."""
    from lmc_fast.match.streamed import align_streamed

    return align_streamed(pa, pb, "canonical", dtype=torch.float32, max_iter=args.max_iter,
                          polish_iter=args.polish_iter)


if __name__ == "__main__":
    main()
