"""sweep.evaluate.evaluate_mixtures returns the per-point engine's numbers (fp32: 1e-5 relative),
on the batched engine and on the Triton lerp_matmul engine (interpreter on CPU, compiled on CUDA)."""
import pytest
import torch

import lmc_fast as lf
from lmc_fast.kernels.lerp_matmul import triton_available
from lmc_fast.sweep.evaluate import EvalOptions, evaluate_mixtures
from lmc_fast.sweep.per_point import evaluate_per_point
from lmc_fast.sweep.interpolate import models_params


def _case(family):
    torch.manual_seed(0)
    if family == "vit":
        cfg = lf.models.ViTConfig.paper(d_model=32, d_mlp=48, n_layer=2, n_head=4, image_size=8, patch_size=4)
        a, b = lf.models.ViT(cfg).eval(), lf.models.ViT(cfg).eval()
        x = torch.randn(6, 3, 8, 8)
        return a, b, [(x[:4], torch.randint(0, 10, (4,))), (x[4:], torch.randint(0, 10, (2,)))]
    cfg = lf.models.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64, block_size=16)
    a, b = lf.models.GPT2(cfg).eval(), lf.models.GPT2(cfg).eval()
    x = torch.randint(0, 64, (3, 16))
    return a, b, [(x, x)]


@pytest.mark.parametrize("family", ["vit", "gpt2"])
@pytest.mark.parametrize("kernel", [False, True])
def test_fast_matches_loop(family, kernel):
    if kernel and not triton_available("cpu"):
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    a, b, data = _case(family)
    arch, params = models_params([a, b], "raw")
    W = [[1 - l, l] for l in (0.0, 0.3, 0.5, 1.0)]
    ref = evaluate_per_point(a, params, W, data)
    got = evaluate_mixtures(arch, params, W, data, EvalOptions(chunk=3, kernel=kernel))
    for r, g in zip(ref, got):
        assert g["loss"] == pytest.approx(r["loss"], rel=1e-5)
        assert g["acc"] == pytest.approx(r["acc"])


def test_three_models_and_bf16():
    a, b, data = _case("vit")
    c = lf.models.ViT(a.config).eval()
    arch, params = models_params([a, b, c], "raw")
    W = [[0.2, 0.3, 0.5], [1.0, 0.0, 0.0]]
    ref = evaluate_per_point(a, params, W, data)
    got = evaluate_mixtures(arch, params, W, data)
    for r, g in zip(ref, got):
        assert g["loss"] == pytest.approx(r["loss"], rel=1e-5)
    low = evaluate_mixtures(arch, params, W, data, EvalOptions(dtype=torch.bfloat16))
    for r, g in zip(ref, low):
        assert g["loss"] == pytest.approx(r["loss"], rel=5e-2)


def test_errors():
    a, b, data = _case("gpt2")
    arch, params = models_params([a, b], "raw")
    with pytest.raises(ValueError, match="weights must be"):
        evaluate_mixtures(arch, params, [[1.0, 0.0, 0.0]], data)
    with pytest.raises(ValueError, match="no data"):
        evaluate_mixtures(arch, params, [[1.0, 0.0]], [])


@pytest.mark.parametrize("kernel", [False, True])
def test_barrier_reaches_the_kernel_path(kernel):
    """lf.barrier passes `kernel` through: the Triton path (interpreter here) gives the loop's
    barrier; on CPU "auto" stays on the batched-GEMM engine."""
    if kernel and not triton_available("cpu"):
        pytest.skip("needs TRITON_INTERPRET=1 on CPU")
    a, b, data = _case("gpt2")
    loop = lf.barrier(a, b, data, 5, space="raw", engine="loop")
    got = lf.barrier(a, b, data, 5, space="raw", kernel=kernel, max_tokens=20)
    assert got.loss == pytest.approx(loop.loss, rel=1e-5)
    assert got.barrier == pytest.approx(loop.barrier, rel=1e-4, abs=1e-6)
    with pytest.raises(ValueError, match="kernel must be"):
        lf.barrier(a, b, data, 5, space="raw", kernel="sometimes")


def test_tf32_switch_is_scoped_to_the_call():
    """barrier(tf32=...) sets the CUDA matmul precision only inside the call (no effect on the
    numbers on CPU) and restores the global flags, also when the call fails."""
    from lmc_fast.sweep.evaluate import matmul_tf32

    a, b, data = _case("vit")
    before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    ref = lf.barrier(a, b, data, 3, space="raw")
    for flag in (True, False):
        got = lf.barrier(a, b, data, 3, space="raw", tf32=flag)
        if not torch.cuda.is_available():
            assert got.loss == ref.loss
        assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before
    with pytest.raises(RuntimeError, match="boom"):
        with matmul_tf32(not before[0]):
            assert torch.backends.cuda.matmul.allow_tf32 == (not before[0])
            raise RuntimeError("boom")
    assert (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32) == before


