"""A sweep's data split across torch.distributed ranks, its metric sums added back together.

Every rank evaluates every mixture on its share of the batches (batch i goes to rank
i mod world, after `max_batches`), then one all-reduce adds the per-mixture sums (loss,
hits, counts, calibration bins: all float64), so each rank ends with the metrics of the whole
data set, equal to one process's up to float64 summation order. gloo on CPU, NCCL on CUDA
(the sums travel on this rank's current GPU); the group is torchrun's (`init_process_group`).
"""
from __future__ import annotations

import torch

from .batches import limited
from .metrics import ECE_BINS, MetricSums


def shard_of(distributed: bool | None) -> tuple[int, int] | None:
    """(rank, world) to shard over, or None for a local sweep.

    None: shard when a process group with more than one rank is initialised; True: require one
    (joining torchrun's from its environment if nobody has yet); False: never shard."""
    if distributed is False:
        return None
    import torch.distributed as dist

    if not dist.is_available():
        if distributed:
            raise ValueError("distributed=True: this torch has no torch.distributed")
        return None
    if not dist.is_initialized() and distributed:
        import os

        if "WORLD_SIZE" not in os.environ:
            raise ValueError("distributed=True needs a process group: run under torchrun, or call "
                             "torch.distributed.init_process_group first")
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        # the group we opened is closed at exit: a gloo group left to the interpreter's teardown
        # aborts the process now and then ("terminate called without an active exception")
        import atexit

        atexit.register(_close_group)
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return None
    return dist.get_rank(), dist.get_world_size()


def _close_group():
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def sharded(data, max_batches: int | None, shard: tuple[int, int] | None):
    """This rank's batches among the first `max_batches` of `data` (all of them without a shard)."""
    if shard is None:
        yield from limited(data, max_batches)
        return
    rank, world = shard
    for i, batch in enumerate(limited(data, max_batches)):
        if i % world == rank:
            yield batch


_SCALARS = 5  # batches, n, loss, correct, is_lm


def reduce_sums(sums: list, shard: tuple[int, int] | None) -> list:
    """Every rank's sums added (one all-reduce for all mixtures); `sums` unchanged without a shard.
    A rank that saw no batch contributes zeros."""
    if shard is None:
        return sums
    import torch.distributed as dist

    width = _SCALARS + 3 * ECE_BINS
    flat = torch.zeros(len(sums), width, dtype=torch.float64)
    for k, s in enumerate(sums):
        if s is not None:
            flat[k, :_SCALARS] = torch.tensor([s.batches, s.n, s.loss, s.correct, float(s.is_lm)], dtype=torch.float64)
            flat[k, _SCALARS:] = torch.cat([s.bin_conf, s.bin_acc, s.bin_n])
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    total = flat.to(device)
    dist.all_reduce(total)
    total = total.cpu()
    out = []
    for row in total:
        s = MetricSums(is_lm=bool(row[4] > 0))
        s.batches, s.n = int(row[0]), int(row[1])
        s.loss, s.correct = float(row[2]), float(row[3])
        s.bin_conf, s.bin_acc, s.bin_n = (row[_SCALARS + i * ECE_BINS:_SCALARS + (i + 1) * ECE_BINS].clone()
                                          for i in range(3))
        out.append(s if s.batches else None)
    return out


__all__ = ["reduce_sums", "shard_of", "sharded"]
