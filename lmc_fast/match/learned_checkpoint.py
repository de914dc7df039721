"""Checkpoints of the learned-matching loop (match/learned.py), so a killed run resumes exactly.

One safetensors file, written atomically: the tensors (latents, the projections' warm-start
prices, Adam's moments, generator states, the best hard elements so far) as named tensors, the
rest (step, early-stopping counter, best value and step, history, Adam's and the scheduler's
plain values, and the key of the inputs) as JSON in the file's metadata. No pickle anywhere.

A checkpoint is only resumed by a run with the same key: a hash of the models' parameters, the
initial latents, every training and validation batch and the loop's options. Any other run
warns once and starts afresh (its own checkpoints then replace the file), as does a run whose
checkpoint fails validation (`load`). A path holding anything else is refused before any work
(`check_path`): it is never overwritten.
"""
from __future__ import annotations

import hashlib
import json
import math
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


_KINDS = ("tensor", "dict", "list", "tuple", "value")


def _unpack(obj, tensors: dict, device=None):
    """The packed JSON back; a ValueError for anything `_Packer.pack` does not write."""
    if not isinstance(obj, dict) or len(obj) != 1 or next(iter(obj)) not in _KINDS:
        raise ValueError(f"not a packed value: {str(obj)[:60]}")
    kind, body = next(iter(obj.items()))
    if kind == "tensor":
        if not isinstance(body, str) or body not in tensors:
            raise ValueError(f"reference to a missing tensor {body!r}")
        t = tensors[body]
        return t if device is None else t.to(device)
    if kind == "value":
        if body is not None and not isinstance(body, (bool, int, float, str)):
            raise ValueError(f"not a plain value: {str(body)[:60]}")
        return body
    if not isinstance(body, list):
        raise ValueError(f"a packed {kind} must hold a list")
    if kind == "dict":
        if not all(isinstance(kv, list) and len(kv) == 2 for kv in body):
            raise ValueError("a packed dict must hold [key, value] pairs")
        return {_unpack(k, tensors, device): _unpack(v, tensors, device) for k, v in body}
    items = [_unpack(v, tensors, device) for v in body]
    return items if kind == "list" else tuple(items)


def _warm_latents(lat) -> dict:
    """Each warm-start dict of a `Latents` with the latent whose assignments it prices."""
    return lat.warm_parts()


def _warm_states(module) -> list:
    """The projections' warm-start prices: they pick among tied assignments, so they are state too."""
    return [{k: warm for k, (warm, _) in _warm_latents(lat).items()} for lat in module.all_latents()]


def check_path(path) -> None:
    """Before any work: `path` must be free, or hold a learned-matching checkpoint (which a run
    may replace); anything else there is refused, never overwritten."""
    from ..atomic import check_writable

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        check_writable(path, "checkpoint")
        return
    if not path.is_file():
        raise ValueError(f"checkpoint {path} exists and is not a file; refusing to overwrite it")
    try:
        _read(path)
    except ValueError as exc:
        raise ValueError(f"checkpoint {path} holds something other than a learned-matching checkpoint ({exc}); "
                         f"refusing to overwrite it: pass a new path or remove the file") from None
    check_writable(path, "checkpoint")


def _read(path: Path):
    """(metadata, tensors) of a learned-matching checkpoint; a ValueError for any other file."""
    from safetensors import safe_open

    from ..paths import utf8_name

    try:
        with utf8_name(path) as name, safe_open(name, framework="pt") as f:
            text = (f.metadata() or {}).get(_META)
            meta = json.loads(text) if isinstance(text, str) else None
            if not isinstance(meta, dict) or meta.get("format") != FORMAT:
                raise ValueError("no " + FORMAT + " metadata")
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - safetensors raises its own types for a damaged file
        raise ValueError(f"{type(exc).__name__}: {str(exc)[:120]}") from None
    if not isinstance(meta.get("key"), str) or "state" not in meta:
        raise ValueError("no key or state")
    return meta, tensors


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


# ---------------------------------------------------------------- validation of a saved state
def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


def _whole(v, lo: int, hi: int, what: str) -> int:
    _need(not isinstance(v, bool) and isinstance(v, int) and lo <= v <= hi, f"{what} {v!r} is not an int in [{lo}, {hi}]")
    return v


def _tensor_like(t, like: torch.Tensor, what: str, finite: bool = True) -> torch.Tensor:
    _need(isinstance(t, torch.Tensor), f"{what} is not a tensor")
    _need(t.dtype == like.dtype and t.shape == like.shape,
          f"{what} is {t.dtype} {tuple(t.shape)}, expected {like.dtype} {tuple(like.shape)}")
    _need(not finite or not t.is_floating_point() or bool(torch.isfinite(t).all()), f"{what} is not finite")
    return t


