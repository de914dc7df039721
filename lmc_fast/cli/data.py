"""--data specs: the files they read, the datasets they load, and batches of them for models."""
from __future__ import annotations

from .. import data_specs
from ..data_specs import data_paths, split_spec  # noqa: F401  (the commands' imports)
from .console import CLIError


def load_data(spec: str, block_size: int = 64, limit: int | None = None):
    """(train dataset, test dataset) for a --data spec (lmc_fast.data_specs; a bad spec is a CLIError)."""
    try:
        return data_specs.load_data(spec, block_size, limit)
    except ValueError as exc:
        raise CLIError(str(exc)) from None


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


def model_data(args, models, paths=None):
    """(spec, train dataset, test dataset) fitting `models`: text in blocks of --block-size, else the
    first model's recorded block, else min(64, the models' context) (data_specs.block_size_for)."""
    spec = _data_spec(args, models)
    block = None
    if data_specs.is_text_spec(spec):
        names = paths or [f"model {i}" for i in range(len(models))]
        contexts = [(name, _context(m) if is_text_model(m) else None) for name, m in zip(names, models)]
        try:
            block = data_specs.block_size_for(args.block_size, getattr(models[0], "lmc_fast_metadata", {}).get(
                "block_size"), contexts)
        except ValueError as exc:
            raise CLIError(str(exc)) from None
    train, test = load_data(spec, block or data_specs.DEFAULT_BLOCK_SIZE)
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
