"""Lazy access to the compiled extension ``lmc_fast._C``.

The extension is optional at run time: every kernel entry point falls back to the torch /
scipy reference when it is missing. ``LMC_FAST_NO_EXT=1`` disables it (for A/B checks),
``LMC_FAST_NO_CUDA_KERNELS=1`` disables only its CUDA kernels.
"""
from __future__ import annotations

import os
from functools import lru_cache

__all__ = ["get_ext", "has_ext", "build_info", "has_cuda_kernels"]


@lru_cache(maxsize=1)
def _load():
    if os.environ.get("LMC_FAST_NO_EXT", "") not in ("", "0"):
        return None, "disabled by LMC_FAST_NO_EXT"
    try:
        from lmc_fast import _C  # type: ignore[attr-defined]
    except ImportError as exc:  # not built (pure-Python checkout) or broken build
        return None, f"{type(exc).__name__}: {exc}"
    return _C, None


def get_ext():
    """The ``lmc_fast._C`` module, or None when it cannot be imported."""
    return _load()[0]


def has_ext() -> bool:
    return get_ext() is not None


def import_error() -> str | None:
    """Why the extension is unavailable (None when it loaded)."""
    return _load()[1]


def build_info() -> dict:
    """What the extension was compiled with (``available: False`` when it is missing)."""
    ext = get_ext()
    if ext is None:
        return {"available": False, "error": import_error(), "openmp": False, "cuda": False,
                "cuda_arches": ""}
    info = dict(ext.build_info())
    info["available"] = True
    return info


@lru_cache(maxsize=1)
def _cuda_kernels_compiled() -> bool:
    ext = get_ext()
    return bool(ext is not None and ext.build_info().get("cuda", False))


def has_cuda_kernels() -> bool:
    """True when the CUDA kernels were compiled in and a CUDA device is usable now."""
    if os.environ.get("LMC_FAST_NO_CUDA_KERNELS", "") not in ("", "0"):
        return False
    if not _cuda_kernels_compiled():
        return False
    import torch

    return torch.cuda.is_available()
