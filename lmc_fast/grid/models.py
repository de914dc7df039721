"""The grid's models: checkpoint paths as given, or a recipe trained once per seed into OUT/models.

A trained checkpoint is reused when it loads and its metadata records the same recipe, seed and
training settings; otherwise that seed is (re)trained. Under torchrun the seeds are trained
round-robin by rank, then every rank waits for all of them.
"""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

from .dist import Group
from .spec import GridSpec


def model_paths(spec: GridSpec, out: Path) -> list[str]:
    if spec.models:
        return list(spec.models)
    return [str(out / "models" / f"seed{s}") for s in spec.seeds]


def _wanted_meta(spec: GridSpec, seed: int) -> dict:
    return {"recipe": spec.recipe, "seed": seed, "train_settings": dict(sorted(spec.train.items()))}


def _grid_metadata(path: Path) -> dict | None:
    """The metadata of the checkpoint a grid trained at `path`, {} when nothing is there, None when the path
    holds something else (a foreign model, other files, a damaged checkpoint): never trained over."""
    from ..errors import CheckpointError
    from ..io import load_model

    if not path.exists() and not path.is_symlink():
        return {}
    if path.is_dir() and not any(path.iterdir()):
        return {}
    try:
        meta = getattr(load_model(path), "lmc_fast_metadata", {}) or {}
    except (CheckpointError, OSError, ValueError):
        return None
    return meta if {"recipe", "seed", "train_settings"} <= set(meta) else None


def _is_cached(path: Path, wanted: dict) -> bool:
    meta = _grid_metadata(path)
    return bool(meta) and all(meta.get(k) == v for k, v in wanted.items())


def check_model_folders(spec: GridSpec, out: Path) -> None:
    """Before any training: every OUT/models/seedN is free or holds a checkpoint a grid trained (replaced
    when its recipe, seed or settings differ); anything else there is refused in one line."""
    if not spec.recipe:
        return
    for seed in spec.seeds:
        path = out / "models" / f"seed{seed}"
        if _grid_metadata(path) is None:
            raise ValueError(f"{path} holds something a grid did not train (not a recipe checkpoint with its "
                             "seed and settings); move it or choose another --out")


def train_recipe_models(spec: GridSpec, out: Path, group: Group, log) -> None:
    """Train the seeds missing from OUT/models (this rank's share), then wait for the other ranks."""
    if not spec.recipe:
        return
    from ..io import save_model
    from ..recipes import recipe
    from ..train import train

    check_model_folders(spec, out)
    r = recipe(spec.recipe, **spec.train)
    for n, seed in enumerate(spec.seeds):
        path = out / "models" / f"seed{seed}"
        wanted = _wanted_meta(spec, seed)
        if n % group.world != group.rank or _is_cached(path, wanted):
            continue
        log(f"training {spec.recipe} seed {seed} ({r.hparams})")
        model = r.model(seed=seed).to(group.device)
        history = train(model, **r.train_kwargs, seed=seed, device=group.device, progress=False)
        model.eval()
        save_model(model, path, metadata={**wanted, "data": spec.data, "train": history})
    group.barrier()


class ModelCache:
    """Models loaded on first use, the most recent few kept (a pair's units run one after another)."""

    def __init__(self, paths: list[str], device: str, keep: int = 4):
        self.paths, self.device, self.keep = paths, device, keep
        self._models: OrderedDict[int, object] = OrderedDict()

    def get(self, i: int):
        from ..io import load_model

        if i in self._models:
            self._models.move_to_end(i)
            return self._models[i]
        model = load_model(self.paths[i], device=self.device)
        model.eval()
        self._models[i] = model
        while len(self._models) > self.keep:
            self._models.popitem(last=False)
        return model

    def fingerprints(self) -> list[str]:
        from ..symmetry import model_fingerprint

        return [model_fingerprint(self.get(i)) for i in range(len(self.paths))]


__all__ = ["ModelCache", "check_model_folders", "model_paths", "train_recipe_models"]
