"""The lerp-kernel engine (CUDA, two end models): nothing is mixed in memory.

Every linear layer calls the Triton `lerp_matmul`, which forms `(1 - lam_k) W_A + lam_k W_B`
tiles inside the GEMM; the small vectors (norm scales and shifts) are mixed directly. Default
only where the kernel benchmark (bench/bench_lerp_matmul.py, bench/bench_sweep.py on CUDA)
shows it faster than mixing then calling cuBLAS (the batched engine): `kernel="auto"` follows
`KERNEL_DEFAULT_ON_CUDA` for passes on tensor cores (bf16, fp16, TF32), never IEEE float32. `evaluate.evaluate_mixtures` decides, from `EvalOptions.kernel`.

Low precision (any engine): `dtype=torch.bfloat16` casts the mixed parameters and activations
to bf16 (mixing itself stays float64, metrics are accumulated in float64). This pays off only
where bf16 GEMMs are fast (CUDA; CPUs with AVX-512 BF16 / AMX): `bf16_fast_here()` says
whether the CPU has them; without them PyTorch's CPU bf16 GEMM is a slow fallback.
"""
from __future__ import annotations

import os

import torch

from ..models.adapters import Arch
from ..models import functional as Fn
from .batched import accumulate, results, token_budget
from .metrics import task_of
from .checks import check_batch, check_sweep_memory, fitted_token_budget, spec_from_params
from .shard import reduce_sums, sharded

__all__ = ["KERNEL_DEFAULT_ON_CUDA", "bf16_fast_here", "evaluate_lerp_kernel", "lerp_forward", "on_tensor_cores",
           "use_kernel"]

#: Whether kernel="auto" uses the Triton lerp_matmul path on CUDA, for passes on tensor cores
#: (bf16 / fp16, or float32 with TF32 on). Measured on an H200 (bench/results/sweep_gpu.json,
#: sweep_tokens_gpu.json, lerp_matmul rows in gpu_logs/): the kernel beat mixing + cuBLAS in every
#: such sweep, 1.02x to 1.17x (paper ViT and a GPT-2, K = 25); in IEEE float32 the kernel's dots
#: run at about 0.02x cuBLAS's SGEMM, so a float32 sweep without TF32 keeps the batched engine.
#: LMC_FAST_LERP_KERNEL=1 / =0 overrides it (=1 then also takes IEEE float32 passes).
KERNEL_DEFAULT_ON_CUDA = True


def on_tensor_cores(dtype, tf32: bool | None) -> bool:
    """Whether a pass in `dtype` (None: float32) runs its GEMMs on tensor cores: bf16 / fp16, or
    float32 with TF32 on (`tf32` None: torch's global setting)."""
    if dtype in (torch.bfloat16, torch.float16):
        return True
    if dtype not in (None, torch.float32):
        return False
    return bool(torch.backends.cuda.matmul.allow_tf32 if tf32 is None else tf32)


def bf16_fast_here(device="cpu") -> bool:
    """True where bf16 GEMMs are native: CUDA, or a CPU that oneDNN reports bf16-capable."""
    device = torch.device(device)
    if device.type == "cuda":
        return True
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 - private op; absent means "don't know", say no
        return False


# ---------------------------------------------------------------- kernel path (lerp_matmul)


def _lerp_vec(a: torch.Tensor | None, b: torch.Tensor | None, lam: torch.Tensor):
    if a is None:
        return None
    l = lam.to(a.dtype).reshape(-1, *([1] * a.dim()))
    return (1 - l) * a + l * b


class LerpOps:
    """The functional forward's linear layers and norms for the K models (1 - lam_k) A + lam_k B:
    every linear layer a `lerp_matmul` call (the weights mixed tile by tile inside the GEMM)."""

    def __init__(self, arch: Arch, pa: dict, pb: dict, lam: torch.Tensor):
        self.arch, self.pa, self.pb, self.lam = arch, pa, pb, lam

    def linear(self, x, name):
        from ..kernels.lerp_matmul import lerp_matmul

        w, b = name + ".weight", name + ".bias"
        tf32 = torch.backends.cuda.matmul.allow_tf32  # one switch for cuBLAS and the kernel
        if b in self.pa:
            return lerp_matmul(x, self.pa[w], self.pb[w], self.lam, self.pa[b], self.pb[b], allow_tf32=tf32)
        return lerp_matmul(x, self.pa[w], self.pb[w], self.lam, allow_tf32=tf32)

    def norm(self, x, name):
        bias = name + ".bias"
        pa, pb, lam = self.pa, self.pb, self.lam
        return Fn.norm(self.arch, x, _lerp_vec(pa[name + ".weight"], pb[name + ".weight"], lam),
                       _lerp_vec(pa.get(bias), pb.get(bias), lam))

    def tensor(self, name):
        return _lerp_vec(self.pa[name], self.pb[name], self.lam)


