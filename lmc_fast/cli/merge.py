"""`lmc-fast merge`: align several models, save aligned copies and their average."""
from __future__ import annotations

import time
from pathlib import Path

from ..method_names import ALIGN_METHODS, DATA_METHODS
from .args import add_command, data_options, finite_positive_float, positive_int, sample_count
from .console import CLIError, Console
from .data import batches, data_paths, model_data
from .models import load
from .outputs import Outputs, now


def register(subparsers, parents):
    m = add_command(subparsers, "merge", "align several models, save aligned copies and their average", parents)
    m.add_argument("models", nargs="+", help="checkpoints; the first is the reference")
    m.add_argument("--method", default="weight", choices=ALIGN_METHODS,
                   help="matching method")
    m.add_argument("--mode", choices=["mean", "reference"], default=None,
                   help="mean: MergeMany; reference: align all to the first (default: mean for weight / "
                        "permutation, reference for the data-driven methods)")
    m.add_argument("--rounds", type=positive_int, default=10, help="MergeMany: at most N rounds")
    m.add_argument("--samples", type=sample_count, default=32, help="Dirichlet samples of the simplex sweep")
    m.add_argument("--alpha", type=finite_positive_float, default=1.0, help="Dirichlet concentration")
    m.add_argument("--eval-batches", type=positive_int, default=None,
                   help="evaluate on at most N test batches (default: all)")
    m.add_argument("--stream", action="store_true",
                   help="weight / permutation / activation matching: stream the checkpoints a layer at a time and "
                        "write aligned_<i>/ and merged/ shard by shard (models of any size; the same alignments; no "
                        "evaluation, no simplex sweep)")
    m.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                   help="--stream: solve in this dtype (float32 for large models; the elements are snapped to exact "
                        "group elements in float64)")
    m.add_argument("--out", required=True,
                   help="output folder; merge writes only aligned_<i>/, alignment_<i>.safetensors, merged/, "
                        "merge.json and simplex.png in it")
    data_options(m, "training batch size for data-driven matching (default 64)")


def _merge_entries(out: Path, n: int) -> dict:
    """What `merge` writes inside --out (and nothing else there is touched)."""
    return {"aligned": [out / f"aligned_{i}" for i in range(n)],
            "alignments": [out / f"alignment_{i}.safetensors" for i in range(n)],
            "merged": out / "merged", "json": out / "merge.json", "simplex": out / "simplex.png"}


def run(args, con: Console) -> int:
    import lmc_fast as lf

    from ..io import save_model, write_json

    if len(args.models) < 2:
        raise CLIError("merge needs at least two models")
    n = len(args.models)
    out = Path(args.out)
    entries = _merge_entries(out, n)
    outputs = Outputs([*args.models, *data_paths(args.data)])
    outputs.into("--out", out)
    for path in entries["aligned"] + [entries["merged"]]:
        outputs.folder("--out", path)
    for path in entries["alignments"] + [entries["json"], entries["simplex"]]:
        outputs.file("--out", path)
    outputs.check()
    if args.stream:
        return _run_streamed(args, con, entries, outputs)
    if args.dtype != "float64":
        raise CLIError("--dtype is an option of --stream (models in memory are aligned in float64)")

    models = [load(p, args.device) for p in args.models]
    needs_data = args.method in DATA_METHODS
    mode = args.mode or ("reference" if needs_data else "mean")  # MergeMany's mean needs a data-free method
    spec = train_ds = test_ds = None
    if needs_data or args.data or any(getattr(m, "lmc_fast_metadata", {}).get("data") for m in models):
        spec, train_ds, test_ds = model_data(args, models, args.models)  # CLIError when data is needed but unknown
    kw = {}
    if needs_data:
        kw["data"] = batches(train_ds, args.batch_size or 64, True, args.max_batches, args.device)
    con.log(f"aligning {n} models ({args.method} matching, mode {mode})")
    t0 = time.perf_counter()
    aligned, alignments = lf.merge_many(models, args.method, mode=mode, rounds=args.rounds, return_alignments=True,
                                        seed=args.seed, progress=not args.quiet, **kw)
    align_seconds = time.perf_counter() - t0
    space = alignments[-1].spec.space
    merged = lf.interpolate(aligned, [1.0 / n] * n, space=space)
    result = {"kind": "merge", "models": list(args.models), "method": args.method, "mode": mode, "space": space,
              "rounds": alignments[-1].info.get("merge_rounds"),
              "data": spec, "align_seconds": align_seconds, "date": now()}
    if test_ds is not None:
        data = batches(test_ds, 256, False, args.eval_batches, "cpu")
        result["merged_eval"] = lf.evaluate(merged, data)
        result["model_eval"] = [lf.evaluate(m, data) for m in models]
        con.log(f"simplex sweep: {args.samples} Dirichlet({args.alpha}) samples")
        result["simplex"] = lf.simplex(aligned, data, n=args.samples, alpha=args.alpha, space=space, seed=args.seed,
                                       progress=not args.quiet)

    # Only merge's own entries are written, each atomically; everything else in --out stays. All of
    # them or none: a failed write (a full disk) removes the others and puts back what they replaced.
    with outputs.all_or_nothing():
        for i, (m, al) in enumerate(zip(aligned, alignments)):
            save_model(m, entries["aligned"][i], metadata={"source": args.models[i], "method": args.method,
                                                           "data": spec, **_block_meta(models[i])})
            al.save(entries["alignments"][i])
        save_model(merged, entries["merged"], metadata={"sources": args.models, "method": args.method, "data": spec,
                                                        "weights": [1.0 / n] * n, **_block_meta(models[0])})
        if "simplex" in result and n == 3:
            from ..plots import plot_simplex

            plot_simplex(result["simplex"], entries["simplex"], labels=[Path(p).name for p in args.models])
        write_json(entries["json"], result)  # last: its presence says the merge finished
    msg = f"merged {n} models ({args.method}, {mode}) in {align_seconds:.1f} s -> {entries['merged']}"
    if "merged_eval" in result:
        ev = result["merged_eval"]
        msg += (f"; merged test loss {ev['loss']:.4f} acc {ev['acc']:.4f} (models: "
                + ", ".join(f"{e['loss']:.4f}" for e in result["model_eval"]) + ")")
        msg += f"; simplex worst excess {result['simplex']['worst']['excess']:.4f}" if result["simplex"]["worst"] else ""
    con.out(msg)
    return 0


