"""Loss / accuracy barriers along the linear path between two models (docs/ARCHITECTURE.md, section 1).

barrier = max_lam [ L(theta_lam) - ((1 - lam) L(theta_A) + lam L(theta_B)) ]

Two engines return the same numbers (both through `evaluate.evaluate_mixtures`):
- "loop": the per-point baseline every prior tool runs (interpolate, load, evaluate);
- "fused": all K points in one pass per batch, parameters stacked along a lambda axis,
  batched GEMMs, and the embedding (linear in the parameters) computed once per end point
  (or, on CUDA with `kernel`, the Triton lerp_matmul mixing the weights inside each GEMM).
"""
from __future__ import annotations

import json
import numbers
from dataclasses import asdict, dataclass, field


from .batches import reiterable
from .checks import as_real, spec_from_model
from .evaluate import EvalOptions, evaluate_mixtures
from .interpolate import models_params

#: the public engine names -> `EvalOptions.engine`
ENGINE_NAMES = {"loop": "per_point", "fused": "batched"}


@dataclass
class BarrierResult:
    lambdas: list[float]
    loss: list[float]
    acc: list[float]
    ece: list[float]
    ppl: list[float] | None
    loss_a: float
    loss_b: float
    acc_a: float
    acc_b: float
    barrier: float  # loss barrier (max of loss - chord, clipped at 0 only by being a max over ends)
    acc_barrier: float  # max accuracy drop below the chord
    signed: list[float] = field(default_factory=list)  # loss - chord at every lambda
    signed_min: float = 0.0
    signed_max: float = 0.0
    space: str = "canonical"
    engine: str = "loop"
    seconds: float = 0.0
    # per lambda the reliability diagram of the ECE bins: {"conf", "acc", "n"} (15 bins each;
    # conf/acc None for an empty bin); None for results made before it was recorded
    reliability: list[dict] | None = None
    # lambdas="adaptive": evaluations, rounds, peak_resolved, tol (None for a fixed grid)
    adaptive: dict | None = None
    # checkpoint paths swept a layer at a time (sweep/streamed.py): bytes_read, tokens, lambdas; else None
    streamed: dict | None = None

    @property
    def loss_barrier(self) -> float:
        return self.barrier

    def at(self, lam: float) -> dict:
        i = min(range(len(self.lambdas)), key=lambda j: abs(self.lambdas[j] - lam))
        return {"lambda": self.lambdas[i], "loss": self.loss[i], "acc": self.acc[i]}

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self, **kw) -> str:
        return json.dumps(self.to_dict(), **kw)


#: Most points one path may have: far more than any plot resolves, and a count past it is a
#: typo (`--lambdas 1e12` once built a trillion-entry list until the kernel killed it).
MAX_LAMBDAS = 10_001


def lambda_grid(lambdas) -> list[float]:
    """A count (int in [2, MAX_LAMBDAS]: evenly spaced, both ends included) or explicit
    values (finite, in [0, 1], at most MAX_LAMBDAS of them) -> the list of lambdas."""
    if isinstance(lambdas, numbers.Integral) and not isinstance(lambdas, bool):
        count = int(lambdas)
        if not 2 <= count <= MAX_LAMBDAS:
            raise ValueError(f"lambdas as a count must be an int in [2, {MAX_LAMBDAS}] (both ends included), got {count}")
        return [i / (count - 1) for i in range(count)]
    if isinstance(lambdas, (str, bytes, bool, numbers.Number)) or not hasattr(lambdas, "__len__"):
        raise ValueError(f"lambdas must be a count (an int >= 2), a list of values in [0, 1] or 'adaptive', "
                         f"got {lambdas!r}")
    if not 1 <= len(lambdas) <= MAX_LAMBDAS:
        raise ValueError(f"lambdas must list between 1 and {MAX_LAMBDAS} values, got {len(lambdas)}")
    grid = []
    for value in lambdas:
        lam = as_real(value)
        if not 0.0 <= lam <= 1.0:  # also false for NaN
            raise ValueError(f"lambdas must be finite values in [0, 1], got {value!r}")
        grid.append(lam)
    return grid


def public_engine(engine: str) -> str:
    """"loop" | "fused" (what lf.barrier and lf.simplex take) -> the evaluator's engine name."""
    if engine not in ENGINE_NAMES:
        raise ValueError(f"engine must be 'loop' or 'fused', got {engine!r}")
    return ENGINE_NAMES[engine]


