"""The batched engine: K mixtures sum_n w_kn theta_n of N models in one pass per batch.

Mixed parameters stacked along a leading K axis, batched GEMMs, and the embedding (linear in
the parameters) computed once per model and mixed, instead of once per point. The hot path
of every sweep; `evaluate.evaluate_mixtures` picks it (or another engine) from `EvalOptions`.
Unit of work = (block of mixtures, data shard), so sharding across processes drops in.
"""
from __future__ import annotations

import numbers
from pathlib import Path

import torch

from ..models import functional as Fn
from .checks import check_batch, fitted_token_budget, plan_mixture_blocks, spec_from_params
from .metrics import MetricSums, task_of
from .resume import BlockCheckpoint, block_key, check_every, params_fingerprint, run_block
from .shard import reduce_sums, sharded


def mix_params(params_list, weights: torch.Tensor, dtype, device) -> dict:
    """{name: (K, ...)} = sum_n weights[k, n] * params_list[n][name], accumulated in float64 on
    `device` tensor by tensor (no stacked copy of every model), then cast once. The end models
    may live anywhere (CPU, the GPU, a mix): each tensor meets the weights on `device`."""
    W = torch.as_tensor(weights, dtype=torch.float64).to(device)
    out = {}
    for name in params_list[0]:
        acc = None
        for n, p in enumerate(params_list):
            t = p[name].to(device=device, dtype=torch.float64)
            term = W[:, n].reshape(-1, *([1] * t.dim())) * t
            acc = term if acc is None else acc + term
        out[name] = acc.to(dtype)
    return out


#: Tokens (mixtures x samples x positions) one fused pass processes, per device type.
#: Measured on the 2-core AVX2 CPU, K = 25, against the per-lambda loop: all 25 mixtures
#: of a batch in one pass ran at 0.52x the loop (256 ViT images, 416k tokens: activations
#: out of cache) and 0.86x (16 images, 26k tokens); 2k-4k tokens a pass gave 1.2x (16 ViT
#: images), 1.5x (8 GPT-2 sequences of 128) and 1.07x (128 images), 256 tokens 0.83x.
#: On a busy machine (load 2-3 on 2 cores, bench/bench_sweep_load.py) 2k-token passes lost to the
#: loop with two spinning OpenMP threads (0.92x, ViT): each pass enters the parallel regions of
#: every layer once, and under oversubscription each entry waits. 8k tokens beat or tied the loop in
#: every condition (ViT 1.09x / 1.12x / 1.28x, GPT-2 1.21x / 1.41x / 1.08x at 1 thread / 2 threads /
#: 2 passive threads), 32k lost with passive threads (0.89x ViT, 0.95x GPT-2: activations out of cache).
#: On an H200 (bench/results/sweep_tokens_gpu.json: paper ViT, 2048 images, K = 25), a sweep took
#: 1.55 / 0.78 / 0.74 / 0.70 s in TF32 and 0.99 / 0.42 / 0.37 / 0.36 s in bf16 at 32k / 131k / 262k /
#: 1M tokens a pass: 262k is within 6% of 1M at a quarter of the activations. A default budget that
#: would not fit in memory (large vocabularies) is halved until one pass does (fitted_token_budget).
MAX_TOKENS = {"cpu": 8192, "cuda": 262144}
#: The CPU default for token sequences (language models), where 2k-token passes beat the loop in every
#: condition measured (GPT-2: 1.16x to 1.37x, 12 conditions over 4 runs, loaded and quiet, 1 and 2
#: threads, AVX-512 and AVX2) and 8k lost twice (0.92x quiet, 1 thread, AVX2; 0.94x loaded, passive
#: threads); images keep 8k, which 2k lost to twice (0.91x, 0.99x; ViT, 2 spinning threads).
MAX_TOKENS_SEQUENCES = {"cpu": 2048}


