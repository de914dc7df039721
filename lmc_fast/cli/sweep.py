"""`lmc-fast sweep`: loss/accuracy along the linear path A -> (aligned) B."""
from __future__ import annotations

from pathlib import Path

from .args import MAX_LAMBDAS, add_command, data_options, lambda_grid, lambda_value, model_pair, positive_int
from .console import CLIError, Console, one_line
from .data import batches, data_paths, model_data
from .models import load
from .outputs import Outputs, now


def register(subparsers, parents):
    s = add_command(subparsers, "sweep", "loss/accuracy along the linear path A -> (aligned) B", parents)
    model_pair(s)
    s.add_argument("--align", default=None, help="alignment file from `lmc-fast align`, applied to B (default: none)")
    s.add_argument("--force", action="store_true",
                   help="apply the alignment even if it was made for other models")
    s.add_argument("--space", choices=["canonical", "raw"], default=None,
                   help="interpolation space (default: the alignment's; raw without --align)")
    s.add_argument("--lambdas", type=lambda_value, nargs="+", default=[25],
                   help=f"a count (2 to {MAX_LAMBDAS}; default 25), several explicit values in [0, 1], or adaptive "
                        "(a coarse grid refined at the peak until it rises by less than 1e-3)")
    s.add_argument("--split", choices=["test", "train"], default="test", help="data split to evaluate on")
    s.add_argument("--engine", choices=["fused", "loop"], default="fused", help="sweep engine")
    s.add_argument("--max-tokens", type=positive_int, default=None,
                   help="tokens per fused pass (default: 8192 on CPU, 262144 on CUDA)")
    s.add_argument("--stream", action="store_true",
                   help="read A and B a layer at a time instead of loading them (checkpoints of any size; CPU; "
                        "every batch carried through together, so keep --max-batches small; adaptive: a pass per round)")
    s.add_argument("--name", default=None, help="label of this curve in the JSON/plot (default: the method)")
    s.add_argument("--out", required=True, help="result JSON")
    s.add_argument("--plot", default=None, help="also write a PNG of the curve (default: no plot)")
    data_options(s, "evaluation batch size (default 256)")


def _verify_alignment(al, a, b, args):
    """Refuse an alignment made for other models (unless --force); older files carry no fingerprint."""
    verify = getattr(al, "verify_models", None)
    if verify is None:
        return
    try:
        verify(a, b, force=args.force)
    except ValueError as exc:
        msg = one_line(exc)
        raise CLIError(f"--align {args.align}: {msg}" + ("" if "force" in msg else " (--force applies it anyway)")) from None


def run(args, con: Console) -> int:
    import lmc_fast as lf

    lambdas = lambda_grid(args.lambdas)
    outputs = Outputs([args.a, args.b, args.align, *data_paths(args.data)])
    outputs.file("--out", args.out)
    if args.plot:
        outputs.figure("--plot", args.plot)
    outputs.check()
    if args.stream:
        return _run_streamed(args, con, lambdas)
    a, b = load(args.a, args.device), load(args.b, args.device)
    space = args.space
    label = "none"
    if args.align:
        al = lf.Alignment.load(args.align)
        _verify_alignment(al, a, b, args)
        b = al.apply(b)
        space = space or al.spec.space
        label = al.info.get("method") or Path(args.align).stem
    space = space or "raw"
    spec, train_ds, test_ds = model_data(args, [a, b], [args.a, args.b])
    ds = test_ds if args.split == "test" else train_ds
    data = batches(ds, args.batch_size or 256, False, args.max_batches, "cpu")
    con.log(f"sweeping {len(data)} {args.split} batches of {spec}, space={space}")
    res = lf.barrier(a, b, data, lambdas=lambdas, space=space, engine=args.engine, max_tokens=args.max_tokens,
                     progress=not args.quiet)
    return _report(args, con, res, label, space, spec, data)


def _run_streamed(args, con: Console, lambdas) -> int:
    """sweep --stream: the checkpoints' meta-device models choose the data; the sweep reads them a layer at a time."""
    import lmc_fast as lf

    from ..stream.checkpoint import StreamedCheckpoint

    if args.device not in (None, "cpu"):
        raise CLIError("--stream runs on the CPU")
    cks = [StreamedCheckpoint(p) for p in (args.a, args.b)]
    for ck in cks:
        ck.model.lmc_fast_metadata = ck.info.metadata  # the data a checkpoint was trained on picks --data
    al, label, space = None, "none", args.space
    if args.align:
        al = lf.Alignment.load(args.align)
        recorded = al.info.get("fingerprint_b")
        if recorded is not None and not args.force and recorded != cks[1].fingerprint():
            raise CLIError(f"--align {args.align}: alignment was made for another model B (--force applies it anyway)")
        space = space or al.spec.space
        label = al.info.get("method") or Path(args.align).stem
    space = space or "raw"
    spec, train_ds, test_ds = model_data(args, [ck.model for ck in cks], [args.a, args.b])
    ds = test_ds if args.split == "test" else train_ds
    data = batches(ds, args.batch_size or 256, False, args.max_batches, "cpu")
    con.log(f"sweeping {len(data)} {args.split} batches of {spec}, space={space}, streamed")
    res = lf.barrier(args.a, args.b, data, lambdas=lambdas, space=space, align=al, progress=not args.quiet)
    return _report(args, con, res, label, space, spec, data)


def _report(args, con: Console, res, label: str, space: str, spec, data) -> int:
    from ..io import write_json

    name = args.name or label
    out = {"kind": "sweep", "a": args.a, "b": args.b, "align": args.align, "space": space, "data": spec,
           "split": args.split, "examples": sum(len(y) for _, y in data), "results": {name: res.to_dict()},
           "date": now()}
    write_json(args.out, out)
    mid = res.at(0.5)
    con.out(f"{name}: loss barrier {res.barrier:.4f}, acc barrier {res.acc_barrier:.4f}, "
            f"loss at 0.5 {mid['loss']:.4f}, acc at 0.5 {mid['acc']:.4f} ({res.seconds:.1f} s) -> {args.out}")
    if args.plot:
        from ..plots import plot_curves

        plot_curves(out["results"], args.plot, title=f"{Path(args.a).name} -> {Path(args.b).name} ({name}, {space})")
        con.out(f"plot -> {args.plot}")
    return 0
