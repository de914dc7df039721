# Set before anything imports triton: the interpreter runs Triton kernels on the CPU.
import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402
import torch  # noqa: E402

# one thread: the models in tests are tiny, and threads only add overhead (and contention on a
# shared 2-core machine)
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (the CPU path is tested separately)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
