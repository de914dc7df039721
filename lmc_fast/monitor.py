"""Barrier measurements inside a training loop, leaving the training exactly as it was.

    monitor = BarrierMonitor(reference, test_batches, every=100, lambdas=5, method="weight",
                             jsonl="runs/lmc.jsonl")
    for step, (x, y) in enumerate(loader, start=1):
        ...                                  # forward, backward, optimiser step
        res = monitor.step(model, step)      # a BarrierResult every 100 steps, else None

Each measurement reads the model's current weights as standard parameters (detached clones:
nothing else is copied), aligns them onto the reference when `method` asks for it, and runs
one fused sweep over the lambdas. It runs in eval mode under no_grad and afterwards restores
every module's train/eval flag, every parameter's requires_grad and the random states of
torch (CPU and CUDA), NumPy and Python: a run that measures ends with the same weights, bit
for bit, as one that does not. `lmc_fast.callbacks.BarrierCallback` is this monitor as a
Hugging Face TrainerCallback.
"""
from __future__ import annotations

import contextlib
import math
import numbers
import random
import time
from pathlib import Path

import numpy as np
import torch

from .atomic import json_text
from .match.methods import REGISTRY
from .models.adapters import check_compatible, standard_params
from .sweep.barrier import BarrierResult, barrier_result, lambda_grid
from .sweep.batches import limited, reiterable
from .sweep.checks import check_batch, spec_from_model
from .sweep.evaluate import EvalOptions, evaluate_mixtures
from .symmetry import Alignment, check_same_arch, prepare_params, spec_for

#: the registry's methods that match parameters alone (match/methods.py), cheap enough to run during
#: training, and the parameter space each interpolates in ("none": raw parameters, the baseline)
METHODS = {m.name: m.space for m in REGISTRY.values() if not m.aligns or m.match_params is not None}


# ---------------------------------------------------------------- leaving training untouched
def rng_states() -> dict:
    """Every global random state a training loop may draw from."""
    states = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():  # never initialise CUDA just to read it
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


@contextlib.contextmanager
def untouched(model):
    """Eval mode and no_grad inside; afterwards each module's own training flag (not one
    recursive .train(), which would flip deliberately frozen submodules), each parameter's
    requires_grad and every random state are put back as they were."""
    modes = [(m, m.training) for m in model.modules()]
    flags = [(p, p.requires_grad) for p in model.parameters()]
    states = rng_states()
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        for m, training in modes:
            m.training = training
        for p, flag in flags:
            if p.requires_grad != flag:
                p.requires_grad_(flag)
        set_rng_states(states)


def unwrap(model):
    """The model inside DataParallel / DistributedDataParallel / torch.compile wrappers."""
    while True:
        if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile's OptimizedModule
            model = model._orig_mod
        else:
            return model


# ---------------------------------------------------------------- references
class _Reference:
    """A fixed end point: its weights are read once, in the measuring space, on the CPU in float64."""

    def __init__(self, reference, space: str, index: int):
        if isinstance(reference, (str, Path)):
            from .io import load_model

            self.name = str(reference)
            reference = load_model(reference)
        else:
            self.name = f"reference {index}"
        self.model = reference  # kept for its config (compatibility checks), never run
        self.arch, raw = standard_params(reference)
        self.params = prepare_params(spec_for(self.arch, space), self.arch, raw)
        self._on = {}  # device -> these parameters there

    def params_on(self, device: torch.device) -> dict:
        key = str(device)
        if key not in self._on:
            self._on[key] = self.params if device.type == "cpu" else {k: v.to(device) for k, v in self.params.items()}
        return self._on[key]


