"""Model checkpoints: safetensors weights + a JSON config, and Hugging Face folders.

    from lmc_fast.io import save_model, load_model
    save_model(model, "runs/vit-seed0")                  # runs/vit-seed0/{model.safetensors, config.json}
    save_model(model, "vit-seed0.safetensors")           # + sibling vit-seed0.json
    model = load_model("runs/vit-seed0")                 # the reference ViT / GPT-2, eval mode
    hf = load_model("my-gpt2/")                          # a save_pretrained folder -> GPT2LMHeadModel
    save_model(hf_merged, "merged-gpt2/")                # written back with save_pretrained

Our format: the JSON config is `{"format": "lmc_fast.model/1", "model_type": "vit"|"gpt2",
"config": <ViTConfig/GPT2Config.to_dict()>, "metadata": {...}}`; the same JSON is also stored
in the safetensors header, so a lone `.safetensors` file is self-describing. A tied GPT-2
(`lm_head.weight is tok_embed.weight`) is stored once (safetensors refuses shared tensors)
and re-tied on load. Loading never unpickles anything: weights come from safetensors only.
Every write is atomic: files and folders are built under a temporary name next to the
target and renamed into place, so an error never leaves half-written output.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import fields
from pathlib import Path

import torch

from .models import GPT2, GPT2Config, ViT, ViTConfig
from .numerics import all_finite
from .models.adapters import UnsupportedModelError, adapter_for

FORMAT = "lmc_fast.model/1"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
HF_META = "lmc_fast_meta.json"  # our metadata beside a Hugging Face folder (ignored by transformers)
_CLASSES = {"vit": (ViT, ViTConfig), "gpt2": (GPT2, GPT2Config)}
_HF_CLASSES = {"gpt2": "GPT2LMHeadModel", "vit": "ViTForImageClassification"}


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not fit its model; the message names the file/parameter."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """The checkpoint path does not exist."""


# ---------------------------------------------------------------- atomic writes
@contextlib.contextmanager
def atomic_file(path, suffix: str = ""):
    """Yields a temporary path next to `path`; renamed onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=(suffix or path.suffix) + ".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_json(path, obj, **kw) -> Path:
    """JSON written atomically (indent 2 by default)."""
    kw.setdefault("indent", 2)
    with atomic_file(path) as tmp:
        tmp.write_text(json.dumps(obj, **kw) + "\n", encoding="utf-8")
    return Path(path)


@contextlib.contextmanager
def atomic_dir(path, overwrite: bool = True):
    """Yields an empty temporary folder; it replaces `path` only if the block succeeds.

    An existing `path` is replaced only when `overwrite` and it is a folder (it is moved aside
    first and deleted after the new one is in place)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise CheckpointError(f"{path} exists and is not a folder")
    if path.exists() and not overwrite:
        raise CheckpointError(f"{path} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        yield tmp
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".old"))
            os.replace(path, old / "x")
        os.replace(tmp, path)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


# ---------------------------------------------------------------- helpers
def is_hf_model(model) -> bool:
    return type(model).__module__.startswith("transformers")


@contextlib.contextmanager
def _hf_quiet():
    """transformers without its logging noise and progress bars (restored afterwards)."""
    import transformers
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield transformers
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def _model_type(model) -> str:
    if isinstance(model, ViT):
        return "vit"
    if isinstance(model, GPT2):
        return "gpt2"
    adapter_for(model)  # raises UnsupportedModelError naming the class
    raise UnsupportedModelError(f"cannot save {type(model).__name__}")


def _read_json(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return obj


def checkpoint_kind(path) -> str:
    """"lmc_fast" (our folder or .safetensors file) or "hf" (a save_pretrained folder)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"{path}: no such file or folder")
    if path.is_file():
        if path.suffix != ".safetensors":
            raise CheckpointError(f"{path}: not a checkpoint (expected a folder or a .safetensors file)")
        return "lmc_fast"
    cfg = path / CONFIG
    if not cfg.is_file():
        raise CheckpointError(f"{path}: folder has no {CONFIG} (not an lmc_fast or Hugging Face checkpoint)")
    obj = _read_json(cfg)
    if str(obj.get("format", "")).startswith("lmc_fast.model/"):
        return "lmc_fast"
    if "model_type" in obj:
        return "hf"
    raise CheckpointError(f"{cfg}: neither an lmc_fast config (format) nor a Hugging Face config (model_type)")


def _header(model, metadata) -> dict:
    kind = _model_type(model)
    return {"format": FORMAT, "model_type": kind, "config": model.config.to_dict(),
            "metadata": _jsonable(metadata or {})}


