"""Model checkpoints: safetensors weights + a JSON config, and Hugging Face folders.

    from lmc_fast.io import save_model, load_model
    save_model(model, "runs/vit-seed0")                  # runs/vit-seed0/{model.safetensors, config.json}
    save_model(model, "vit-seed0.safetensors")           # + sibling vit-seed0.json
    model = load_model("runs/vit-seed0")                 # the reference ViT / GPT-2, eval mode
    hf = load_model("my-gpt2/")                          # a save_pretrained folder -> GPT2LMHeadModel
    save_model(hf_merged, "merged-gpt2/")                # written back with save_pretrained

Our format: the JSON config is `{"format": "lmc_fast.model/1", "model_type": "vit"|"gpt2"|"llama",
"config": <ViTConfig/GPT2Config/LlamaConfig.to_dict()>, "metadata": {...}, "write_id": ...}`; the same
JSON is also stored in the safetensors header, so a lone `.safetensors` file is self-describing. A
tied GPT-2 or Llama (`lm_head.weight is tok_embed.weight`) is stored once (safetensors refuses shared
tensors) and re-tied on load. Loading never unpickles anything: weights come from safetensors only.

Writes never lose data (`lmc_fast.atomic`): one atomic rename per file; writing into a folder
touches only the files the format owns (model.safetensors and config.json; for Hugging Face what
save_pretrained writes plus lmc_fast_meta.json), never the user's other files; concurrent writers
of one target take turns on a lock. The weights are renamed into place before the config, and a
`write_id` in both tells a load when a save was cut between the two. A save that fails midway (a
full disk, no permission) leaves the checkpoint as it was (`atomic.all_or_nothing`).

Loading validates before allocating: config fields are checked, the model is built on the meta
device and its parameter names, shapes and dtypes are compared with the safetensors headers,
and only then are tensors read. Every problem is one CheckpointError line naming the file and
the field or parameter.
"""
from __future__ import annotations

import contextlib
import json
import math
import re
import secrets
import warnings
from dataclasses import fields
from pathlib import Path
from typing import NamedTuple

import torch

from .atomic import (all_or_nothing, atomic_dir, atomic_file, commit, discard, finite_json, folder_for_write,
                     fsync_path, json_text, remove_stale_temps, signals_deferred, staged, temp_folder, write_json,
                     writing)
from .errors import CheckpointError, CheckpointNotFoundError
from .paths import utf8_name
from .models.adapters import HUGGING_FACE, REFERENCE, UnsupportedModelError, adapter_for, reference_model_type
from .numerics import all_finite

FORMAT = "lmc_fast.model/1"
WEIGHTS = "model.safetensors"
CONFIG = "config.json"
HF_META = "lmc_fast_meta.json"  # our metadata beside a Hugging Face folder (ignored by transformers)
HF_INDEX = "model.safetensors.index.json"
HF_GENERATION = "generation_config.json"
_HF_SHARD = re.compile(r"model-\d{5}-of-\d{5}\.safetensors")
# the model registry (models/adapters.py): our model_type -> (model, config); HF model_type -> class name
_CLASSES = {t: (model, config) for t, (model, config, _) in REFERENCE.items()}
_HF_CLASSES = {t: names for t, (names, _) in HUGGING_FACE.items()}
# HF config sizes checked before anything is built, declared by each adapter (its CONFIG_SIZES)
_HF_SIZES = {t: adapter.CONFIG_SIZES for t, (_, adapter) in HUGGING_FACE.items()}
_LOADABLE_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
_DTYPE_NAMES = {"F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2", "BOOL": "bool", "U8": "uint8", "I8": "int8",
                "I16": "int16", "I32": "int32", "I64": "int64", "U16": "uint16", "U32": "uint32", "U64": "uint64"}
MAX_JSON_BYTES = 16 * 2**20  # a config is a few KB; refuse anything past this before reading it
MAX_SIZE = 2**31 - 1  # no width, depth or vocabulary in a config is larger


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."