def lerp_forward(arch: Arch, pa: dict, pb: dict, lam: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
    """Logits of the K models (1 - lam_k) theta_A + lam_k theta_B without materialising them:
    `functional`'s forward with `LerpOps` for its linear layers and norms."""
    K = lam.shape[0]
    ends = Fn.stack([{k: pa[k] for k in Fn.embedding_names(arch)}, {k: pb[k] for k in Fn.embedding_names(arch)}])
    e = Fn.embed_sum(arch, ends, inputs)  # (2, B, T, d): the embeddings' sum is linear in the parameters
    l = lam.to(e.dtype).reshape(K, *([1] * (e.dim() - 1)))
    ops = LerpOps(arch, pa, pb, lam)
    h = Fn.embed_norm(arch, ops, (1 - l) * e[0] + l * e[1])
    return Fn.head(arch, ops, Fn.blocks(arch, ops, h))


def use_kernel(kernel, device, n_models: int, dtype=None, tf32: bool | None = None) -> bool:
    """Whether `kernel` ("auto" | True | False) picks this engine for a sweep of n_models on
    `device`, its passes in `dtype` (None: float32) with `tf32` (None: torch's setting)."""
    device = torch.device(device)
    if kernel in (False, "off", None):
        return False
    from ..kernels.lerp_matmul import triton_available

    possible = n_models == 2 and triton_available(device)
    if kernel in (True, "on"):
        if not possible:
            raise ValueError("kernel=True needs two end models and a Triton device (CUDA, or TRITON_INTERPRET=1)")
        return True
    if kernel != "auto":
        raise ValueError(f"kernel must be 'auto', True or False, got {kernel!r}")
    env = os.environ.get("LMC_FAST_LERP_KERNEL")
    default = KERNEL_DEFAULT_ON_CUDA and on_tensor_cores(dtype, tf32) if env is None else env not in ("", "0")
    return possible and device.type == "cuda" and default


# ---------------------------------------------------------------- the engine


@torch.no_grad()
def evaluate_lerp_kernel(arch: Arch, params_list, W: torch.Tensor, data, *, max_batches=None, progress=None,
                         dtype=torch.float32, device="cpu", chunk: int = 32, max_tokens: int | None = None,
                         fewer: str = "fewer lambdas", input_spec=None, shard=None, max_memory: int | None = None,
                         report: dict | None = None) -> list[dict]:
    """One metrics dict per row of `weights` (K, 2, checked by the caller): the batched
    engine's contract. `chunk` bounds how many mixtures share one forward pass (memory)."""
    K, N = W.shape
    device = torch.device(device)
    if not torch.allclose(W.sum(1), torch.ones(K, dtype=torch.float64)) or N != 2:
        raise ValueError("the kernel path needs two models and weights (1 - lam, lam) that sum to one")
    # nothing is stacked here; a pass holds at most `chunk` mixtures of a whole batch
    budget = token_budget(max_tokens, device, spec_from_params(arch, params_list[0]).inputs)
    if max_tokens is None:
        budget = fitted_token_budget(arch, params_list[0], N, dtype, device, budget, max_memory=max_memory,
                                     stacked=False)
    planned = check_sweep_memory(arch, params_list[0], min(K, chunk), N, dtype, device, budget, stacked=False,
                                 fewer=fewer, max_memory=max_memory)
    if report is not None:
        report.update(planned_bytes=planned, mixtures_per_block=min(K, chunk), blocks=1)
    spec = input_spec or spec_from_params(arch, params_list[0])
    blocks = [list(range(i, min(i + chunk, K))) for i in range(0, K, chunk)]
    pa, pb = ({k: v.to(device=device, dtype=dtype) for k, v in p.items()} for p in params_list)
    lam_blocks = [W[idx, 1].to(device=device, dtype=torch.float32) for idx in blocks]
    sums = [None] * K
    for x, y in sharded(data, max_batches, shard):
        check_batch(spec, x, y)
        x = x.to(device=device, dtype=dtype) if x.is_floating_point() else x.to(device)
        y = y.to(device)
        for idx, lam in zip(blocks, lam_blocks):
            accumulate(sums, idx, lerp_forward(arch, pa, pb, lam, x), y, task_of(arch))
        if progress is not None:
            progress.update(1)
    return results(reduce_sums(sums, shard))
