"""`lmc-fast align`: align model B onto model A; the alignment file and its JSON summary."""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..method_names import ALIGN_METHODS, DATA_METHODS
from .args import add_command, data_options, finite_positive_float, model_pair, positive_int
from ..data_specs import AUGMENTATIONS, augmentation
from .console import CLIError, Console
from .data import batches, data_paths, model_data
from .models import load
from .outputs import Outputs, now

PRESETS = ("default", "paper", "distill", "labels", "distill-loop", "labels-loop")  # as lmc_fast.match.learned.PRESET_NAMES (not imported: that loads torch)
LAMBDA_MODES = ("narrow", "uniform", "mixed", "fixed")  # as lmc_fast.match.options.LAMBDA_MODES (likewise)


def register(subparsers, parents):
    a = add_command(subparsers, "align", "align model B onto model A", parents)
    model_pair(a)
    a.add_argument("--method", default="weight", choices=ALIGN_METHODS,
                   help="matching method")
    a.add_argument("--preset", choices=PRESETS, default="default",
                   help="learned matching: the settings the options below leave unset: 'paper' (task loss, "
                        "lambda ~ U[0.4, 0.6], lr 3e-3), 'distill' (end-model targets, lambda ~ U[0, 1], "
                        "lr 1e-2), 'labels' (distill's settings with the task loss), 'distill-loop' and 'labels-loop' "
                        "(those with the paper authors' loop: one lambda a step, twice the steps, AdamW weight decay "
                        "0.01, 5%% warm-up, clip 1; distill-loop at lr 3e-2), or 'default': distill-loop when the "
                        "end models have memorised their training data (training loss < 0.05), else labels-loop")
    a.add_argument("--steps", type=positive_int, default=None,
                   help="learned matching: Adam steps (default: the preset's, 1000; 2000 for the -loop presets, "
                        "whose steps take one lambda each)")
    a.add_argument("--lr", type=finite_positive_float, default=None, help="learned matching: Adam learning rate (default: the preset's, paper 3e-3, distill-loop 3e-2, the others 1e-2)")
    a.add_argument("--lam", choices=LAMBDA_MODES, default=None,
                   help="learned matching: mixing weights per step, U[0.4, 0.6], U[0, 1], either of the two with "
                        "probability 1/2, or 0.5 (default: the preset's, "
                        "paper narrow, the others uniform)")
    a.add_argument("--target", choices=["labels", "endpoints"], default=None,
                   help="learned matching: fit the labels, or the same mixture of the end models' predictions "
                        "(default: the preset's: endpoints for distill and distill-loop, labels for the others)")
    a.add_argument("--temperature", type=finite_positive_float, default=1.0,
                   help="learned matching: softens --target endpoints")
    a.add_argument("--augment", choices=sorted(AUGMENTATIONS), default=None,
                   help="learned matching: input augmentation (mixup needs --target endpoints; images only; "
                        "auto: mixup for images with --target endpoints; default: none)")
    a.add_argument("--residual-only", action="store_true",
                   help="activation matching: the residual stream's rotation from its activations alone, every "
                        "other group by weight matching given it (cheap: no head or MLP statistics; default: off)")
    a.add_argument("--dtype", choices=["float64", "float32"], default="float64",
                   help="weight / permutation matching: the solvers' precision (float32 halves the memory; the "
                        "elements are snapped onto their groups in float64 after)")
    a.add_argument("--in-memory", action="store_true",
                   help="weight / permutation matching: load both models whole instead of streaming the checkpoints "
                        "a layer at a time (the default where the model class allows it; same result)")
    a.add_argument("--out", required=True, help="alignment file (.safetensors; a NAME.align.json summary beside it)")
    data_options(a, "training batch size for activation / learned matching (default 64)")


def align_summary_path(out) -> Path:
    """The JSON summary beside an alignment file: w.safetensors -> w.align.json (never w.json,
    the name a later `sweep --out w.json` would naturally take)."""
    out = Path(out)
    return out.with_name(out.stem + ".align.json")


def run(args, con: Console) -> int:
    import lmc_fast as lf

    from ..io import write_json

    out = Path(args.out)
    if args.residual_only and args.method != "activation":
        raise CLIError(f"--residual-only is an option of --method activation, not {args.method}")
    if out.suffix != ".safetensors":
        raise CLIError(f"--out must end in .safetensors, got {out}")
    from ..data_specs import check_augment_target

    try:
        check_augment_target(args.augment, args.target, "--augment")
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    summary = align_summary_path(out)
    outputs = Outputs([args.a, args.b, *data_paths(args.data)])
    outputs.file("--out", out)
    outputs.file("--out (its summary)", summary)
    outputs.check()
    from ..match.methods import method as method_entry

    entry = method_entry(args.method)
    kw = {}
    if args.dtype != "float64":
        if args.method not in ("weight", "permutation", "activation"):
            raise CLIError(f"--dtype is an option of --method weight, permutation and activation, not {args.method}")
        import torch

        kw["dtype"] = getattr(torch, args.dtype)
    streamed = entry.stream is not None and not args.in_memory and args.device in (None, "cpu") \
        and _streamable(args.a) and _streamable(args.b)
    if streamed:
        a, b = args.a, args.b  # lf.align streams checkpoint paths a layer at a time
    else:
        a, b = load(args.a, args.device), load(args.b, args.device)
    data_spec = None
    if args.method in DATA_METHODS:
        # streamed: the checkpoints' meta-device models (class, config, metadata) pick the data, as in sweep --stream
        models = [_meta_model(p) for p in (a, b)] if streamed else [a, b]
        data_spec, train_ds, _ = model_data(args, models, [args.a, args.b])
        kw["data"] = batches(train_ds, args.batch_size or 64, True, args.max_batches, args.device)
        if args.method == "activation":
            kw["max_batches"] = args.max_batches
            kw["residual_only"] = args.residual_only
        else:
            kw.update(preset=args.preset, steps=args.steps, lr=args.lr, lam=args.lam, target=args.target,
                      temperature=args.temperature)
            if args.augment is not None:
                kw["augment"] = augmentation(args.augment)
    con.log(f"aligning {args.b} onto {args.a} with {args.method} matching" + (" (streamed)" if streamed else ""))
    t0 = time.perf_counter()
    if entry.accepts("seed"):  # activation matching is deterministic: no seed
        kw["seed"] = args.seed
    al = lf.align(a, b, args.method, progress=not args.quiet, **kw)
    seconds = time.perf_counter() - t0
    info = {"kind": "align", "a": args.a, "b": args.b, "method": args.method, "data": data_spec,
            "space": al.spec.space, "seconds": seconds, "info": _jsonable(al.info), "alignment": str(out), "date": now()}
    with outputs.all_or_nothing():  # the alignment and its summary, or neither (a full disk: one line, exit 2)
        al.save(out)
        write_json(summary, info)
    con.out(f"{args.method} alignment ({al.spec.space} space) in {seconds:.2f} s -> {out} (summary {summary})")
    return 0


def _streamable(path) -> bool:
    """Whether the checkpoint can be read a tensor at a time (its class's standard parameters are stored
    tensors); a damaged one is left for the loader to report."""
    from ..models.adapters.base import UnsupportedModelError
    from ..stream.checkpoint import StreamedCheckpoint

    try:
        StreamedCheckpoint(path)
    except (UnsupportedModelError, ValueError):
        return False
    return True


def _meta_model(path):
    from ..stream.checkpoint import StreamedCheckpoint

    ck = StreamedCheckpoint(path)
    ck.model.lmc_fast_metadata = ck.info.metadata  # the data a checkpoint was trained on picks --data
    return ck.model


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))
