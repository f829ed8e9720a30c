"""Data-parallel eval under `torchrun` or `accelerate launch`: this process's rank, its shard, gathering and a
barrier."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

T = TypeVar("T")


def process_group() -> tuple[int, int]:
    """(rank, world size) of this process; (0, 1) when not launched by torchrun/accelerate (no WORLD_SIZE).

    With several processes, torch.distributed is initialised once: nccl on CUDA, gloo on CPU.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return dist.get_rank(), dist.get_world_size()


def shard(items: Sequence[T], rank: int, world: int) -> list[T]:
    """Every world-th item from `rank` on: the shards are disjoint and together hold every item once."""
    return list(items[rank::world])


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def gather(value: T) -> list[T]:
    """`value` from every process, in rank order (`[value]` in a single process). Every process must call it."""
    if not _distributed():
        return [value]
    import torch.distributed as dist

    values: list[T] = [value] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def barrier(while_waiting: Callable[[], None] | None = None, interval_s: float = 0.5) -> None:
    """Wait for every process (nothing to wait for in a single process), calling `while_waiting` every
    `interval_s` meanwhile (rank 0 updates the total progress while the other ranks finish)."""
    if not _distributed():
        return
    import torch.distributed as dist

    if while_waiting is None:
        dist.barrier()
        return
    work = dist.barrier(async_op=True)
    while not work.is_completed():
        while_waiting()
        time.sleep(interval_s)
    work.wait()
    while_waiting()


def local_device(device: str) -> str:
    """The device of this process: with several processes on CUDA, 'auto' means this process's own GPU (LOCAL_RANK)."""
    if device == "auto" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import torch

        if torch.cuda.is_available():
            return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return device
