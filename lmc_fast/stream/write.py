"""Checkpoints written tensor by tensor: an aligned or merged model streamed into a new folder, in the
input's format (ours: model.safetensors + config.json; Hugging Face: shards + index + config.json) and
storage dtype, never whole in memory.

Each safetensors file gets its header first (every shape is known before any work), then each tensor's
bytes at their offset, a row block at a time. Files are written in a private temp folder and renamed
into place one by one, the config last (lmc_fast.atomic): a cut write leaves the old checkpoint, or
nothing, never a mix; the folder's other files are never touched.
"""
from __future__ import annotations

import json
import math
import os
import secrets
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from ..atomic import commit, folder_for_write, fsync_path, json_text, signals_deferred, temp_folder, writing
from ..io import CONFIG, HF_INDEX, HF_META, WEIGHTS
from .checkpoint import StreamedCheckpoint

_NAMES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
#: the largest shard of a Hugging Face folder written here (split at tensor boundaries)
SHARD_BYTES = 2 * 2**30


class SafetensorsWriter:
    """One safetensors file: the header of every tensor up front, then rows written at their offsets."""

    def __init__(self, path: Path, entries: dict, metadata: dict | None = None):
        self.path, self.entries = path, entries  # key -> (shape, dtype)
        header, offset = {}, 0
        self.offsets = {}
        for key, (shape, dtype) in entries.items():
            size = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
            header[key] = {"dtype": _NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            self.offsets[key] = offset
            offset += size
        if metadata:
            header["__metadata__"] = metadata
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self.base = 8 + len(raw)
        self.size = self.base + offset
        self.written = dict.fromkeys(entries, 0)
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(self.fd, struct.pack("<Q", len(raw)) + raw)

    def write(self, key: str, rows: torch.Tensor, start: int = 0) -> None:
        shape, dtype = self.entries[key]
        rows = rows.detach().to(dtype).contiguous()
        row_bytes = math.prod(shape[1:]) * rows.element_size() if shape else 0
        data = rows.reshape(-1).view(torch.uint8).numpy().tobytes() if rows.numel() else b""
        pos = self.base + self.offsets[key] + start * row_bytes
        view = memoryview(data)
        while view:
            n = os.pwrite(self.fd, view, pos)
            view, pos = view[n:], pos + n
        self.written[key] += len(data)

    def close(self) -> None:
        try:
            missing = [k for k, (shape, dtype) in self.entries.items()
                       if self.written[k] != math.prod(shape) * torch.empty((), dtype=dtype).element_size()]
            if missing:
                raise RuntimeError(f"internal: {self.path.name}: {missing[0]!r} not written in full")
            os.fsync(self.fd)
        finally:
            os.close(self.fd)


@dataclass
class Template:
    """What a written checkpoint copies from its model: the format ("hf" | "lmc_fast"), the config file's
    JSON, the standard parameters' shapes, how each stored tensor is made from them (the adapter's
    `export`) and its shape, and the storage dtype."""

    kind: str
    header: dict
    shapes: dict
    export: dict
    file_shapes: dict
    dtype: torch.dtype
    tied: bool = False  # the model's config ties the head to the embedding (its files store it once)

    @classmethod
    def of(cls, ck: StreamedCheckpoint) -> "Template":
        return cls._make(ck.info.kind, ck.info.header, ck.adapter, ck.model, ck.shapes, ck.dtype)

    @classmethod
    def of_model(cls, model, dtype: torch.dtype) -> "Template":
        """A model's (built on the meta device, say: nothing of it is read but its config and shapes)."""
        from ..io import _header, is_hf_model
        from ..models.adapters import adapter_for

        adapter = adapter_for(model)
        if is_hf_model(model):
            header, kind = {**model.config.to_dict(), "architectures": [type(model).__name__]}, "hf"
        else:
            header, kind = _header(model, {}), "lmc_fast"
        shapes = {k: tuple(v.shape) for k, v in adapter.get(model).items()}
        return cls._make(kind, header, adapter, model, shapes, dtype)

    @classmethod
    def _make(cls, kind, header, adapter, model, shapes, dtype) -> "Template":
        export = adapter.export(model)
        if export is None:
            raise ValueError(f"{type(model).__name__} cannot be written a tensor at a time")
        state = model.state_dict()
        file_shapes = {k: tuple(state[k].shape) if k in state else shapes[e.names[0]] for k, e in export.items()}
        # the config object's value, not config.json's: a field left out there still ties by default
        tied = bool(getattr(model.config, "tie_word_embeddings", False))
        return cls(kind, header, shapes, export, file_shapes, dtype, tied)

    def untied(self) -> bool:
        """Whether the config ties the head to the embedding while the export writes a head of its own."""
        return self.tied and any(e.names == ("lm_head.weight",) for e in self.export.values())


def _config_files(template: Template, untie: bool, dtype: torch.dtype, metadata: dict) -> tuple:
    """(the config file's JSON, the metadata to store in the weights' header or None)."""
    header = json.loads(json.dumps(template.header))
    if template.kind == "hf":
        if untie or "tie_word_embeddings" in header:
            header["tie_word_embeddings"] = False if untie else header["tie_word_embeddings"]
        for field in ("torch_dtype", "dtype"):
            if field in header:
                header[field] = str(dtype).removeprefix("torch.")
        return header, None
    if untie and "tie_word_embeddings" in header["config"]:
        header["config"]["tie_word_embeddings"] = False
    header["metadata"] = {**header.get("metadata", {}), **metadata}
    header["write_id"] = secrets.token_hex(8)
    return header, {"lmc_fast": json.dumps(header, allow_nan=False)}


def write_checkpoint(out, template, produce, *, metadata: dict | None = None,
                     dtype: torch.dtype | None = None, shard_bytes: int | None = None) -> Path:
    """Write the checkpoint whose standard parameters `produce()` yields as ({name: rows}, {name: (start,
    stop)}) pieces (every row of every parameter exactly once), shaped and named like `template`, in its
    format and storage dtype (or `dtype`). Returns the folder."""
    out = Path(out)
    template = Template.of(template) if isinstance(template, StreamedCheckpoint) else template
    dtype = dtype or template.dtype
    entries = {key: (template.file_shapes[key], dtype) for key in template.export}
    by_first = {}  # a stored tensor is made once the piece holding its first parameter comes
    for key, e in template.export.items():
        by_first.setdefault(e.names[0], []).append(key)
    config, weights_meta = _config_files(template, template.untied(), dtype, metadata or {})
    hf = template.kind == "hf"
    files = _plan_shards(entries, shard_bytes or SHARD_BYTES) if hf else {WEIGHTS: list(entries)}
    with writing(out), folder_for_write(out), temp_folder(out) as (tmp, mode):
        writers = {name: SafetensorsWriter(tmp / name, {k: entries[k] for k in ks}, weights_meta)
                   for name, ks in files.items()}
        home = {k: w for w in writers.values() for k in w.entries}
        try:
            for part, rows in produce():
                for name in part:
                    for key in by_first.get(name, ()):
                        e = template.export[key]
                        if e.make is None:
                            home[key].write(key, part[name], rows.get(name, (0, 0))[0])
                        elif any(n in rows for n in e.names):
                            raise RuntimeError(f"internal: {key!r} is made from row blocks")
                        else:
                            home[key].write(key, e.make(*(part[n] for n in e.names)))
                del part, rows  # before the next piece is made, not after
        except BaseException:
            for w in writers.values():
                os.close(w.fd)  # the temp folder goes with its files
            raise
        for w in writers.values():
            w.close()
        if hf and len(files) > 1:
            index = {"metadata": {"total_size": sum(w.size - w.base for w in writers.values())},
                     "weight_map": {k: name for name, ks in files.items() for k in ks}}
            (tmp / HF_INDEX).write_text(json_text(index), encoding="utf-8")
        extra = [HF_INDEX] if hf and len(files) > 1 else []
        if hf and metadata:  # ours keep it in the weights' header; transformers ignores this file
            (tmp / HF_META).write_text(json_text(metadata), encoding="utf-8")
            extra.append(HF_META)
        (tmp / CONFIG).write_text(json_text(config), encoding="utf-8")
        written = [*files, *extra, CONFIG]  # weights first, config last
        with signals_deferred():
            for name in written:
                commit(tmp / name, out / name, mode)
            _remove_stale(out, set(written))
        fsync_path(out)
    return out


def _plan_shards(entries: dict, shard_bytes: int) -> dict:
    """{file name: keys}: tensors in order, a new shard whenever the next would pass `shard_bytes`."""
    shards, size = [[]], 0
    for key, (shape, dtype) in entries.items():
        n = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        if shards[-1] and size + n > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(key)
        size += n
    if len(shards) == 1:
        return {WEIGHTS: shards[0]}
    return {f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors": ks for i, ks in enumerate(shards)}


def _remove_stale(out: Path, written: set) -> None:
    """Weight files and an index of an earlier checkpoint in `out` that this one did not rewrite."""
    from ..atomic import discard
    from ..io import _HF_SHARD

    for p in out.iterdir():
        ours = p.name in (WEIGHTS, HF_INDEX) or _HF_SHARD.fullmatch(p.name)
        if ours and p.name not in written and p.is_file():
            discard(p)  # inside a caller's all_or_nothing block it comes back if the write fails
