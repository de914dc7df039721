"""Data specs and augmentations by name, torch-free: the grammar the CLI's --data / --augment and a
grid spec's [data] / `augment` share.

    train, test = load_data("shakespeare", block_size=64)   # (train dataset, test dataset)
    data_paths("text:notes.txt")                             # [Path("notes.txt")]: the files a spec reads
    augmentation("mixup")                                    # lmc_fast.data.augment.Mixup(1.0)

Loading imports `lmc_fast.data` (and torch) only when called; the names import nothing. A bad spec
is a ValueError in one line.
"""
from __future__ import annotations

from pathlib import Path

DATA_HELP = "digits | fashion-mnist[:DIR] | mnist:DIR | cifar10:DIR | text:PATH | shakespeare[:TARBALL]"

#: augmentation names -> (class in lmc_fast.data.augment, its argument); "auto" is learned matching's own
#: choice (Mixup for images with the end-model target, nothing otherwise)
AUGMENTATIONS = {"auto": "auto", "none": None, "mixup": ("Mixup", 1.0), "shift": ("RandomShift", 1),
                 "noise": ("GaussianNoise", 0.1)}


#: the augmentations whose blends the labels no longer describe (their class says `label_preserving = False`;
#: tests/test_hostile_options.py checks the two agree): refused with target "labels" before any work
LABEL_CHANGING = frozenset({"mixup"})


def check_augment_target(augment: str | None, target: str | None, where: str = "augment") -> None:
    """One line when an augmentation that blends labels away is asked for with target "labels"."""
    if augment in LABEL_CHANGING and target == "labels":
        raise ValueError(f"{where}={augment!r} changes what the labels describe; use target 'endpoints' with it")


def split_spec(spec: str):
    name, _, arg = spec.partition(":")
    return name.strip().lower(), (arg or None)


def is_text_spec(spec: str) -> bool:
    """Whether the spec reads text (blocks of tokens for language models)."""
    return split_spec(spec)[0] in ("text", "shakespeare")


#: tokens per block of text when nothing says otherwise (nor a model's shorter context)
DEFAULT_BLOCK_SIZE = 64


def block_size_for(given: int | None, recorded: int | None, contexts, where: str = "--block-size") -> int:
    """The block size of text data read for language models: `given` (--block-size, a grid's
    data.block_size), else `recorded` (the block the first model was trained on, its checkpoint's
    metadata), else min(64, every model's context). A block longer than a model's context is refused
    in one line (`contexts`: (name, context or None) per model); so is a recorded one that is not a count."""
    if recorded is not None and (isinstance(recorded, bool) or not isinstance(recorded, int) or recorded < 2):
        recorded = None  # metadata of another writer: not a block size (the default applies)
    known = [(name, c) for name, c in contexts if c is not None]
    block = given or recorded or min([DEFAULT_BLOCK_SIZE, *(c for _, c in known)])
    for name, context in known:
        if block > context:
            how = "" if given else " (the block size the first model was trained on)"
            raise ValueError(f"{where} {block}{how}: longer than the context of {name} ({context} positions)")
    return block


def data_paths(spec: str | None) -> list[Path]:
    """The file or folder a data spec reads (text:PATH, mnist:DIR, ...), as an input."""
    if not spec:
        return []
    _, arg = split_spec(spec)
    return [Path(arg)] if arg else []


def load_data(spec: str, block_size: int = 64, limit: int | None = None):
    """(train dataset, test dataset) for a data spec."""
    from . import data as D

    name, arg = split_spec(spec)
    if name == "digits":
        train, test = D.load_digits("train"), D.load_digits("test")
    elif name in ("fashion-mnist", "fashion_mnist", "fashion"):
        train, test = D.load_fashion_mnist("train", folder=arg, limit=limit), D.load_fashion_mnist("test", folder=arg)
    elif name == "mnist":
        train, test = D.load_mnist("train", folder=arg, limit=limit), D.load_mnist("test", folder=arg)
    elif name == "cifar10":
        if arg is None:
            raise ValueError("--data cifar10 needs the folder: cifar10:DIR (the extracted binary version)")
        train, test = D.load_cifar10("train", folder=arg), D.load_cifar10("test", folder=arg)
    elif name == "text":
        if arg is None:
            raise ValueError("--data text needs a file: text:PATH")
        if not Path(arg).is_file():
            raise ValueError(f"{arg}: no such text file")
        train, test = D.load_text(arg, block_size, split="train"), D.load_text(arg, block_size, split="test")
    elif name == "shakespeare":
        train, test = D.load_shakespeare(block_size, split="train", path=arg), D.load_shakespeare(block_size, split="test", path=arg)
    else:
        raise ValueError(f"unknown --data {spec!r}; use {DATA_HELP}")
    if limit is not None and len(train) > limit:
        train = train.subset(range(limit))
    return train, test


def augmentation(name: str):
    """An augmentation name -> an lmc_fast.data.augment object (None for "none", "auto" as it is)."""
    if name not in AUGMENTATIONS:
        raise ValueError(f"unknown augmentation {name!r}; one of {', '.join(AUGMENTATIONS)}")
    kind = AUGMENTATIONS[name]
    if kind is None or kind == "auto":
        return kind
    from .data import augment

    return getattr(augment, kind[0])(kind[1])


__all__ = ["AUGMENTATIONS", "DATA_HELP", "LABEL_CHANGING", "check_augment_target", "augmentation", "data_paths", "load_data", "split_spec"]