def barrier(model_a, model_b, data, lambdas=25, *, space: str = "canonical", engine: str = "fused",
            max_batches: int | None = None, device=None, dtype=None, chunk: int = 32,
            max_tokens: int | None = None, kernel="auto", tf32: bool | None = None,
            progress: bool = False, distributed: bool | None = None,
            max_memory: int | None = None, checkpoint=None, checkpoint_every: int = 16,
            align=None) -> BarrierResult:
    """Evaluate the linear path from model_a (lambda = 0) to model_b (lambda = 1).

    `align` (an Alignment of model_b onto model_a): sweep to the aligned B, in the alignment's space.
    `model_a` and `model_b` may be checkpoint paths: the sweep then streams them a layer at a time
    (`sweep/streamed.py`: every evaluation batch's K mixtures carried through together, each layer read
    once; memory one layer of each model plus the activations), on the CPU, dtype float32 unless given.

    `lambdas`: a count (evenly spaced, ends included), explicit values in [0, 1], or "adaptive"
    (`sweep.adaptive.Adaptive` for other settings): a coarse grid refined at the peak until it stops
    rising by `tol`, far fewer points than a grid of the same resolution (`res.adaptive` counts them).

    `space="canonical"` (default) interpolates canonical forms (aligned models pass through);
    `space="raw"` interpolates the parameters as they are (the "no alignment" baseline).
    `engine="fused"` evaluates every lambda in batched passes (at most `chunk` lambdas and
    about `max_tokens` tokens a pass, default per device); `kernel` picks the Triton
    lerp-inside-the-GEMM path on CUDA ("auto": where benchmarks made it the default);
    `engine="loop"` is the per-lambda baseline. `dtype=torch.bfloat16` runs the fused
    passes in bf16 (metrics in float64; pays off only with native bf16 GEMMs); `tf32=True`
    lets fp32 sweeps on CUDA use TF32 tensor cores (None: the global torch setting).
    Inside an initialised torch.distributed group (torchrun) of several ranks, or with
    `distributed=True`, the fused engine evaluates each rank's share of the batches and
    all-reduces the metric sums: every rank returns the whole result (`sweep/shard.py`);
    `distributed=False` keeps the sweep local (the loop engine always is). Call it on every rank.
    `max_memory` (bytes; None: the device's free memory) bounds the fused engine's plan: the
    lambdas are evaluated in blocks whose stacked parameters and activations fit in it.
    `checkpoint`, a folder (fused engine): each block of lambdas records its metric sums there
    every `checkpoint_every` batches and at its end; the same call after an interruption (even
    SIGKILL) resumes from them and returns the numbers of an uninterrupted run. Records are named
    by a hash of the models, lambdas and settings, and the data are checked as they are read:
    a record made for other inputs is recomputed, never trusted (`sweep/resume.py`).
    """
    import os

    if isinstance(model_a, (str, os.PathLike)) or isinstance(model_b, (str, os.PathLike)):
        if not (isinstance(model_a, (str, os.PathLike)) and isinstance(model_b, (str, os.PathLike))):
            raise ValueError("model_a and model_b must be both models or both checkpoint paths")
        from .streamed import barrier_paths

        return barrier_paths(model_a, model_b, data, lambdas, align=align, space=space, max_batches=max_batches,
                             dtype=dtype or __import__("torch").float32, progress=progress, distributed=distributed)
    if align is not None:
        model_b, space = align.apply(model_b), align.spec.space
    p0 = next(model_a.parameters())
    options = EvalOptions(engine=public_engine(engine), dtype=dtype or p0.dtype, device=device or p0.device,
                          chunk=chunk, max_tokens=max_tokens, kernel=kernel, tf32=tf32, max_batches=max_batches,
                          distributed=distributed if engine == "fused" else False, progress=progress, desc="sweep",
                          max_memory=max_memory, checkpoint=checkpoint, checkpoint_every=checkpoint_every)
    return barrier_with(model_a, model_b, data, lambdas, space, options)


def barrier_with(model_a, model_b, data, lambdas, space: str, options: EvalOptions) -> BarrierResult:
    """`barrier` with the evaluator's options given whole (the grid's way in: max_memory, report).
    `options.dtype` / `options.device` default to model_a's; `input_spec` to model_a's inputs."""
    import time

    from .adaptive import adaptive_points, as_adaptive

    t0 = time.perf_counter()
    adaptive = as_adaptive(lambdas)
    lams = None if adaptive is not None else lambda_grid(lambdas)
    data = reiterable(data)
    arch, params = models_params([model_a, model_b], space)
    evals = None if lams is None else sorted(set(lams) | {0.0, 1.0})
    p0 = next(model_a.parameters())
    options = options.replace(dtype=options.dtype or p0.dtype, device=options.device or p0.device,
                              input_spec=options.input_spec or spec_from_model(model_a))
    engine = "loop" if options.engine == "per_point" else "fused"

    def measure(points: list) -> dict:
        rows = evaluate_mixtures(arch, params, [[1.0 - l, l] for l in points], data, options, template=model_a)
        return dict(zip(points, rows))

    if adaptive is not None:  # a coarse grid, then one point a round at the peak (sweep/adaptive.py)
        by_lam, info = adaptive_points(measure, adaptive)
        res = barrier_result(sorted(by_lam), by_lam, space, engine, time.perf_counter() - t0)
        res.adaptive = info
        return res
    return barrier_result(lams, measure(evals), space, engine, time.perf_counter() - t0)


def barrier_result(lams: list[float], by_lam: dict, space: str, engine: str, seconds: float) -> BarrierResult:
    """The BarrierResult of the metrics rows `by_lam` (lambda -> metrics dict, holding 0 and 1)
    over the grid `lams`; shared with `lmc_fast.monitor`, which evaluates parameters directly."""
    ra, rb = by_lam[0.0], by_lam[1.0]
    rows = [by_lam[l] for l in lams]
    chord = [(1 - l) * ra["loss"] + l * rb["loss"] for l in lams]
    signed = [r["loss"] - c for r, c in zip(rows, chord)]
    acc_drop = [(1 - l) * ra["acc"] + l * rb["acc"] - r["acc"] for l, r in zip(lams, rows)]
    return BarrierResult(
        lambdas=lams, loss=[r["loss"] for r in rows], acc=[r["acc"] for r in rows], ece=[r["ece"] for r in rows],
        ppl=[r["ppl"] for r in rows] if "ppl" in ra else None,
        loss_a=ra["loss"], loss_b=rb["loss"], acc_a=ra["acc"], acc_b=rb["acc"],
        barrier=max(signed), acc_barrier=max(acc_drop), signed=signed, signed_min=min(signed),
        signed_max=max(signed), space=space, engine=engine, seconds=seconds,
        reliability=[r["reliability"] for r in rows] if all("reliability" in r for r in rows) else None,
    )
