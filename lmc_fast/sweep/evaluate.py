"""One evaluator of model mixtures for every sweep: barrier, simplex, learned matching, the monitor.

    rows = evaluate_mixtures(arch, params_list, weights, data, EvalOptions(device="cuda", tf32=True))

returns one metrics dict per row of `weights` (K mixtures sum_n w_kn theta_n of N models),
from one of three engines, named by what they do:

- "per_point" (per_point.py): mix each point's parameters, build that model, evaluate it;
  the baseline every prior tool runs (needs `template`, a model to load them into);
- "batched" (batched.py): every mixture of a batch in stacked passes, batched GEMMs, the
  embedding once per end model;
- "lerp_kernel" (lerp_kernel.py): two end models on CUDA, the Triton lerp_matmul mixing the
  weights inside each GEMM; chosen instead of "batched" by `kernel` ("auto": per benchmarks).

All options live in `EvalOptions`, so every caller gets every one (TF32, the kernel, sharding).
"""
from __future__ import annotations

import contextlib
import numbers
from dataclasses import dataclass, replace

import torch

from .batched import check_weight_matrix, evaluate_batched
from .lerp_kernel import evaluate_lerp_kernel, use_kernel
from .per_point import evaluate_per_point
from .shard import shard_of

ENGINES = ("per_point", "batched")  # "lerp_kernel" is picked by `kernel` within "batched"


@dataclass(frozen=True)
class EvalOptions:
    engine: str = "batched"  # "per_point" | "batched"
    dtype: torch.dtype | None = None  # the passes' dtype (None: float32); mixing and metrics stay float64
    device: object = None  # None: the CPU
    chunk: int = 32  # most mixtures in one pass
    max_tokens: int | None = None  # tokens a batched pass may hold (None: per device, batched.MAX_TOKENS)
    kernel: object = "auto"  # the lerp_matmul engine: "auto" | True | False
    tf32: bool | None = None  # CUDA fp32 GEMMs on TF32 tensor cores (None: the global torch setting)
    max_batches: int | None = None  # the first batches only
    input_spec: object = None  # checks.InputSpec every batch is checked against (None: from the parameters)
    distributed: bool | None = False  # shard the batches over torch.distributed ranks (shard.shard_of)
    progress: bool = False  # a tqdm bar: points (per_point) or batches (the others)
    desc: str = "sweep"  # the bar's label
    fewer: str = "fewer lambdas"  # what the out-of-memory refusal tells the user to ask for
    max_memory: int | None = None  # bytes a sweep may use (None: the device's free memory); more mixtures
    #                                than fit are evaluated in blocks that do (checks.plan_mixture_blocks)
    report: dict | None = None  # receives the memory plan: planned_bytes, mixtures_per_block, blocks
    checkpoint: object = None  # a folder (str | Path): each block of mixtures records its sums there and a
    #                            re-run resumes from them (resume.py; the batched engine only)
    checkpoint_every: int = 16  # batches between two records of a block (and one at its end)

    def __post_init__(self):  # the counts, checked once here for every engine and caller
        for name, none in (("chunk", False), ("max_batches", True), ("checkpoint_every", False)):
            value = getattr(self, name)
            if none and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"{name} must be a whole number >= 1{' or None' if none else ''}, got {value!r}")

    def replace(self, **changes) -> "EvalOptions":
        return replace(self, **changes)


@contextlib.contextmanager
def matmul_tf32(enabled: bool | None):
    """Within the block, CUDA fp32 GEMMs (cuBLAS and the lerp_matmul kernel) use TF32 tensor
    cores when `enabled`, IEEE fp32 when not; None leaves the global setting. No effect on CPU."""
    if enabled is None:
        yield
        return
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = bool(enabled)
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _batch_count(data, max_batches: int | None) -> int | None:
    """How many batches a sweep reads (a progress bar's total), when `data` has a length."""
    try:
        n = len(data)
    except TypeError:
        return None
    return n if max_batches is None else min(n, max_batches)


def progress_bar(progress: bool, engine: str, n_points: int, data, max_batches, desc: str):
    """A bar with a total (so it shows an ETA): the per-point engine counts points, the others
    count batches (every point advances on each); None when progress is off."""
    if not progress:
        return None
    from tqdm.auto import tqdm

    if engine == "per_point":
        return tqdm(total=n_points, desc=f"{desc} (loop)", unit="pt")
    return tqdm(total=_batch_count(data, max_batches), desc=f"{desc} (fused)", unit="batch")


def engine_for(options: EvalOptions, n_models: int) -> str:
    """The engine that runs: "per_point", "batched" or "lerp_kernel"."""
    if options.engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {options.engine!r}")
    if options.engine == "per_point":
        if options.checkpoint is not None:
            raise ValueError("checkpoint= (resuming a sweep) needs the fused engine, not the per-point loop")
        return "per_point"
    device = torch.device("cpu" if options.device is None else options.device)
    if options.checkpoint is not None:  # only the batched engine records its blocks
        if options.kernel in (True, "on"):
            raise ValueError("checkpoint= (resuming a sweep) needs kernel='auto' or False: the lerp_matmul "
                             "engine does not record its progress")
        return "batched"
    fast = use_kernel(options.kernel, device, n_models, options.dtype, options.tf32)
    return "lerp_kernel" if fast else "batched"


def evaluate_mixtures(arch, params_list, weights, data, options: EvalOptions = EvalOptions(), *,
                      template=None) -> list[dict]:
    """One metrics dict per row of `weights` (K, N) for the N models' parameters `params_list`
    (standard names); `template`: a model of the architecture, needed by the per-point engine."""
    if options.engine == "per_point":
        engine_for(options, len(params_list))  # refuses a checkpoint
        if template is None:
            raise ValueError("the per-point engine needs template= (a model to load each mixture into)")
        bar = progress_bar(options.progress, "per_point", len(weights), data, options.max_batches, options.desc)
        try:
            return evaluate_per_point(template, params_list, weights, data, options.max_batches, bar)
        finally:
            if bar is not None:
                bar.close()
    W = torch.as_tensor(weights, dtype=torch.float64)
    check_weight_matrix(W, len(params_list))
    if options.chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {options.chunk}")
    engine = engine_for(options, W.shape[1])
    run = evaluate_lerp_kernel if engine == "lerp_kernel" else evaluate_batched
    shard = shard_of(options.distributed)
    bar = progress_bar(options.progress, engine, W.shape[0], data, options.max_batches, options.desc)
    try:
        with matmul_tf32(options.tf32):
            return run(arch, params_list, W, data, max_batches=options.max_batches, progress=bar,
                       dtype=options.dtype or torch.float32, device=torch.device(options.device or "cpu"),
                       chunk=options.chunk, max_tokens=options.max_tokens, fewer=options.fewer,
                       input_spec=options.input_spec, shard=shard, max_memory=options.max_memory,
                       report=options.report,
                       **({} if engine == "lerp_kernel" else {"checkpoint": options.checkpoint,
                                                            "checkpoint_every": options.checkpoint_every}))
    finally:
        if bar is not None:
            bar.close()


__all__ = ["ENGINES", "EvalOptions", "engine_for", "evaluate_mixtures", "matmul_tf32", "progress_bar"]
