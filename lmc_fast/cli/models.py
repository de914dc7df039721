"""The models commands work on: loading checkpoints, and `train --config KEY=VALUE` overrides."""
from __future__ import annotations

import json
import math

from .console import CLIError, one_line


def load(path, device):
    from ..io import load_model

    return load_model(path, device=device)


#: --config keys the data decides (overriding them would make the model not fit its data)
CONFIG_FROM_DATA = {"vit": {"image_size": "the images", "channels": "the images", "num_classes": "the labels"},
                    "gpt2": {"vocab_size": "the text's token ids", "block_size": "--block-size"},
                    "llama": {"vocab_size": "the text's token ids", "block_size": "--block-size"},
                    "neox": {"vocab_size": "the text's token ids", "block_size": "--block-size"},
                    "bert": {"vocab_size": "the text's token ids", "block_size": "--block-size"}}


def _config_fields(model: str) -> dict:
    """{field name: type name} of the model's config dataclass."""
    import dataclasses

    from ..models.adapters import REFERENCE

    return {f.name: str(f.type) for f in dataclasses.fields(REFERENCE[model][1])}


def parse_overrides(items, model: str) -> dict:
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


def overridden(cls, cfg, overrides: dict, items):
    """The config with --config applied; a model is built once so a bad combination (width not
    divisible by heads, unknown norm) is reported now, naming --config, not after training starts."""
    import dataclasses

    try:
        cfg = dataclasses.replace(cfg, **overrides)
        cls(cfg)
    except (TypeError, ValueError, KeyError) as exc:
        raise CLIError(f"--config {' '.join(items)}: {one_line(exc)}") from None
    return cfg
