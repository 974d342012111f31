"""Data parallelism under ``torchrun``: one process per device, rank 0 owns files and logs.

Without ``WORLD_SIZE`` in the environment everything here is a no-op, so the same code path
trains on one CPU and on many GPUs. NCCL on GPUs, gloo on CPU (how the tests run two ranks).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from eyas.config import TargetConfig
from eyas.target import pick_device


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks (the tensor itself on one process)."""
        if self.distributed:
            values = values.clone()
            dist.all_reduce(values)
        return values

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def setup(target: TargetConfig) -> World:
    """Join the process group when launched by torchrun; pick this rank's device."""
    size = int(os.environ.get("WORLD_SIZE", "1"))
    device = pick_device(target)
    if size == 1:
        return World(0, 1, device)
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return World(dist.get_rank(), dist.get_world_size(), device)


def teardown(world: World) -> None:
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()
