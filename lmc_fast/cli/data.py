"""--data specs: the files they read, the datasets they load, and batches of them for models."""
from __future__ import annotations

from pathlib import Path

from .args import DATA_HELP
from .console import CLIError


def split_spec(spec: str):
    name, _, arg = spec.partition(":")
    return name.strip().lower(), (arg or None)


def data_paths(spec: str | None) -> list[Path]:
    """The file or folder a --data spec reads (text:PATH, mnist:DIR, ...), as an input."""
    if not spec:
        return []
    _, arg = split_spec(spec)
    return [Path(arg)] if arg else []


def load_data(spec: str, block_size: int = 64, limit: int | None = None):
    """(train dataset, test dataset) for a --data spec."""
    from .. import data as D

    name, arg = split_spec(spec)
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
    """A token model's context, as its adapter reads it from whatever its config calls it (None for images)."""
    from ..models.adapters import adapter_for

    return adapter_for(model).shape_fields(model).get("context")


def _data_spec(args, models) -> str:
    if getattr(args, "data", None):
        return args.data
    for m in models:
        spec = getattr(m, "lmc_fast_metadata", {}).get("data")
        if spec:
            return spec
    raise CLIError("--data is required (the checkpoints do not record the data they were trained on)")


def _is_text(spec: str) -> bool:
    return split_spec(spec)[0] in ("text", "shakespeare")


def _check_block_size(block: int, models, paths):
    """A block longer than a language model's context cannot be evaluated: say so up front."""
    for model, path in zip(models, paths):
        context = _context(model)
        if context is not None and is_text_model(model) and block > context:
            raise CLIError(f"--block-size {block}: longer than the context of {path} ({context} positions)")


def model_data(args, models, paths=None):
    """(spec, train dataset, test dataset) fitting `models` (block size from a GPT-2's context)."""
    spec = _data_spec(args, models)
    block = None
    if _is_text(spec):
        meta_block = getattr(models[0], "lmc_fast_metadata", {}).get("block_size")
        block = args.block_size or meta_block or min(64, _context(models[0]) or 64)
        _check_block_size(block, models, paths or [f"model {i}" for i in range(len(models))])
    train, test = load_data(spec, block or 64)
    from ..data.masked import for_task
    from ..models.adapters import adapter_for
    from ..sweep.metrics import task_of

    task = task_of(adapter_for(models[0]).arch(models[0]))
    train, test = for_task(train, task), for_task(test, task)  # masked-token models read masked blocks
    vocab = getattr(getattr(models[0], "config", None), "vocab_size", None)
    if hasattr(train, "vocab_size") and vocab is not None and train.vocab_size > vocab:
        raise CLIError(f"--data {spec}: {train.vocab_size} token ids but the model's vocabulary has {vocab}")
    if not hasattr(train, "vocab_size") and is_text_model(models[0]):
        raise CLIError(f"--data {spec}: a language model needs text data (text:PATH or shakespeare)")
    if hasattr(train, "vocab_size") and not is_text_model(models[0]):
        raise CLIError(f"--data {spec}: an image model needs image data")
    return spec, train, test


def is_text_model(model) -> bool:
    from ..models.adapters import adapter_for

    return adapter_for(model).arch(model).inputs == "tokens"


def batches(dataset, batch_size: int, shuffle: bool, max_batches: int | None, device, seed: int = 0):
    from ..data import loader

    out = []
    for i, (x, y) in enumerate(loader(dataset, batch_size, shuffle=shuffle, seed=seed)):
        if max_batches is not None and i >= max_batches:
            break
        out.append((x.to(device), y.to(device)))
    return out