def _jsonable(obj):
    return json.loads(json.dumps(obj, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


def _tensors_to_save(model) -> dict:
    state = model.state_dict()
    out, seen = {}, {}
    for k, v in state.items():
        v = v.detach()
        ptr = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape)) if v.numel() else None
        if ptr is not None and ptr in seen:
            continue  # a shared (tied) tensor is stored once; the config re-ties it on load
        if ptr is not None:
            seen[ptr] = k
        out[k] = v.cpu().contiguous()
    if isinstance(model, GPT2) and model.config.tie_word_embeddings:
        out.pop("lm_head.weight", None)
    return out


# ---------------------------------------------------------------- save
def save_model(model, path, metadata: dict | None = None) -> Path:
    """Write `model` to `path` atomically; returns the path written.

    Reference ViT/GPT-2: a folder (model.safetensors + config.json) or, when `path` ends in
    `.safetensors`, that file plus a sibling `.json`. Hugging Face models: a folder written
    with `save_pretrained` (safetensors), plus `lmc_fast_meta.json` when `metadata` is given.
    """
    from safetensors.torch import save_file

    path = Path(path)
    if is_hf_model(model):
        adapter_for(model)  # only the supported HF classes
        if path.suffix == ".safetensors":
            raise CheckpointError(f"{path}: a Hugging Face model is saved as a folder (save_pretrained), not a file")
        with atomic_dir(path) as tmp, _hf_quiet():
            model.save_pretrained(tmp, safe_serialization=True)
            if metadata:
                (tmp / HF_META).write_text(json.dumps(_jsonable(metadata), indent=2) + "\n", encoding="utf-8")
        return path
    header = _header(model, metadata)
    tensors = _tensors_to_save(model)
    text = json.dumps(header, indent=2) + "\n"
    if path.suffix == ".safetensors":
        with atomic_file(path) as tmp:
            save_file(tensors, str(tmp), metadata={"lmc_fast": json.dumps(header)})
            write_json(path.with_suffix(".json"), header)
        return path
    with atomic_dir(path) as tmp:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"lmc_fast": json.dumps(header)})
        (tmp / CONFIG).write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- load
def _read_safetensors(path: Path):
    from safetensors import safe_open

    if not path.is_file():
        raise CheckpointNotFoundError(f"{path}: weights file not found")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as exc:  # SafetensorError, OSError, header decoding errors
        raise CheckpointError(f"{path}: corrupt or unreadable safetensors file ({exc})") from None
    return meta, tensors


def read_header(path) -> dict:
    """The JSON header (model_type, config, metadata) of one of our checkpoints, without loading weights."""
    path = Path(path)
    if checkpoint_kind(path) == "hf":
        meta = path / HF_META
        obj = _read_json(path / CONFIG)
        return {"format": "hf", "model_type": obj.get("model_type"), "config": obj,
                "metadata": _read_json(meta) if meta.is_file() else {}}
    if path.is_dir():
        return _check_header(_read_json(path / CONFIG), path / CONFIG)
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as exc:
        raise CheckpointError(f"{path}: corrupt or unreadable safetensors file ({exc})") from None
    return _header_from(meta, path)


def _header_from(meta: dict, path: Path) -> dict:
    if "lmc_fast" in meta:
        try:
            return _check_header(json.loads(meta["lmc_fast"]), path)
        except json.JSONDecodeError as exc:
            raise CheckpointError(f"{path}: corrupt lmc_fast header ({exc})") from None
    side = path.with_suffix(".json")
    if side.is_file():
        return _check_header(_read_json(side), side)
    raise CheckpointError(f"{path}: no lmc_fast header and no sibling {side.name} naming the model type")


def _check_header(obj: dict, where: Path) -> dict:
    if not str(obj.get("format", "")).startswith("lmc_fast.model/"):
        raise CheckpointError(f"{where}: not an lmc_fast model config (format {obj.get('format')!r})")
    if obj.get("model_type") not in _CLASSES:
        raise CheckpointError(f"{where}: model_type must be one of {sorted(_CLASSES)}, got {obj.get('model_type')!r}")
    if not isinstance(obj.get("config"), dict):
        raise CheckpointError(f"{where}: missing 'config' object")
    return obj


def _build(header: dict, where: Path):
    cls, cfg_cls = _CLASSES[header["model_type"]]
    known = {f.name for f in fields(cfg_cls)}
    unknown = set(header["config"]) - known
    if unknown:
        raise CheckpointError(f"{where}: unknown {cfg_cls.__name__} fields {sorted(unknown)}")
    try:
        config = cfg_cls(**header["config"])
        return cls(config)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{where}: invalid {cfg_cls.__name__}: {exc}") from None


