"""The process group the grid runs in: torchrun's, or a single process.

Under `torchrun` (RANK, WORLD_SIZE, MASTER_ADDR... in the environment) the group is created
from that environment (gloo on CPU, NCCL on CUDA with one GPU per rank: LOCAL_RANK); all
communication is torch.distributed's. Without torchrun it is a group of one and every call
here is a no-op.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

#: how long a rank waits at a barrier for the others: units (learned matching, big sweeps) can
#: take hours, and the default 30 minutes would kill a healthy run whose ranks finish unevenly
BARRIER_TIMEOUT = datetime.timedelta(hours=24)


@dataclass(frozen=True)
class Group:
    rank: int = 0
    world: int = 1
    device: str = "cpu"  # this rank's device: "cpu" or "cuda:<LOCAL_RANK>"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        if self.world > 1:
            import torch.distributed as dist

            if self.device.startswith("cuda"):
                dist.barrier(device_ids=[int(self.device.split(":")[1])])
            else:
                dist.barrier()


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        raise ValueError(f"environment variable {name}={os.environ[name]!r} is not an integer") from None


@contextlib.contextmanager
def process_group(device_kind: str = "cpu"):
    """Yields this process's Group, joining (and afterwards leaving) torchrun's group if it made it."""
    import torch
    import torch.distributed as dist

    world = _env_int("WORLD_SIZE", 1)
    if dist.is_available() and dist.is_initialized():  # the caller's own group: use it, leave it open
        yield _group(dist.get_rank(), dist.get_world_size(), device_kind)
        return
    if world <= 1:
        yield _group(0, 1, device_kind)
        return
    if device_kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("grid.device: \"cuda\" but no CUDA device is available to this torch")
        torch.cuda.set_device(_env_int("LOCAL_RANK", 0) % torch.cuda.device_count())  # fewer GPUs than ranks: shared
    dist.init_process_group("nccl" if device_kind == "cuda" else "gloo", timeout=BARRIER_TIMEOUT)
    try:
        yield _group(dist.get_rank(), dist.get_world_size(), device_kind)
    finally:
        dist.destroy_process_group()


def _group(rank: int, world: int, device_kind: str) -> Group:
    if device_kind == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError("grid.device: \"cuda\" but no CUDA device is available to this torch")
        local = _env_int("LOCAL_RANK", rank) % torch.cuda.device_count()
        return Group(rank, world, f"cuda:{local}")
    return Group(rank, world, "cpu")


__all__ = ["Group", "process_group"]
