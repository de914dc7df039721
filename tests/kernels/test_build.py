"""The compiled extension: what it reports, and that the CUDA sources compile."""
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from lmc_fast.kernels import build_info, has_cuda_kernels
from lmc_fast.kernels._ext import get_ext, import_error

ROOT = Path(__file__).resolve().parents[2]


def test_extension_imports():
    assert get_ext() is not None, f"lmc_fast._C did not import: {import_error()}"


def test_build_info_sane():
    ext = get_ext()
    if ext is None:
        pytest.skip("lmc_fast._C not built")
    info = ext.build_info()
    for key, typ in [("version", str), ("openmp", bool), ("openmp_threads", int), ("cuda", bool),
                     ("cuda_arches", str), ("compiler", str)]:
        assert isinstance(info[key], typ), key
    assert info["openmp_threads"] >= 1
    if not info["openmp"]:
        assert info["openmp_threads"] == 1
    if info["cuda"]:
        assert info["cuda_arches"]
    else:
        assert info["cuda_arches"] == ""
    wrapped = build_info()
    assert wrapped["available"] is True and wrapped["cuda"] == info["cuda"]
    # Without a device the module still imports (static cudart) and reports no kernels.
    assert ext.cuda_device_count() >= 0
    import torch

    if not torch.cuda.is_available():
        assert not has_cuda_kernels()


def test_cuda_built_when_toolkit_present():
    """With LMC_FAST_CUDA=AUTO and nvcc on PATH at build time the CUDA kernels are in."""
    ext = get_ext()
    if ext is None or shutil.which("nvcc") is None:
        pytest.skip("no extension or no nvcc")
    if os.environ.get("LMC_FAST_CUDA", "AUTO").upper() == "OFF":
        pytest.skip("built with LMC_FAST_CUDA=OFF")
    assert ext.build_info()["cuda"] is True


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not on PATH")
def test_cuda_sources_compile(tmp_path):
    """Each .cu compiles for sm_90 (H100/H200) with nvcc, no GPU needed (<60 s)."""
    sources = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
    assert sources, "no CUDA sources"
    for src in sources:
        out = tmp_path / (src.stem + ".o")
        proc = subprocess.run(
            ["nvcc", "-std=c++17", "-O1", "-arch=sm_90", "-I", str(ROOT / "csrc"), "-Xcompiler", "-fPIC",
             "-c", str(src), "-o", str(out)],
            capture_output=True, text=True, timeout=240)
        assert proc.returncode == 0, proc.stderr[-4000:]
        assert out.stat().st_size > 0