def _rng_state(t, like: torch.Generator, what: str) -> None:
    """A state `like` can take: its dtype and length, and content its set_state accepts (tried on a
    scratch generator, so a refusal comes here, before anything is restored, not as a RuntimeError after)."""
    _tensor_like(t, like.get_state(), what)
    try:
        torch.Generator(device=like.device).set_state(t)
    except RuntimeError as exc:
        raise ValueError(f"{what} is not one a generator can take ({' '.join(str(exc).split())})") from None


def _check_latents(module, saved) -> None:
    mine = module.state_dict()
    _need(isinstance(saved, dict) and set(saved) == set(mine), "latents of another layout")
    trained = {n for n, p in module.named_parameters() if p.requires_grad}
    for name, t in mine.items():
        _tensor_like(saved[name], t, f"latent {name}")
        if name not in trained:  # buffers and frozen latents never move from their start
            _need(torch.equal(saved[name], t.detach().cpu()), f"latent {name} is not trained, yet differs from its start")


def _check_warm(module, saved) -> None:
    _need(isinstance(saved, list) and len(saved) == len(module.all_latents()), "warm-start prices of another layout")
    for lat, warm in zip(module.all_latents(), saved):
        layout = _warm_latents(lat)
        _need(isinstance(warm, dict) and set(warm) == set(layout), "warm-start prices of another layout")
        for part, (_, latent) in layout.items():
            got = warm[part]
            _need(isinstance(got, dict) and set(got) <= ({"duals"} if latent is not None else set()),
                  f"warm-start prices {part} of another layout")
            if "duals" in got:
                _tensor_like(got["duals"], torch.empty(latent.shape[:-1], dtype=torch.float64), f"prices {part}")


def _check_adam(opt, params, saved, step: int) -> None:
    fresh = opt.state_dict()
    _need(isinstance(saved, dict) and set(saved) == {"state", "param_groups"}, "optimiser state of another layout")
    groups = saved["param_groups"]
    _need(isinstance(groups, list) and len(groups) == len(fresh["param_groups"]), "optimiser groups of another layout")
    for g, f in zip(groups, fresh["param_groups"]):
        _need(isinstance(g, dict) and set(g) == set(f), "optimiser group of another layout")
        for k in f:
            if k != "lr":  # the schedule moves lr (checked against it)
                _need(g[k] == f[k], f"optimiser setting {k} {g[k]!r} differs from this run's {f[k]!r}")
    state = saved["state"]
    _need(isinstance(state, dict) and set(state) <= set(range(len(params))), "optimiser state for unknown parameters")
    for i, st in state.items():
        _need(isinstance(st, dict) and set(st) == {"step", "exp_avg", "exp_avg_sq"}, "optimiser state of another layout")
        n = st["step"]
        _need(isinstance(n, torch.Tensor) and n.dim() == 0 and n.is_floating_point(), "Adam step is not a scalar")
        n = float(n)
        _need(n == int(n) and 1 <= n <= step, f"Adam step {n} is not a whole number in [1, {step}]")
        like = params[i].detach().cpu()
        _tensor_like(st["exp_avg"], like, "Adam first moment")
        _need(bool((_tensor_like(st["exp_avg_sq"], like, "Adam second moment") >= 0).all()), "negative Adam second moment")


def _check_schedule(sched, saved_sched, saved_adam, step: int) -> None:
    want = sched.state_dict()
    want.update(last_epoch=step, _step_count=want["_step_count"] + step,
                _last_lr=[base * lam(step) for base, lam in zip(sched.base_lrs, sched.lr_lambdas)])
    _need(saved_sched == want, f"scheduler state differs from this run's at step {step}")
    _need([g["lr"] for g in saved_adam["param_groups"]] == want["_last_lr"], "learning rate differs from the schedule's")


def _replay(history: list, eps: float) -> tuple[float, int, int]:
    """(best value, its step, evaluations since) by the loop's early-stopping rule."""
    best, at, bad = history[0][1], history[0][0], 0
    for s, v in history[1:]:
        if v < best - eps:
            best, at, bad = v, s, 0
        else:
            bad += 1
    return best, at, bad