def test_one_evaluator_names_its_engines():
    """evaluate_mixtures runs per_point (needs a template), batched, or lerp_kernel (picked by
    `kernel`), and gives every engine the same numbers."""
    from lmc_fast.sweep.evaluate import engine_for

    a, b, data = _case("vit")
    arch, params = models_params([a, b], "raw")
    W = [[1 - l, l] for l in (0.0, 0.5, 1.0)]
    assert engine_for(EvalOptions(), 2) == "batched" and engine_for(EvalOptions(engine="per_point"), 2) == "per_point"
    if triton_available("cpu"):
        assert engine_for(EvalOptions(kernel=True), 2) == "lerp_kernel"
    ref = evaluate_mixtures(arch, params, W, data, EvalOptions(engine="per_point"), template=a)
    assert ref == evaluate_per_point(a, params, W, data)
    got = evaluate_mixtures(arch, params, W, data, EvalOptions(tf32=True, max_tokens=8))
    for r, g in zip(ref, got):
        assert g["loss"] == pytest.approx(r["loss"], rel=1e-5)
    with pytest.raises(ValueError, match="needs template"):
        evaluate_mixtures(arch, params, W, data, EvalOptions(engine="per_point"))
    with pytest.raises(ValueError, match="engine must be one of"):
        evaluate_mixtures(arch, params, W, data, EvalOptions(engine="fused"))


@pytest.mark.skipif(not triton_available("cpu"), reason="the Triton interpreter (TRITON_INTERPRET=1) is not on")
def test_lerp_kernel_engine_runs_the_one_forward_on_a_llama():
    """The Triton path is the functional forward with linear layers that mix inside the GEMM: on a grouped-
    query, rotary, SwiGLU model without biases it gives the batched engine's numbers (CPU interpreter here,
    the same code as on CUDA)."""
    torch.manual_seed(0)
    cfg = lf.models.LlamaConfig(n_layer=2, d_model=32, n_head=4, n_kv_head=2, d_mlp=48, vocab_size=64, block_size=16)
    a, b = lf.models.Llama(cfg).eval(), lf.models.Llama(cfg).eval()
    x = torch.randint(0, 64, (2, 16))
    arch, params = models_params([a, b], "raw")
    W = [[1 - l, l] for l in (0.0, 0.3, 1.0)]
    batched = evaluate_mixtures(arch, params, W, [(x, x)], EvalOptions())
    kernel = evaluate_mixtures(arch, params, W, [(x, x)], EvalOptions(kernel=True))
    for r, k in zip(batched, kernel):
        assert k["loss"] == pytest.approx(r["loss"], rel=1e-4)


@pytest.mark.gpu
def test_lerp_kernel_engine_on_cuda_llama():
    if not triton_available("cuda"):
        pytest.skip("Triton CUDA path unavailable (TRITON_INTERPRET set?)")
    torch.manual_seed(0)
    cfg = lf.models.LlamaConfig(n_layer=2, d_model=64, n_head=4, n_kv_head=2, d_mlp=96, vocab_size=64, block_size=32)
    a, b = lf.models.Llama(cfg).eval().cuda(), lf.models.Llama(cfg).eval().cuda()
    x = torch.randint(0, 64, (4, 32), device="cuda")
    arch, params = models_params([a, b], "raw")
    W = [[1 - l, l] for l in (0.0, 0.3, 1.0)]
    batched = evaluate_mixtures(arch, params, W, [(x, x)], EvalOptions(device="cuda"))
    kernel = evaluate_mixtures(arch, params, W, [(x, x)], EvalOptions(device="cuda", kernel=True))
    for r, k in zip(batched, kernel):
        assert k["loss"] == pytest.approx(r["loss"], rel=1e-3)


def test_auto_kernel_only_where_the_gemms_run_on_tensor_cores(monkeypatch):
    """kernel="auto" on CUDA takes the lerp_matmul engine for bf16 / fp16 / TF32 passes, where the
    H200 measured it faster than mixing + cuBLAS, never for IEEE float32 (0.02x there) or float64;
    two models only; the environment variable overrides the default either way."""
    import lmc_fast.kernels.lerp_matmul as lerp_matmul_mod
    from lmc_fast.sweep import lerp_kernel as LK

    monkeypatch.setattr(lerp_matmul_mod, "triton_available", lambda device: True)
    monkeypatch.delenv("LMC_FAST_LERP_KERNEL", raising=False)
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert LK.use_kernel("auto", cuda, 2, torch.bfloat16) and LK.use_kernel("auto", cuda, 2, torch.float16)
    assert LK.use_kernel("auto", cuda, 2, None, tf32=True) and LK.use_kernel("auto", cuda, 2, torch.float32, True)
    assert not LK.use_kernel("auto", cuda, 2, None, tf32=False)
    assert not LK.use_kernel("auto", cuda, 2, torch.float64, tf32=True)
    assert not LK.use_kernel("auto", cuda, 3, torch.bfloat16) and not LK.use_kernel("auto", cpu, 2, torch.bfloat16)
    assert not LK.use_kernel(False, cuda, 2, torch.bfloat16)
    before = torch.backends.cuda.matmul.allow_tf32
    try:  # tf32=None follows torch's global switch
        torch.backends.cuda.matmul.allow_tf32 = True
        assert LK.use_kernel("auto", cuda, 2)
        torch.backends.cuda.matmul.allow_tf32 = False
        assert not LK.use_kernel("auto", cuda, 2)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before
    monkeypatch.setenv("LMC_FAST_LERP_KERNEL", "1")
    assert LK.use_kernel("auto", cuda, 2, None, tf32=False)
    monkeypatch.setenv("LMC_FAST_LERP_KERNEL", "0")
    assert not LK.use_kernel("auto", cuda, 2, torch.bfloat16)