def _parse_json(text, where) -> dict:
    """A JSON object, or one CheckpointError line (bad syntax, too deep, too large, not an object)."""
    if len(text) > MAX_JSON_BYTES:
        raise CheckpointError(f"{where}: {len(text)} bytes of JSON, more than the {MAX_JSON_BYTES // 2**20} MiB "
                              f"a config may have")
    try:
        obj = json.loads(text)
    except RecursionError:
        raise CheckpointError(f"{where}: JSON nested too deeply to be a config") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, integers past the digit limit
        raise CheckpointError(f"{where}: not a readable JSON file ({_first_line(exc)})") from None
    if not isinstance(obj, dict):
        raise CheckpointError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def _read_json(path: Path) -> dict:
    try:
        if not path.is_file():
            raise CheckpointError(f"{path}: not a regular file")
        with open(path, "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)  # never more than the limit, whatever the file's size
    except OSError as exc:
        raise CheckpointError(f"{path}: not a readable JSON file ({exc.strerror or exc})") from None
    return _parse_json(data, path)



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
    kind = reference_model_type(model)
    if kind is not None:
        return kind
    adapter_for(model)  # raises UnsupportedModelError naming the class
    if type(model).__module__.startswith("diffusers"):
        raise UnsupportedModelError(f"cannot save {type(model).__name__}: diffusers models are mapped in memory only "
                                    "(save it with its own save_pretrained)")
    raise UnsupportedModelError(f"cannot save {type(model).__name__}")


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
        if not isinstance(obj["model_type"], str):  # a registry key: a list or a number would not even hash
            raise CheckpointError(f"{cfg}: config field model_type is {_short(obj['model_type'])}: must be a string")
        return "hf"
    if "_class_name" in obj:  # a diffusers folder: its loader is not transformers', whose config classes io.py checks
        raise UnsupportedModelError(f"{path}: a diffusers folder ({_short(obj['_class_name'])}) is not loaded from "
                                    "disk: load it with diffusers' from_pretrained and pass the model (mapped in "
                                    "memory only)")
    raise CheckpointError(f"{cfg}: neither an lmc_fast config (format) nor a Hugging Face config (model_type)")


def _header(model, metadata) -> dict:
    kind = _model_type(model)
    # write_id pairs config.json with the weights written in the same save (see _our_header)
    return finite_json({"format": FORMAT, "model_type": kind, "config": model.config.to_dict(),
                    "metadata": _jsonable(metadata or {}), "write_id": secrets.token_hex(8)})


def _jsonable(obj):
    return json.loads(json_text(obj, indent=None, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


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
    if getattr(model.config, "tie_word_embeddings", False):
        out.pop("lm_head.weight", None)
    return out


# ---------------------------------------------------------------- save
def save_model(model, path, metadata: dict | None = None) -> Path:
    """Write `model` to `path`; returns the path written. See the module docstring for the guarantees.

    Reference ViT/GPT-2: a folder (model.safetensors + config.json) or, when `path` ends in
    `.safetensors`, that file plus a sibling `.json`. Hugging Face models: a folder written
    with `save_pretrained` (safetensors), plus `lmc_fast_meta.json` when `metadata` is given.
    Other files in the folder are never touched.
    """
    path = Path(path)
    if is_hf_model(model):
        adapter_for(model)  # only the supported HF classes
        if path.suffix == ".safetensors":
            raise CheckpointError(f"{path}: a Hugging Face model is saved as a folder (save_pretrained), not a file")
        with all_or_nothing(path):  # a failed write (a full disk) leaves the folder as it was
            _save_hf(model, path, metadata)
        return path
    header = _header(model, metadata)
    tensors = _tensors_to_save(model)
    if path.suffix == ".safetensors":
        side = path.with_suffix(".json")
        with all_or_nothing(path), writing(path, side.name):
            _write_ours(path, side, tensors, header)
        return path
    with all_or_nothing(path), writing(path), folder_for_write(path):
        remove_stale_temps(path, [WEIGHTS, CONFIG])
        _write_ours(path / WEIGHTS, path / CONFIG, tensors, header)
    return path


def _write_ours(weights: Path, config: Path, tensors: dict, header: dict) -> None:
    """Both files written first, then renamed back to back (signals deferred). The weights go first:
    they describe themselves, so even a SIGKILL between the two renames leaves a loadable checkpoint."""
    from safetensors.torch import save_file

    with staged(weights) as (w_tmp, publish_weights), staged(config) as (c_tmp, publish_config):
        save_file(tensors, str(w_tmp), metadata={"lmc_fast": json.dumps(header, allow_nan=False)})
        c_tmp.write_text(json_text(header), encoding="utf-8")
        with signals_deferred():
            publish_weights()
            publish_config()


def _hf_publish_order(name: str) -> tuple:
    """Weights first and config.json last: a write cut in between leaves the new weights under the old config."""
    return (name != WEIGHTS and not _HF_SHARD.fullmatch(name), name == CONFIG, name)


def _save_hf(model, path: Path, metadata) -> None:
    with writing(path), folder_for_write(path), temp_folder(path) as (tmp, mode):
        with _hf_quiet():
            model.save_pretrained(tmp, safe_serialization=True)
        if metadata:
            (tmp / HF_META).write_text(json_text(_jsonable(metadata)), encoding="utf-8")
        written = sorted((p.name for p in tmp.iterdir() if p.is_file()), key=_hf_publish_order)
        with signals_deferred():
            for name in written:  # one rename per file: the user's other files in the folder stay
                commit(tmp / name, path / name, mode)
            _remove_stale_hf_files(path, set(written))
        fsync_path(path)


def _remove_stale_hf_files(path: Path, written: set) -> None:
    """Weight files, index and metadata of an earlier save that this one did not rewrite (ours by name only)."""
    for p in path.iterdir():
        ours = p.name in (WEIGHTS, HF_INDEX, HF_META) or _HF_SHARD.fullmatch(p.name)
        if ours and p.name not in written and p.is_file():
            discard(p)  # inside all_or_nothing: put back if the write fails after all


# ---------------------------------------------------------------- validation
def _check_size(where, name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CheckpointError(f"{where}: config field {name} must be a positive integer, got {_short(value)}")
    if value < 1:
        raise CheckpointError(f"{where}: config field {name} must be a positive integer, got {value}")
    if value > MAX_SIZE:
        raise CheckpointError(f"{where}: config field {name}={value} is absurdly large (limit {MAX_SIZE})")


def _check_field(where, name: str, value, annotation: str) -> None:
    """Our config fields by their annotation: sizes are positive ints, eps a finite number >= 0, ..."""
    if value is None and ("Optional" in annotation or "None" in annotation):
        return
    if "bool" in annotation:
        ok, want = isinstance(value, bool), "true or false"
    elif "int" in annotation:
        _check_size(where, name, value)
        return
    elif "float" in annotation:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0
        want = "a finite number >= 0"
    elif "str" in annotation:
        ok, want = isinstance(value, str), "a string"
    else:
        return
    if not ok:
        raise CheckpointError(f"{where}: config field {name} must be {want}, got {_short(value)}")


def _check_layer_count(where, field: str, declared: int, specs: dict, weights: Path) -> None:
    """A depth the weights cannot have is refused before a model that deep is built, even on meta:
    every layer has at least one tensor."""
    if declared > len(specs):
        raise CheckpointError(f"{where}: config field {field}={declared} but {weights.name} holds only "
                              f"{len(specs)} tensors")


def _meta_model(build, where, sizes: str = ""):
    """The model the config describes, built on the meta device: shapes without memory."""
    try:
        with torch.device("meta"):
            return build()
    except Exception as exc:  # whatever the constructors raise for a config they cannot build
        raise CheckpointError(f"{where}: cannot build the model its config describes{sizes}: "
                              f"{_first_line(exc)}") from None


def _shapes(model) -> dict:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _read_specs(path: Path):
    """(metadata, {name: (shape, dtype string)}) from a safetensors header; no tensor data is read."""
    from safetensors import safe_open

    if not path.is_file():
        raise CheckpointNotFoundError(f"{path}: weights file not found")
    try:
        with utf8_name(path) as name, safe_open(name, framework="pt") as f:
            meta = f.metadata() or {}
            specs = {}
            for k in f.keys():
                part = f.get_slice(k)
                specs[k] = (tuple(part.get_shape()), part.get_dtype())
    except Exception as exc:  # SafetensorError, OSError, header decoding errors
        raise CheckpointError(f"{path}: corrupt or unreadable safetensors file ({_first_line(exc)})") from None
    return meta, specs


def _plural(names: list) -> str:
    return f"{names[0]!r}" + (f" (+{len(names) - 1} more)" if len(names) > 1 else "")


def _check_dtypes(weights, specs: dict) -> None:
    for k, (_shape, dtype) in specs.items():
        if dtype not in _LOADABLE_DTYPES:
            raise CheckpointError(f"{weights}: parameter {k!r} has dtype {_DTYPE_NAMES.get(dtype, dtype)}; only "
                                  f"float16, bfloat16, float32 and float64 weights are loaded")


def _check_tensors(weights, specs: dict, expected: dict, optional=frozenset(), what="config", names=None,
                   ignore=()) -> None:
    """The file's tensor names and shapes against the model the config describes. `names` maps a file
    name to the model's name for it (transformers renames some); names matching `ignore` are skipped."""
    names = names or {k: k for k in specs}
    placed = {}  # model name -> file name
    for k, model_name in names.items():
        if model_name not in expected and any(p.search(model_name) for p in ignore):
            continue
        if model_name in placed:
            raise CheckpointError(f"{weights}: parameters {placed[model_name]!r} and {k!r} both load into "
                                  f"{model_name!r}")
        placed[model_name] = k
    missing = sorted(set(expected) - set(placed) - set(optional))
    if missing:
        raise CheckpointError(f"{weights}: missing parameter {_plural(missing)}")
    extra = sorted(k for m, k in placed.items() if m not in expected)
    if extra:
        raise CheckpointError(f"{weights}: unexpected parameter {_plural(extra)} for the {what}")
    for m, k in placed.items():
        if specs[k][0] != expected[m]:
            raise CheckpointError(f"{weights}: parameter {k!r} has shape {specs[k][0]}, the {what} needs {expected[m]}")


def _check_total(weights, specs: dict, expected: dict, optional, what) -> None:
    """When names cannot be matched: at least the amount of data must be what the config describes."""
    have = sum(math.prod(shape) for shape, _ in specs.values())
    need = sum(math.prod(shape) for k, shape in expected.items() if k not in optional)
    need_tied = need + sum(math.prod(expected[k]) for k in optional if k in expected)
    if have not in (need, need_tied):
        raise CheckpointError(f"{weights}: holds {have} weight values, the {what} describes {need}")


def _common_dtype(specs: dict) -> torch.dtype:
    dtypes = {_LOADABLE_DTYPES[d] for _, d in specs.values()}
    return dtypes.pop() if len(dtypes) == 1 else torch.float32


# ---------------------------------------------------------------- load: our format
def read_header(path) -> dict:
    """The JSON header (model_type, config, metadata) of one of our checkpoints, without loading weights."""
    path = Path(path)
    if checkpoint_kind(path) == "hf":
        meta = path / HF_META
        obj = _read_json(path / CONFIG)
        return {"format": "hf", "model_type": obj.get("model_type"), "config": obj,
                "metadata": _read_json(meta) if meta.is_file() else {}}
    weights = path / WEIGHTS if path.is_dir() else path
    meta = _read_specs(weights)[0] if weights.is_file() or not path.is_dir() else {}
    return _our_header(path, meta)[0]


def _embedded_header(meta: dict, weights: Path):
    if "lmc_fast" not in meta:
        return None
    return _check_header(_parse_json(meta["lmc_fast"], f"{weights} (lmc_fast header)"), weights)


def _our_header(path: Path, meta: dict):
    """(header, where it came from). A folder's config.json rules, unless it belongs to another save than
    its weights (a write cut between the two renames): then the weights' own header does."""
    weights = path / WEIGHTS if path.is_dir() else path
    embedded = _embedded_header(meta, weights)
    if path.is_dir():
        cfg = path / CONFIG
        header = _check_header(_read_json(cfg), cfg)
        if embedded is not None and "write_id" in embedded and header.get("write_id") != embedded["write_id"]:
            warnings.warn(f"{cfg} is from another save than {weights.name} (an interrupted write?); "
                          f"using the header stored in {weights.name}", stacklevel=3)
            return embedded, weights
        return header, cfg
    if embedded is not None:
        return embedded, path
    side = path.with_suffix(".json")
    if side.is_file():
        return _check_header(_read_json(side), side), side
    raise CheckpointError(f"{path}: no lmc_fast header and no sibling {side.name} naming the model type")


def _check_header(obj: dict, where: Path) -> dict:
    if not str(obj.get("format", "")).startswith("lmc_fast.model/"):
        raise CheckpointError(f"{where}: not an lmc_fast model config (format {_short(obj.get('format'))})")
    if not isinstance(obj.get("model_type"), str) or obj["model_type"] not in _CLASSES:
        raise CheckpointError(f"{where}: model_type must be one of {sorted(_CLASSES)}, "
                              f"got {_short(obj.get('model_type'))}")
    if not isinstance(obj.get("config"), dict):
        raise CheckpointError(f"{where}: missing 'config' object")
    return obj


def _our_config(header: dict, where):
    """(model class, config) after every field is checked; nothing is built yet."""
    cls, cfg_cls = _CLASSES[header["model_type"]]
    annotations = {f.name: str(f.type) for f in fields(cfg_cls)}
    unknown = sorted(set(header["config"]) - set(annotations))
    if unknown:
        raise CheckpointError(f"{where}: unknown {cfg_cls.__name__} fields {unknown}")
    for name, value in header["config"].items():
        _check_field(where, name, value, annotations[name])
    try:
        return cls, cfg_cls(**header["config"])
    except Exception as exc:  # the config's own checks (divisibility, choices, size limits)
        raise CheckpointError(f"{where}: invalid {cfg_cls.__name__}: {_first_line(exc)}") from None


class Inspected(NamedTuple):
    """A checkpoint checked in full against its config, nothing of its tensors read: the model built on
    the meta device, each tensor's (shape, dtype) and file, and the file name of each model key."""

    kind: str  # "lmc_fast" | "hf"
    path: Path
    meta_model: object
    specs: dict  # file key -> (shape, safetensors dtype string)
    homes: dict  # file key -> the weights file holding it
    file_key: dict  # model state-dict key -> file key (the same but where transformers renames)
    header: dict  # ours: the lmc_fast header; hf: config.json's object
    metadata: dict


def inspect_checkpoint(path) -> Inspected:
    """Every check `load_model` makes before it allocates, without reading a tensor: what a streamed
    reader needs to read one tensor at a time."""
    path = Path(path)
    return _inspect_hf(path) if checkpoint_kind(path) == "hf" else _inspect_ours(path)


def _inspect_ours(path: Path) -> Inspected:
    weights = path / WEIGHTS if path.is_dir() else path
    meta, specs = _read_specs(weights)
    header, where = _our_header(path, meta)
    cls, config = _our_config(header, where)
    _check_layer_count(where, "n_layer", config.n_layer, specs, weights)
    tied = bool(getattr(config, "tie_word_embeddings", False))  # lm_head stored once, re-tied on load
    _check_dtypes(weights, specs)
    sizes = ", ".join(f"{k}={v}" for k, v in config.to_dict().items() if type(v) is int)
    meta_model = _meta_model(lambda: cls(config), where, f" ({sizes})")
    _check_tensors(weights, specs, _shapes(meta_model), {"lm_head.weight"} if tied else set(),
                   what=f"{header['model_type']} config")
    return Inspected("lmc_fast", path, meta_model, specs, dict.fromkeys(specs, weights), {k: k for k in specs},
                     header, header.get("metadata", {}))


def _load_ours(path: Path):
    from safetensors import safe_open

    info = _inspect_ours(path)
    weights, specs, header = path / WEIGHTS if path.is_dir() else path, info.specs, info.header
    config = info.meta_model.config
    tied = bool(getattr(config, "tie_word_embeddings", False))
    model = type(info.meta_model)(config).to(_common_dtype(specs))  # sizes now match the file: allocating is safe
    target = model.state_dict()
    try:
        with utf8_name(weights) as name, safe_open(name, framework="pt") as f, torch.no_grad():
            for k in specs:
                t = f.get_tensor(k)
                if not all_finite(t):
                    raise CheckpointError(f"{weights}: parameter {k!r} holds NaN or inf values")
                if tied and k == "lm_head.weight":
                    head = t
                    continue
                target[k].copy_(t)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{weights}: corrupt or unreadable safetensors file ({_first_line(exc)})") from None
    if tied and "lm_head.weight" in specs and not torch.equal(head.to(model.tok_embed.weight.dtype),
                                                              model.tok_embed.weight):
        raise CheckpointError(f"{weights}: config ties the embeddings but lm_head.weight differs from tok_embed.weight")
    model.lmc_fast_metadata = header.get("metadata", {})
    return model


# ---------------------------------------------------------------- load: Hugging Face folders
def _hf_shards(path: Path) -> list:
    single = path / WEIGHTS
    index = path / HF_INDEX
    if single.is_file() or not index.is_file():
        shards = [single]
    else:
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: weight_map must map parameter names to file names")
        names = sorted(set(weight_map.values()))
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.safetensors", n)]
        if bad or not names:
            raise CheckpointError(f"{index}: weight_map must name .safetensors files in this folder, got "
                                  f"{_short(bad[0] if bad else None)}")
        shards = [path / n for n in names]
    missing = next((s for s in shards if not s.is_file()), None)
    if missing is not None:
        hint = " (pytorch_model.bin is never unpickled: re-save with save_pretrained(safe_serialization=True))" \
            if (path / "pytorch_model.bin").exists() else ""
        raise CheckpointNotFoundError(f"{missing}: weights file not found{hint}")
    return shards


def _hf_specs(shards: list) -> tuple[dict, dict]:
    """({file key: (shape, dtype)}, {file key: the shard holding it})."""
    specs, home = {}, {}
    for shard in shards:
        for k, spec in _read_specs(shard)[1].items():
            if k in specs:
                raise CheckpointError(f"{shard}: parameter {k!r} is also in {home[k].name}")
            specs[k], home[k] = spec, shard
    return specs, home


def _check_hf_sizes(cfg_obj: dict, config, where: Path) -> None:
    want = _HF_SIZES[cfg_obj["model_type"]]
    sizes, optional, (width, heads) = want.required, want.optional, want.divides
    for name in sizes + optional:
        value = getattr(config, name, None)
        if value is None and name in optional:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:  # ViT sizes may be pairs
            _check_size(where, name, v)
    w, h = getattr(config, width, None), getattr(config, heads, None)
    if w is not None and h is not None and w % h:
        raise CheckpointError(f"{where}: config field {width}={w} is not divisible by {heads}={h}")


def _hf_renamer(model):
    """transformers' own file-name -> model-name rules (v5 renames e.g. ViT's modules), as a function;
    None when they exist but cannot be applied here (or would also reshape tensors)."""
    prefix = f"{model.base_model_prefix}."
    state = model.state_dict()
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, rename_source_key
    except ImportError:  # transformers 4: names are the model's, up to the base-model prefix
        return lambda k: k if k in state or prefix + k not in state else prefix + k
    try:
        transforms = get_model_conversion_mapping(model)
    except Exception:
        return None
    if any(isinstance(t, WeightConverter) for t in transforms):
        return None
    return lambda k: rename_source_key(k, transforms, [], model.base_model_prefix, state)[0]


def _dropped_on_load(cls, model) -> list:
    """Patterns of the tensor names a class drops on load: its _keys_to_ignore_on_load_unexpected (e.g. the
    boolean attention-mask buffers in Pythia's files) and the model's non-persistent buffers, which older
    files stored (e.g. BERT's integer position_ids)."""
    ignore = [re.compile(p) for p in (getattr(cls, "_keys_to_ignore_on_load_unexpected", None) or ())]
    persistent = set(model.state_dict())
    return ignore + [re.compile(rf"(^|\.){re.escape(n)}$") for n, _ in model.named_buffers() if n not in persistent]


def _kept_on_load(specs: dict, ignore: list) -> dict:
    """The specs of the tensors the class loads (without those matching `ignore`, _dropped_on_load's)."""
    return {k: v for k, v in specs.items() if not any(p.search(k) for p in ignore)}


def _check_hf_tensors(weights, specs: dict, cls, model, config, what: str) -> dict:
    """The weight files' names, dtypes and shapes against the meta-built model, before anything is allocated.
    Returns {model key: file key} (empty where transformers' renaming cannot be applied here)."""
    expected = _shapes(model)
    tied = getattr(cls, "_tied_weights_keys", None) or ()
    optional = set(tied) if getattr(config, "tie_word_embeddings", False) else set()
    ignore = _dropped_on_load(cls, model)
    _check_dtypes(weights, _kept_on_load(specs, ignore))
    rename = _hf_renamer(model)
    try:
        names = {k: rename(k) for k in specs} if rename is not None else None
    except Exception:
        names = None
    if names is None:
        _check_total(weights, specs, expected, optional, what)
        return {}
    _check_tensors(weights, specs, expected, optional, what, names=names, ignore=ignore)
    return {m: k for k, m in names.items() if m in expected}


def _hf_class_name(cfg_obj: dict, names: tuple, where: Path) -> str:
    """The class a folder loads as: a model_type with one class loads as it; with several (BERT's masked LM and
    sequence classifier), the one its config's "architectures" names, else the first."""
    archs = cfg_obj.get("architectures")
    if len(names) == 1 or archs is None:
        return names[0]
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise CheckpointError(f"{where}: config field architectures is {_short(archs)}: must be a list of class names")
    if archs[0] not in names:
        raise UnsupportedModelError(f"{where}: architectures {archs[0]!r} is not supported for model_type "
                                    f"{cfg_obj['model_type']!r} (supported: {', '.join(names)})")
    return archs[0]


def _inspect_hf(path: Path) -> Inspected:
    cfg_path = path / CONFIG
    cfg_obj = _read_json(cfg_path)
    names = _HF_CLASSES.get(cfg_obj.get("model_type"))
    if names is None:
        supported = ", ".join(f"{k} ({v[0]})" for k, v in _HF_CLASSES.items())
        raise UnsupportedModelError(f"{path}: Hugging Face model_type {_short(cfg_obj.get('model_type'))} is not "
                                    f"supported (supported: {supported})")
    name = _hf_class_name(cfg_obj, names, cfg_path)
    for extra in (HF_GENERATION, HF_META):  # transformers would parse these unguarded
        if (path / extra).exists():
            _read_json(path / extra)
    shards = _hf_shards(path)
    specs, homes = _hf_specs(shards)
    with _hf_quiet() as transformers:
        cls = getattr(transformers, name)
        try:
            config = cls.config_class.from_dict(dict(cfg_obj))
        except Exception as exc:
            raise CheckpointError(f"{cfg_path}: invalid {cls.config_class.__name__}: {_first_line(exc)}") from None
    _check_hf_sizes(cfg_obj, config, cfg_path)
    layers = _HF_SIZES[cfg_obj["model_type"]].layers
    _check_layer_count(cfg_path, layers, getattr(config, layers), specs, shards[0])
    sizes, optional_sizes = _HF_SIZES[cfg_obj["model_type"]].required, _HF_SIZES[cfg_obj["model_type"]].optional
    named = ", ".join(f"{k}={getattr(config, k, None)}" for k in sizes + optional_sizes)
    with _hf_quiet():
        meta_model = _meta_model(lambda: cls(config), cfg_path, f" ({named})")
    weights = shards[0] if len(shards) == 1 else path / HF_INDEX
    file_key = _check_hf_tensors(weights, specs, cls, meta_model, config, f"{name} config")
    meta = path / HF_META
    return Inspected("hf", path, meta_model, specs, homes, file_key, cfg_obj,
                     _read_json(meta) if meta.is_file() else {})


def _load_hf(path: Path):
    info = _inspect_hf(path)
    cls, config, specs = type(info.meta_model), info.meta_model.config, info.specs
    name = cls.__name__
    try:
        # safetensors takes UTF-8 names only: a folder whose name is other bytes is read through a UTF-8 one
        with _hf_quiet() as transformers, utf8_name(path) as folder:
            model, loading = cls.from_pretrained(folder, config=config, local_files_only=True, use_safetensors=True,
                                                 output_loading_info=True,
                                                 **_dtype_kwarg(transformers,
                                                                _kept_on_load(specs, _dropped_on_load(cls, info.meta_model))))
    except Exception as exc:  # whatever transformers raises for a folder that passed the checks above
        raise CheckpointError(f"{path}: cannot load {name}: {_first_line(exc)}") from None
    _check_hf_loading_info(path, model, loading)
    model.lmc_fast_metadata = info.metadata
    return model


def _dtype_kwarg(transformers, specs: dict) -> dict:
    """Load in the files' dtype, never the one config.json claims (`dtype` since transformers 4.56)."""
    major, minor = (int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": _common_dtype(specs)}


def _check_hf_loading_info(path: Path, model, info: dict) -> None:
    """What from_pretrained reports (it warns and goes on): any key it could not place is an error."""
    tied = getattr(model.config, "tie_word_embeddings", False)
    missing = sorted(k for k in info.get("missing_keys", ()) if k != "lm_head.weight" or not tied)
    if missing:
        raise CheckpointError(f"{path}: weights lack parameter {_plural(missing)}")
    unexpected = sorted(info.get("unexpected_keys", ()))
    if unexpected:
        raise CheckpointError(f"{path}: unexpected parameter {_plural(unexpected)} for the config")
    mismatched = sorted(info.get("mismatched_keys", ()))
    if mismatched:
        raise CheckpointError(f"{path}: parameter {mismatched[0]!r} does not fit the config")
    for k, p in model.named_parameters():
        if not all_finite(p.detach()):
            raise CheckpointError(f"{path}: parameter {k!r} holds NaN or inf values")


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


__all__ = ["CheckpointError", "CheckpointNotFoundError", "Inspected", "atomic_dir", "atomic_file", "checkpoint_kind",
           "inspect_checkpoint",
           "is_hf_model", "load_model", "read_header", "save_model", "write_json"]