def _check_loop(module, loop, limits: dict) -> None:
    from ..symmetry import Alignment
    from ..symmetry import elements as E

    _need(isinstance(loop, dict) and set(loop) == {"step", "pos", "bad", "best", "history"}, "loop state of another layout")
    steps, every, n_train = limits["steps"], limits["every"], limits["n_train"]
    step = _whole(loop["step"], 1, steps - 1, "step")
    _need(step % every == 0, f"step {step} is not one checkpoints are written at (every {every})")
    _need(loop["pos"] == (step - 1) % n_train + 1, f"batch position {loop['pos']!r} does not follow step {step}")
    history = loop["history"]
    _need(isinstance(history, list) and all(isinstance(h, tuple) and len(h) == 2 for h in history),
          "validation history of another layout")
    _need([h[0] for h in history] == [0, *range(limits["eval_every"], step + 1, limits["eval_every"])],
          "validation history at other steps than this run evaluates")
    _need(all(isinstance(v, float) and math.isfinite(v) for _, v in history), "validation history not finite floats")
    best_val, best_step, bad = _replay(history, limits["eps"])
    best = loop["best"]
    _need(isinstance(best, tuple) and len(best) == 3 and best[:2] == (best_val, best_step) and loop["bad"] == bad
          and bad < limits["patience"], "best state or patience count contradicts the validation history")
    hard = best[2]
    _need(isinstance(hard, list) and len(hard) == len(module.latents), "best elements for another number of models")
    ident = Alignment.identity(module.spec).elements
    dtype = next(iter(module.state_dict().values())).dtype
    for el in hard:
        _need(isinstance(el, dict) and set(el) == set(ident), "best elements of other groups")
        for g, group in module.spec.groups.items():
            _need(isinstance(el[g], dict) and set(el[g]) == set(ident[g]), f"best element {g} of another layout")
            for k, t in ident[g].items():
                _tensor_like(el[g][k], t, f"best element {g}.{k}")
            # validated at the precision the loop's projections carry
            E.validate(group, {k: v.to(dtype) if v.is_floating_point() else v for k, v in el[g].items()})


def load(path, key: str, module, opt, sched, gen: torch.Generator, limits: dict) -> dict | None:
    """Restore the state saved at `path` into module, opt, sched and gen and return the loop's
    values; None when there is no file, or (after one warning) when it was made for other inputs
    or fails validation (every tensor's dtype, shape and finiteness, the optimiser's and the
    schedule's state against this run's, the loop's counters and history against its options,
    the best elements against their groups): the run then starts afresh, and a damaged state
    is never half-used. `limits`: steps, every (checkpoint_every), eval_every, patience,
    n_train (batches), eps (the early-stopping margin). Any other file: a ValueError (`check_path`)."""
    path = Path(path)
    if not path.exists():
        return None
    try:
        meta, tensors = _read(path)
    except ValueError as exc:
        raise ValueError(f"checkpoint {path} holds something other than a learned-matching checkpoint ({exc})") from None
    if meta["key"] != key:
        warnings.warn(f"{path}: checkpoint made for other inputs (models, data or options); starting afresh",
                      stacklevel=3)
        return None
    params = [p for p in module.parameters() if p.requires_grad]
    try:
        state = _unpack(meta["state"], tensors)
        _need(isinstance(state, dict) and set(state) == {"latents", "warm", "adam", "scheduler", "generator",
                                                         "torch_rng", "loop"}, "state of another layout")
        loop = state["loop"]
        _need(isinstance(loop, dict) and "step" in loop, "loop state of another layout")
        _check_loop(module, loop, limits)
        _check_latents(module, state["latents"])
        _check_warm(module, state["warm"])
        _check_adam(opt, params, state["adam"], loop["step"])
        _check_schedule(sched, state["scheduler"], state["adam"], loop["step"])
        _rng_state(state["generator"], gen, "generator state")
        _rng_state(state["torch_rng"], torch.default_generator, "torch RNG state")
    except (ValueError, TypeError, KeyError, IndexError, AttributeError, RuntimeError) as exc:
        warnings.warn(f"{path}: damaged learned-matching checkpoint ({exc}); starting afresh", stacklevel=3)
        return None
    device = next(iter(module.state_dict().values())).device
    module.load_state_dict(state["latents"], strict=True)
    for lat, warm in zip(module.all_latents(), state["warm"]):
        for part, (mine, _) in _warm_latents(lat).items():
            mine.clear()
            mine.update({k: v.to(device) for k, v in warm[part].items()})
    opt.load_state_dict(state["adam"])
    sched.load_state_dict(state["scheduler"])
    gen.set_state(state["generator"])
    torch.set_rng_state(state["torch_rng"])
    loop["best"] = (loop["best"][0], loop["best"][1],
                    [{g: {k: v.to(device) for k, v in el.items()} for g, el in hard.items()} for hard in loop["best"][2]])
    return loop


__all__ = ["check_path", "input_key", "load", "save"]
