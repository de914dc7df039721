"""`StreamedCheckpoint`: one of our checkpoints or a Hugging Face folder, validated in full (config,
names, shapes, dtypes: everything `load_model` checks before allocating), whose standard parameters are
read one at a time, or a block of rows at a time, and never kept.

Each read opens the weights file, maps it, copies the tensor out and unmaps it again, so the pages of the
file it touched leave the process's resident set with it: memory is one tensor, not the file.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..io import inspect_checkpoint
from ..models.adapters import adapter_for
from ..models.adapters.base import UnsupportedModelError
from ..numerics import all_finite
from ..paths import utf8_name
from ..symmetry.fingerprint import FINGERPRINT_CHARS


class StreamedCheckpoint:
    def __init__(self, path):
        self.path = Path(path)
        self.info = inspect_checkpoint(self.path)
        model = self.info.meta_model
        self.model = model  # on the meta device: the class, config and shapes, no data
        self.adapter = adapter_for(model)
        layout = self.adapter.layout(model)
        if layout is None:
            raise UnsupportedModelError(
                f"{self.path}: {type(model).__name__} cannot be streamed ({self.adapter.not_streamed}); load it whole: "
                "lmc_fast.io.load_model")
        self.arch = self.adapter.arch(model)
        self.layout = layout
        # standard shapes from the meta model: adapters map meta tensors like real ones, for free
        self.shapes = {k: tuple(v.shape) for k, v in self.adapter.get(model).items()}
        self.file_key = {}
        for name, src in layout.items():
            key = self.info.file_key.get(src.key, src.key)
            if key not in self.info.specs:
                raise CheckpointError(f"{self.path}: weights lack parameter {src.key!r}")
            self.file_key[name] = key
        self.dtype = _storage_dtype(self.info.specs)

    def __repr__(self):
        return f"StreamedCheckpoint({str(self.path)!r}, {type(self.model).__name__})"

    @property
    def names(self) -> list[str]:
        return list(self.layout)

    def numel(self) -> int:
        return sum(_prod(s) for s in self.shapes.values())

    def read(self, name: str, rows: tuple[int, int] | None = None, dtype=torch.float64) -> torch.Tensor:
        """Standard parameter `name` (or its rows start:stop) in `dtype`, checked finite."""
        key = self.file_key[name]
        file = self.info.homes[key]
        src = self.layout[name]
        sliced = rows is not None and src.make is None  # a made tensor's rows are not the stored tensor's rows
        try:
            with utf8_name(file) as fname:
                from safetensors import safe_open

                with safe_open(fname, framework="pt") as f:
                    t = f.get_slice(key)[rows[0]:rows[1]] if sliced else f.get_tensor(key)
        except Exception as exc:  # SafetensorError, OSError: the file changed or broke since it was checked
            raise CheckpointError(f"{file}: cannot read parameter {key!r} ({' '.join(str(exc).split())[:200]})") from None
        if src.make is not None:
            t = src.make(t).contiguous()
            if rows is not None:
                t = t[rows[0]:rows[1]]
        if not all_finite(t):
            raise CheckpointError(f"{file}: parameter {key!r} holds NaN or inf values")
        return t.to(dtype)

    def fingerprint(self, rows: int = 4096) -> str:
        """The same digest as `model_fingerprint` of the loaded model, computed a block of rows at a time."""
        digest = hashlib.sha256()
        for name in sorted(self.shapes):
            shape = self.shapes[name]
            digest.update(f"{name}:{shape};".encode())
            for start in range(0, max(shape[0], 1) if shape else 1, rows):
                part = self.read(name, (start, min(start + rows, shape[0])) if shape else None, torch.float32)
                digest.update(part.contiguous().numpy().tobytes())
                if not shape:
                    break
        return digest.hexdigest()[:FINGERPRINT_CHARS]


_DTYPES = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}


def _storage_dtype(specs: dict) -> torch.dtype:
    """The files' float dtype (float32 where they mix several)."""
    found = {_DTYPES[d] for _, d in specs.values() if d in _DTYPES}
    return found.pop() if len(found) == 1 else torch.float32


def _prod(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
