"""Checkpoints of the learned-matching loop (match/learned.py), so a killed run resumes exactly.

One safetensors file, written atomically: the tensors (latents, the projections' warm-start
prices, Adam's moments, generator states, the best hard elements so far) as named tensors, the
rest (step, early-stopping counter, best value and step, history, Adam's and the scheduler's
plain values, and the key of the inputs) as JSON in the file's metadata. No pickle anywhere.

A checkpoint is only resumed by a run with the same key: a hash of the models' parameters, the
initial latents, every training and validation batch and the loop's options. Any other run
warns once and starts afresh (its own checkpoints then replace the file).
"""
from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

import torch

FORMAT = "lmc_fast.learned_checkpoint/1"
_META = "lmc_fast"


def _hash_tensor(digest, name: str, t: torch.Tensor) -> None:
    t = t.detach().to("cpu").contiguous()
    digest.update(f"{name}:{t.dtype}:{tuple(t.shape)};".encode())
    digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")


def input_key(module, train, val, options: dict) -> str:
    """Hex SHA-256 of what decides the loop's result: parameters, initial latents, data, options."""
    digest = hashlib.sha256()
    for n, params in enumerate(module.params_list):
        for name in sorted(params):
            _hash_tensor(digest, f"model{n}.{name}", params[name])
    for name, t in sorted(module.state_dict().items()):
        _hash_tensor(digest, f"latent.{name}", t)
    digest.update(json.dumps({n: p.requires_grad for n, p in module.named_parameters()}, sort_keys=True).encode())
    for split, batches in (("train", train), ("val", val)):
        for i, (x, y) in enumerate(batches):
            _hash_tensor(digest, f"{split}{i}.x", x)
            _hash_tensor(digest, f"{split}{i}.y", y)
    digest.update(json.dumps(options, sort_keys=True, default=repr).encode())
    return digest.hexdigest()


class _Packer:
    """Tensors -> unique names (and back): JSON holds the names where the tensors were."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}

    def put(self, t: torch.Tensor) -> dict:
        name = f"t{len(self.tensors)}"
        self.tensors[name] = t.detach().to("cpu").contiguous().clone()
        return {"tensor": name}

    def pack(self, obj):
        """Nested dicts/lists of tensors and plain values -> JSON with tensor references."""
        if isinstance(obj, torch.Tensor):
            return self.put(obj)
        if isinstance(obj, dict):
            return {"dict": [[self.pack(k), self.pack(v)] for k, v in obj.items()]}
        if isinstance(obj, (list, tuple)):
            return {"list" if isinstance(obj, list) else "tuple": [self.pack(v) for v in obj]}
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return {"value": obj}
        raise TypeError(f"cannot checkpoint a {type(obj).__name__}")


def _unpack(obj, tensors: dict, device=None):
    if "tensor" in obj:
        t = tensors[obj["tensor"]]
        return t if device is None else t.to(device)
    if "dict" in obj:
        return {_unpack(k, tensors, device): _unpack(v, tensors, device) for k, v in obj["dict"]}
    if "list" in obj:
        return [_unpack(v, tensors, device) for v in obj["list"]]
    if "tuple" in obj:
        return tuple(_unpack(v, tensors, device) for v in obj["tuple"])
    return obj["value"]


def _warm_states(module) -> list:
    """The projections' warm-start prices: they pick among tied assignments, so they are state too."""
    return [{"mlp": lat._warm_mlp, "heads": lat._warm_heads} for lat in module.latents]


def save(path, key: str, module, opt, sched, gen: torch.Generator, loop: dict) -> None:
    """Write the loop's full state to `path` (atomically: a kill leaves the previous checkpoint)."""
    from safetensors.torch import save_file

    from ..atomic import atomic_file

    packer = _Packer()
    state = {
        "latents": module.state_dict(),
        "warm": _warm_states(module),
        "adam": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "generator": gen.get_state(),
        "torch_rng": torch.get_rng_state(),
        "loop": loop,
    }
    meta = {"format": FORMAT, "key": key, "state": packer.pack(state)}
    with atomic_file(Path(path), ".safetensors") as tmp:
        save_file(packer.tensors, str(tmp), metadata={_META: json.dumps(meta, allow_nan=True)})


def load(path, key: str, module, opt, sched, gen: torch.Generator) -> dict | None:
    """Restore the state saved at `path` into module, opt, sched and gen and return the loop's
    values; None (after one warning) if there is no usable checkpoint for these inputs."""
    from safetensors import safe_open

    path = Path(path)
    if not path.exists():
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = json.loads((f.metadata() or {})[_META])
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        if meta.get("format") != FORMAT:
            raise ValueError(f"format {meta.get('format')!r}")
    except Exception as exc:  # noqa: BLE001 - any unreadable file: start afresh, say why
        warnings.warn(f"{path}: not a learned-matching checkpoint ({exc}); starting afresh", stacklevel=3)
        return None
    if meta["key"] != key:
        warnings.warn(f"{path}: checkpoint made for other inputs (models, data or options); starting afresh",
                      stacklevel=3)
        return None
    device = next(iter(module.state_dict().values())).device
    state = _unpack(meta["state"], tensors)
    module.load_state_dict(state["latents"], strict=False)
    for lat, warm in zip(module.latents, state["warm"]):
        for mine, saved in ((lat._warm_mlp, warm["mlp"]), (lat._warm_heads, warm["heads"])):
            mine.clear()
            mine.update({k: v.to(device) for k, v in saved.items()})
    opt.load_state_dict(state["adam"])
    sched.load_state_dict(state["scheduler"])
    gen.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    loop = state["loop"]
    loop["best"] = (loop["best"][0], loop["best"][1],
                    [{g: {k: v.to(device) for k, v in el.items()} for g, el in hard.items()} for hard in loop["best"][2]])
    return loop


__all__ = ["input_key", "load", "save"]