def _load_ours(path: Path):
    weights = path / WEIGHTS if path.is_dir() else path
    meta, tensors = _read_safetensors(weights)
    header = _check_header(_read_json(path / CONFIG), path / CONFIG) if path.is_dir() else _header_from(meta, path)
    model = _build(header, path)
    expected = model.state_dict()
    tied = isinstance(model, GPT2) and model.config.tie_word_embeddings
    if tied and "lm_head.weight" in tensors:
        if not torch.equal(tensors["lm_head.weight"], tensors.get("tok_embed.weight", torch.empty(0))):
            raise CheckpointError(f"{weights}: config ties the embeddings but lm_head.weight differs from tok_embed.weight")
        tensors.pop("lm_head.weight")
    want = {k: v for k, v in expected.items() if not (tied and k == "lm_head.weight")}
    missing = sorted(set(want) - set(tensors))
    if missing:
        raise CheckpointError(f"{weights}: missing parameter {missing[0]!r}" + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
    extra = sorted(set(tensors) - set(want))
    if extra:
        raise CheckpointError(f"{weights}: unexpected parameter {extra[0]!r} for {header['model_type']} "
                              f"config" + (f" (+{len(extra) - 1} more)" if len(extra) > 1 else ""))
    dtypes = set()
    for k, t in tensors.items():
        if tuple(t.shape) != tuple(want[k].shape):
            raise CheckpointError(f"{weights}: parameter {k!r} has shape {tuple(t.shape)}, the config needs {tuple(want[k].shape)}")
        if not t.is_floating_point():
            raise CheckpointError(f"{weights}: parameter {k!r} has non-float dtype {t.dtype}")
        if not all_finite(t):
            raise CheckpointError(f"{weights}: parameter {k!r} holds NaN or inf values")
        dtypes.add(t.dtype)
    dtype = dtypes.pop() if len(dtypes) == 1 else torch.float32
    model = model.to(dtype)
    target = model.state_dict()  # after the cast: .to() replaced the parameter tensors
    with torch.no_grad():
        for k, t in tensors.items():
            target[k].copy_(t)
    if tied:
        model.lm_head.weight = model.tok_embed.weight
    model.lmc_fast_metadata = header.get("metadata", {})
    return model


def _load_hf(path: Path):
    cfg_obj = _read_json(path / CONFIG)
    name = _HF_CLASSES.get(cfg_obj.get("model_type"))
    if name is None:
        raise UnsupportedModelError(f"{path}: Hugging Face model_type {cfg_obj.get('model_type')!r} is not supported "
                                    f"(supported: {', '.join(f'{k} ({v})' for k, v in _HF_CLASSES.items())})")
    shards = [path / WEIGHTS]
    index = path / "model.safetensors.index.json"
    if not shards[0].is_file() and index.is_file():
        files = sorted(set(_read_json(index).get("weight_map", {}).values()))
        shards = [path / f for f in files]
    if not shards or not all(s.is_file() for s in shards):
        missing = next((s for s in shards if not s.is_file()), path / WEIGHTS)
        hint = " (pytorch_model.bin is never unpickled: re-save with save_pretrained(safe_serialization=True))" \
            if (path / "pytorch_model.bin").exists() else ""
        raise CheckpointNotFoundError(f"{missing}: weights file not found{hint}")
    for s in shards:  # validate every header first: a corrupt file gets a clear message
        _read_safetensors_header_only(s)
    try:
        with _hf_quiet() as transformers:
            cls = getattr(transformers, name)
            model, info = cls.from_pretrained(str(path), local_files_only=True, use_safetensors=True,
                                              output_loading_info=True)
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: cannot load {name}: {first}") from None
    missing = [k for k in info.get("missing_keys", []) if k != "lm_head.weight" or not model.config.tie_word_embeddings]
    if missing:
        raise CheckpointError(f"{path}: weights file lacks parameter {sorted(missing)[0]!r}"
                              + (f" (+{len(missing) - 1} more)" if len(missing) > 1 else ""))
    if info.get("mismatched_keys"):
        raise CheckpointError(f"{path}: parameter {info['mismatched_keys'][0]!r} does not fit the config")
    meta = path / HF_META
    model.lmc_fast_metadata = _read_json(meta) if meta.is_file() else {}
    return model


def _read_safetensors_header_only(path: Path):
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            for k in f.keys():
                f.get_slice(k).get_shape()
    except Exception as exc:
        raise CheckpointError(f"{path}: corrupt or unreadable safetensors file ({exc})") from None


def load_model(path, device=None, dtype=None):
    """Load a checkpoint (ours or a Hugging Face folder) in eval mode.

    Raises CheckpointNotFoundError / CheckpointError (both ValueError) naming the file or
    parameter, or UnsupportedModelError for a Hugging Face model type we cannot map.
    `model.lmc_fast_metadata` holds the metadata saved with it ({} if none)."""
    path = Path(path)
    kind = checkpoint_kind(path)
    model = _load_hf(path) if kind == "hf" else _load_ours(path)
    meta = getattr(model, "lmc_fast_metadata", {})
    if dtype is not None:
        model = model.to(dtype)
    if device is not None:
        model = model.to(device)
    model.lmc_fast_metadata = meta
    return model.eval()


__all__ = ["CheckpointError", "CheckpointNotFoundError", "atomic_dir", "atomic_file", "checkpoint_kind",
           "is_hf_model", "load_model", "read_header", "save_model", "write_json"]
