"""The shared finiteness check used by every entry point's input validation."""
import pytest
import torch

from lmc_fast.numerics import all_finite


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_sees_every_bad_value(dtype):
    x = torch.randn(7, 33).to(dtype)
    assert all_finite(x) and all_finite(torch.empty(0, 3, dtype=dtype)) and all_finite(torch.arange(4))
    for bad in (float("nan"), float("inf"), -float("inf")):
        y = x.clone()
        y[5, 17] = bad
        assert not all_finite(y)
        assert not all_finite(torch.complex(y.float(), torch.zeros_like(y.float())))
        assert not all_finite(torch.complex(torch.zeros_like(y.float()), y.float()))
