"""Loss / accuracy barriers along the linear path between two models (docs/ARCHITECTURE.md, section 1).

barrier = max_lam [ L(theta_lam) - ((1 - lam) L(theta_A) + lam L(theta_B)) ]

Two engines return the same numbers (both through `evaluate.evaluate_mixtures`):
- "loop": the per-point baseline every prior tool runs (interpolate, load, evaluate);
- "fused": all K points in one pass per batch, parameters stacked along a lambda axis,
  batched GEMMs, and the embedding (linear in the parameters) computed once per end point
  (or, on CUDA with `kernel`, the Triton lerp_matmul mixing the weights inside each GEMM).
"""
from __future__ import annotations

from .batches import reiterable
from .checks import spec_from_model
from .evaluate import EvalOptions, evaluate_mixtures
from .interpolate import models_params
from .result import MAX_LAMBDAS, BarrierResult, barrier_result, lambda_grid  # noqa: F401 (their old home)

#: the public engine names -> `EvalOptions.engine`
ENGINE_NAMES = {"loop": "per_point", "fused": "batched"}


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
    once; memory one layer of each model plus the activations, planned within `max_memory` by the size of
    the batch groups carried through together), on the CPU, dtype float32 unless given.

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

        given = {"engine": engine != "fused", "device": device not in (None, "cpu"), "chunk": chunk != 32,
                 "max_tokens": max_tokens is not None, "kernel": kernel != "auto", "tf32": tf32 is not None,
                 "checkpoint": checkpoint is not None,
                 "checkpoint_every": checkpoint_every != 16}
        taken = [k for k, v in given.items() if v]
        if taken:  # each is a setting of the in-memory engines: refused rather than ignored
            raise ValueError(f"{taken[0]} is not an option of a sweep of checkpoint paths (streamed a layer at a "
                             "time, on the CPU); load the models to use it")
        return barrier_paths(model_a, model_b, data, lambdas, align=align, space=space, max_batches=max_batches,
                             dtype=dtype or __import__("torch").float32, progress=progress, distributed=distributed,
                             max_memory=max_memory)
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