def _run_streamed(args, con: Console, entries: dict, outputs: Outputs) -> int:
    """merge --stream: the alignments of lf.merge_many on the checkpoint paths, outputs written shard by shard."""
    import torch

    import lmc_fast as lf

    from ..io import write_json
    from ..match.methods import method as method_entry
    from ..stream.paths import apply_to_path, merge_paths
    from .align import _meta_model

    entry = method_entry(args.method)
    if entry.stream is None:
        raise CLIError(f"--stream takes --method weight, permutation or activation, not {args.method}")
    needs_data = args.method in DATA_METHODS
    mode = args.mode or ("reference" if needs_data else "mean")
    if mode == "mean" and needs_data:
        raise CLIError(f"--mode mean needs a data-free method (weight or permutation), not {args.method}")
    if args.data and not needs_data:
        raise CLIError("--stream does not evaluate: drop --data (sweep the merged folder with lmc-fast sweep)")
    kw = {"dtype": getattr(torch, args.dtype)}
    data_spec = None
    if needs_data:  # the checkpoints' meta-device models (class, config, metadata) pick the data
        data_spec, train_ds, _ = model_data(args, [_meta_model(p) for p in args.models], args.models)
        kw["data"] = batches(train_ds, args.batch_size or 64, True, args.max_batches, "cpu")
    n = len(args.models)
    con.log(f"aligning {n} models ({args.method} matching, mode {mode}, streamed)")
    t0 = time.perf_counter()
    alignments = lf.merge_many(list(args.models), args.method, mode=mode, rounds=args.rounds, seed=args.seed,
                               progress=not args.quiet, **kw)
    align_seconds = time.perf_counter() - t0
    with outputs.all_or_nothing():  # as the in-memory merge: every output or none
        for i, (path, al) in enumerate(zip(args.models, alignments)):
            apply_to_path(al, path, entries["aligned"][i])
            al.save(entries["alignments"][i])
        merge_paths(args.models, entries["merged"], alignments)
        write_json(entries["json"], {"kind": "merge", "models": list(args.models), "method": args.method,
                                     "mode": mode, "space": alignments[0].spec.space, "streamed": True,
                                     "dtype": args.dtype, "data": data_spec,
                                     "rounds": alignments[-1].info.get("merge_rounds"),
                                     "align_seconds": align_seconds, "seconds": time.perf_counter() - t0,
                                     "date": now()})
    con.out(f"merged {n} models ({args.method}, {mode}, streamed) in {time.perf_counter() - t0:.1f} s "
            f"-> {entries['merged']}")
    return 0


def _block_meta(model) -> dict:
    block = getattr(model, "lmc_fast_metadata", {}).get("block_size")
    return {"block_size": block} if block else {}
