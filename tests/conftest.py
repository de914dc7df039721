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


# The longest files (minutes of training or of subprocesses), started first: `make test` runs the suite
# on two workers a file at a time (pytest-xdist, --dist loadfile), and a long file taken last would
# leave one worker running it alone.
LONGEST_FIRST = ("test_real_data.py", "test_grid.py", "test_stream_memory.py", "test_stream_distributed.py",
                 "test_train.py", "test_readme.py", "test_hostile_grid.py")


def _start_rank(item) -> int:
    name = item.path.name
    return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)


def pytest_collection_modifyitems(config, items):
    items.sort(key=_start_rank)  # stable: the order within a file, and among the others, is kept
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (the CPU path is tested separately)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