def pass_plan(K: int, B: int, T: int, chunk: int, max_tokens: int) -> tuple[int, int]:
    """(mixtures per pass, samples per pass) for a batch of B samples of T positions: as many
    mixtures as fit in the token budget (at most `chunk`), and whole batches unless a single
    mixture of the batch already exceeds the budget."""
    per_sample = max(1, T)
    k_pass = max(1, min(chunk, K, max_tokens // max(1, B * per_sample)))
    b_pass = B if k_pass > 1 or B * per_sample <= max_tokens else max(1, max_tokens // per_sample)
    return k_pass, b_pass


@torch.no_grad()
def token_budget(max_tokens: int | None, device, inputs: str | None = None) -> int:
    """Tokens a fused pass may hold: `max_tokens`, or the device's default for the model's `inputs`
    ("tokens": MAX_TOKENS_SEQUENCES where it has the device, else MAX_TOKENS)."""
    kind = torch.device(device).type
    table = MAX_TOKENS_SEQUENCES if inputs == "tokens" and kind in MAX_TOKENS_SEQUENCES else MAX_TOKENS
    budget = max_tokens if max_tokens is not None else table.get(kind, MAX_TOKENS["cuda"])
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral) or budget < 1:
        raise ValueError(f"max_tokens must be an int >= 1, got {budget!r}")
    return int(budget)


def check_weight_matrix(W: torch.Tensor, n_models: int) -> None:
    if W.dim() != 2 or W.shape[1] != n_models:
        raise ValueError(f"weights must be (K, {n_models}), got shape {tuple(W.shape)}")
    if not bool(torch.isfinite(W).all()):
        raise ValueError("mixing weights must be finite, got NaN or inf")


@torch.no_grad()
def evaluate_batched(arch, params_list, weights, data, *, max_batches=None, progress=None,
                     dtype=torch.float32, device="cpu", chunk: int = 32, max_tokens: int | None = None,
                     fewer: str = "fewer lambdas", input_spec=None, shard=None, max_memory: int | None = None,
                     report: dict | None = None, checkpoint=None, checkpoint_every: int = 16) -> list[dict]:
    """One metrics dict per row of `weights` (K, N). Each data batch is embedded once per end
    model; the mixtures then go through the forward pass in blocks sized by `pass_plan`
    (at most `chunk` mixtures and about `max_tokens` tokens a pass; default per device).
    When the K stacked mixtures do not fit in `max_memory` bytes (None: the device's free
    memory), they are evaluated in blocks that do, one pass over the data per block
    (`checks.plan_mixture_blocks`); a sweep of which one mixture does not fit is refused up
    front. `report`, a dict, receives the plan: planned_bytes, mixtures_per_block, blocks.
    Every batch is checked against `input_spec`
    (`checks.spec_from_model` of an end model: exact image shapes) or, without one, against
    what the parameters tell. `shard` = (rank, world): this rank's batches only, the sums then
    all-reduced (`shard.py`). `checkpoint`, a folder: each block records its sums every
    `checkpoint_every` batches and at its end, and a re-run resumes from them (`resume.py`)."""
    W = torch.as_tensor(weights, dtype=torch.float64)
    check_weight_matrix(W, len(params_list))
    K, N = W.shape
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    device = torch.device(device)
    spec = input_spec or spec_from_params(arch, params_list[0])
    budget = token_budget(max_tokens, device, spec.inputs)
    if max_tokens is None:
        budget = fitted_token_budget(arch, params_list[0], N, dtype, device, budget, max_memory=max_memory)
    block, planned = plan_mixture_blocks(arch, params_list[0], K, N, dtype, device, budget, max_memory=max_memory)
    starts = range(0, K, block)
    if report is not None:
        report.update(planned_bytes=planned, mixtures_per_block=min(block, K), blocks=len(starts))
    # the embedding is all the forward needs of the end models themselves
    names = Fn.embedding_names(arch)
    ends = Fn.stack([{k: p[k].to(device=device, dtype=dtype) for k in names} for p in params_list])
    sums = [None] * K
    if checkpoint is not None:
        check_every(checkpoint_every)
        Path(checkpoint).mkdir(parents=True, exist_ok=True)
        fingerprint = params_fingerprint(params_list)
    for b0 in starts:  # one block (all K mixtures, unless memory says otherwise) at a time
        idx = list(range(b0, min(b0 + block, K)))
        record = None
        if checkpoint is not None:  # named by everything but the data, which are checked as they are read
            key = block_key(fingerprint, W[idx], engine="batched", dtype=dtype, device=device.type, max_tokens=budget,
                            chunk=chunk, max_batches=max_batches, shard=shard, input_spec=spec)
            record = BlockCheckpoint(checkpoint, key, checkpoint_every, sums, idx, is_lm=arch.pooling == "none")
        run_block(lambda rec: _evaluate_block(arch, params_list, W[idx], idx, ends, data, sums, spec, dtype, device,
                                              chunk, budget, max_batches, shard, progress,
                                              1 / len(starts) if len(starts) > 1 else 1, rec), record)
    return results(reduce_sums(sums, shard))


def _evaluate_block(arch, params_list, W, idx, ends, data, sums, spec, dtype, device, chunk, budget, max_batches,
                    shard, progress, step, record=None) -> None:
    """Add the metrics of the mixtures `idx` (weights W) over the data to `sums`; with a
    `record` (resume.BlockCheckpoint), skip the batches it covers and record as it goes."""
    K = len(idx)
    mixed = Wd = None  # mixed on the first batch evaluated: a finished block never mixes
    for x, y in sharded(data, max_batches, shard):
        if record is not None and not record.take(x, y):
            if progress is not None:
                progress.update(step)
            continue
        if mixed is None:
            # mixing in float64 per tensor, then one cast: the same parameters the loop loads
            mixed = mix_params(params_list, W, dtype, device)
            Wd = W.to(device=device, dtype=dtype)
        check_batch(spec, x, y)
        x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
        y = y.to(device)
        e = Fn.embed_sum(arch, ends, x)  # (N, B, T, d)
        k_pass, b_pass = pass_plan(K, e.shape[1], e.shape[2], chunk, budget)
        for s in range(0, e.shape[1], b_pass):
            es, ys = e[:, s:s + b_pass], y[s:s + b_pass]
            for k0 in range(0, K, k_pass):
                k1 = min(k0 + k_pass, K)
                p = {name: t[k0:k1] for name, t in mixed.items()}
                h = Fn.embed_norm(arch, p, torch.einsum("kn,n...->k...", Wd[k0:k1], es))
                accumulate(sums, idx[k0:k1], Fn.head(arch, p, Fn.blocks(arch, p, h)), ys, task_of(arch))
        if record is not None:
            record.evaluated()
        if progress is not None:
            progress.update(step)
    if record is not None:
        record.finish()


def accumulate(sums: list, idx: list[int], logits: torch.Tensor, targets: torch.Tensor, task: str):
    """Add a (len(idx), B, ...) block of logits to the running metrics of mixtures idx."""
    for j, i in enumerate(idx):
        if sums[i] is None:
            sums[i] = MetricSums(is_lm=task != "classify")
        sums[i].task = task  # sums read back from a block record do not carry it
        sums[i].add(logits[j], targets)


def results(sums: list) -> list[dict]:
    if sums[0] is None:
        raise ValueError("no data: the evaluation iterable yielded no batches")
    return [s.result() for s in sums]
