"""`lmc-fast plane`: the loss landscape on the plane through three models, raw and aligned side by side."""
from __future__ import annotations

import math
from pathlib import Path

from ..method_names import ALIGN_METHODS, DATA_METHODS
from .args import add_command, data_options, positive_int
from .console import CLIError, Console
from .data import batches, data_paths, model_data
from .models import load
from .outputs import Outputs, now


def register(subparsers, parents):
    p = add_command(subparsers, "plane", "the loss on the plane through three models, raw and aligned", parents)
    p.add_argument("models", nargs="+", metavar="MODEL",
                   help="two models A B (the plane through A, B and B aligned onto A) or three A B C "
                        "(the plane through them, and the one through A and B, C aligned onto A)")
    p.add_argument("--method", default="weight", choices=ALIGN_METHODS, help="matching method for the aligned plane")
    p.add_argument("--n", type=positive_int, default=21, help="grid points per side (2 to 201; default 21)")
    p.add_argument("--margin", type=float, default=0.2,
                   help="grid beyond the models, as a fraction of their span (default 0.2)")
    p.add_argument("--split", choices=["test", "train"], default="test", help="data split to evaluate on")
    p.add_argument("--out", required=True, help="result JSON")
    p.add_argument("--plot", default=None, help="also write the contour plot (.png, .pdf or .svg; default: no plot)")
    data_options(p, "evaluation batch size (default 256)")


def run(args, con: Console) -> int:
    import lmc_fast as lf

    from ..io import write_json
    from ..match.methods import method as method_entry

    if len(args.models) not in (2, 3):
        raise CLIError(f"plane takes two or three models, got {len(args.models)}")
    if not 2 <= args.n <= 201:
        raise CLIError(f"--n must be in [2, 201], got {args.n}")
    if not (math.isfinite(args.margin) and args.margin >= 0):
        raise CLIError(f"--margin must be a finite number >= 0, got {args.margin}")
    outputs = Outputs([*args.models, *data_paths(args.data)])
    outputs.file("--out", args.out)
    if args.plot:
        outputs.figure("--plot", args.plot)
    outputs.check()
    models = [load(m, args.device) for m in args.models]
    spec, train_ds, test_ds = model_data(args, models, args.models)
    ds = test_ds if args.split == "test" else train_ds
    data = batches(ds, args.batch_size or 256, False, args.max_batches, "cpu")
    entry = method_entry(args.method)
    match = None
    if args.method in DATA_METHODS:
        match = batches(train_ds, args.batch_size or 64, True, args.max_batches, args.device)
    con.log(f"aligning with {args.method} matching")
    a, rest = models[0], models[1:]
    seeded = {"seed": args.seed} if entry.accepts("seed") else {}
    aligned = [lf.align(a, m, args.method, data=match, **seeded).apply(m) for m in rest]
    kw = dict(n=args.n, margin=args.margin, space=entry.space, progress=not args.quiet)
    names = [Path(m).name for m in args.models]
    planes = {}
    if len(models) == 2:
        con.log(f"plane through A, B and B aligned: {args.n} x {args.n} points over {len(data)} batches of {spec}")
        planes[f"A, B and B aligned ({args.method})"] = lf.plane([a, rest[0], aligned[0]], data, **kw)
        labels = [names[0], names[1], f"{names[1]} aligned"]
    else:
        con.log(f"planes raw and aligned: 2 x {args.n} x {args.n} points over {len(data)} batches of {spec}")
        planes["raw"] = lf.plane(models, data, **kw)
        planes[f"aligned ({args.method})"] = lf.plane([a, *aligned], data, **kw)
        labels = names
    out = {"kind": "plane", "models": list(args.models), "method": args.method, "space": entry.space, "data": spec,
           "split": args.split, "n": args.n, "labels": labels, "planes": planes, "date": now()}
    write_json(args.out, out)
    for name, p in planes.items():
        best = min(v for row in p["loss"] for v in row)
        at_models = ", ".join(f"{m['loss']:.4f}" for m in p["models"])
        con.out(f"{name}: loss at the models {at_models}, lowest on the grid {best:.4f} ({p['seconds']:.1f} s)")
    con.out(f"-> {args.out}")
    if args.plot:
        from ..plots import plot_plane

        plot_plane(out, args.plot)
        con.out(f"plot -> {args.plot}")
    return 0