def _positive_int(name: str, value, allow_none: bool = False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1{' or None' if allow_none else ''}, got {value!r}")
    return int(value)


class BarrierMonitor:
    """Measures the barrier between a model being trained and `reference` every `every` steps.

    reference: a model, a checkpoint path, or a list of them (each read once, now).
    data: an iterable of (inputs, targets) batches, as `lf.barrier` takes; with `max_batches`,
    its first max_batches batches are read once, now, and every measurement uses those. lambdas: a count or explicit values (0.5 is always evaluated too,
    for `loss_mid`). method: "none" (raw parameters), "weight" or "permutation" (data-free
    matching of the current weights onto the reference at every measurement: any data-free
    method of `lmc_fast.match.methods`).
    jsonl: a file that gets one JSON line per measurement (appended).
    `step(model, step)` returns a BarrierResult (a list of them when `reference` is a list)
    when it measured, else None; `last_metrics` holds the flat metrics of the last one:
    `{prefix}barrier`, `{prefix}acc_barrier`, `{prefix}loss_mid`, `{prefix}seconds` (means
    over references, plus `{prefix}ref{i}/...` per reference when there are several).
    """

    def __init__(self, reference, data, every: int = 100, lambdas=5, method: str = "none",
                 max_batches: int | None = None, prefix: str = "lmc/", jsonl=None, *, dtype=None, seed: int = 0):
        self.every = _positive_int("every", every)
        self.max_batches = _positive_int("max_batches", max_batches, allow_none=True)
        self.lambdas = lambda_grid(lambdas)
        if method not in METHODS:
            raise ValueError(f"method must be one of {tuple(METHODS)} (data-free, cheap enough to run during "
                             f"training), got {method!r}")
        if not isinstance(prefix, str):
            raise ValueError(f"prefix must be a string, got {prefix!r}")
        self.method, self.space, self.prefix, self.dtype, self.seed = method, METHODS[method], prefix, dtype, seed
        # With max_batches, those batches are read once, here: every measurement then sees the same
        # ones (a shuffling loader would hand each measurement others, and draw random numbers)
        if self.max_batches is None or data is None:
            self.data = reiterable(data)  # a one-shot iterator is read once, here; None: one clear error
        else:
            self.data = list(limited(data, self.max_batches))
        self._single = not isinstance(reference, (list, tuple))
        refs = [reference] if self._single else list(reference)
        if not refs:
            raise ValueError("reference must be a model, a checkpoint path or a non-empty list of them")
        self.references = [_Reference(r, self.space, i) for i, r in enumerate(refs)]
        if isinstance(self.data, (list, tuple)):  # batches in hand: checked now, not at the first measurement
            # (a loader is only read when measuring: iterating it here would draw from the training's RNG)
            spec = spec_from_model(self.references[0].model)
            for batch in limited(self.data, self.max_batches):
                if not isinstance(batch, (tuple, list)) or len(batch) != 2:
                    raise ValueError(f"data: a batch must be an (inputs, targets) pair, got {type(batch).__name__}")
                check_batch(spec, *batch)
        self.jsonl = None if jsonl is None else Path(jsonl)
        self.last_step = None
        self.last_metrics: dict | None = None
        self.history: list[dict] = []  # {"step": ..., **metrics} per measurement

    def due(self, step: int) -> bool:
        return step % self.every == 0 and step != self.last_step

    def step(self, model, step: int):
        """Measure if `step` is a multiple of `every` (once per step); None otherwise."""
        if not self.due(step):
            return None
        return self.measure(model, step)

    def measure(self, model, step: int | None = None):
        """Measure now, whatever the step."""
        t0 = time.perf_counter()
        model = unwrap(model)
        with untouched(model):
            pairs = [self._measure_one(ref, model) for ref in self.references]
        results = [res for res, _ in pairs]
        metrics = self._metrics(pairs, time.perf_counter() - t0)
        self.last_step, self.last_metrics = step, metrics
        self.history.append({"step": step, **metrics})
        if self.jsonl is not None:
            self._append(step, metrics, results)
        return results[0] if self._single else results

    # ------------------------------------------------------------ internals
    def _measure_one(self, ref: _Reference, model) -> tuple[BarrierResult, float]:
        t0 = time.perf_counter()
        check_compatible(ref.model, model, what="the trained model", ref=ref.name, mlp="equal")
        arch, raw = standard_params(model)  # detached clones: the snapshot of the current weights
        check_same_arch(ref.arch, arch, "the trained model")
        spec = spec_for(arch, self.space)
        current = prepare_params(spec, arch, raw)
        p0 = next(model.parameters())
        fixed = ref.params_on(p0.device)
        if REGISTRY[self.method].aligns:  # on parameters: lf.align would rebuild models
            elements, _ = REGISTRY[self.method].match_params(spec, fixed, current, seed=self.seed)
            current = Alignment(spec, elements).apply_params(current)
        evals = sorted(set(self.lambdas) | {0.0, 0.5, 1.0})
        options = EvalOptions(max_batches=self.max_batches, dtype=self.dtype or p0.dtype, device=p0.device,
                              input_spec=spec_from_model(model))
        rows = evaluate_mixtures(arch, [fixed, current], [[1.0 - l, l] for l in evals], self.data, options)
        by_lam = dict(zip(evals, rows))
        res = barrier_result(self.lambdas, by_lam, self.space, "fused", time.perf_counter() - t0)
        return res, by_lam[0.5]["loss"]

    def _metrics(self, pairs, seconds: float) -> dict:
        p = self.prefix
        per = [{"barrier": r.barrier, "acc_barrier": r.acc_barrier, "loss_mid": mid} for r, mid in pairs]
        out = {f"{p}{k}": math.fsum(d[k] for d in per) / len(per) for k in per[0]}
        if len(per) > 1:
            for i, d in enumerate(per):
                out.update({f"{p}ref{i}/{k}": v for k, v in d.items()})
        out[f"{p}seconds"] = seconds
        return out

    def _append(self, step, metrics: dict, results) -> None:
        self.jsonl.parent.mkdir(parents=True, exist_ok=True)
        line = json_text({"step": step, "method": self.method, **metrics, "results": [r.to_dict() for r in results]},
                         indent=None)
        with open(self.jsonl, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()


__all__ = ["METHODS", "BarrierMonitor", "rng_states", "set_rng_states", "untouched", "unwrap"]
