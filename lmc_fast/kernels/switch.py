"""In-process switch for the compiled extension, for A/B benchmarks and tests.

    from lmc_fast.kernels.switch import use_extension
    with use_extension(False):   # polar / svd_small / linear_assignment take the torch / scipy path
        ...

``LMC_FAST_NO_EXT`` is read once (the loader is cached), so it cannot toggle the path inside
one process; this context manager does, by swapping the cached loader of
``lmc_fast.kernels._ext`` (which every routing function consults at call time through
``get_ext()`` / ``has_cuda_kernels()``) and restoring it on exit. Not thread-safe: it changes
module state for the whole process while active.
"""
from __future__ import annotations

import contextlib

from . import _ext

__all__ = ["use_extension", "extension_enabled"]


@contextlib.contextmanager
def use_extension(enabled: bool):
    """Within the block, route kernels through the compiled extension (`enabled=True`, when it
    is built) or through the plain torch / scipy references (`enabled=False`)."""
    saved_load, saved_cuda = _ext._load, _ext._cuda_kernels_compiled
    if not enabled:
        _ext._load = lambda: (None, "disabled by lmc_fast.kernels.switch.use_extension(False)")
        _ext._cuda_kernels_compiled = lambda: False
    try:
        yield
    finally:
        _ext._load, _ext._cuda_kernels_compiled = saved_load, saved_cuda


def extension_enabled() -> bool:
    """Whether the kernels would use the compiled extension right now."""
    return _ext.get_ext() is not None
