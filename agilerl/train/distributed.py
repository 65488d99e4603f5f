"""Data-parallel training across processes (``accelerate launch``, ``torchrun``).

Each rank collects its own share of tasks (``TaskAssigner`` with its rank), computes its loss,
and gradients are averaged with one all-reduce before every optimiser step, so every rank
applies the same update to the same weights. Rank 0 alone logs, evaluates and checkpoints.
Gloo on CPU, NCCL on GPUs. A single process needs none of this and imports no
``torch.distributed``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class World:
    """This process's place among the training processes."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def broadcast_parameters(self, module: torch.nn.Module) -> None:
        """Give every rank rank 0's weights (models built from one seed already agree; this is
        the guarantee)."""
        if not self.distributed:
            return
        import torch.distributed as dist

        for tensor in module.state_dict().values():
            dist.broadcast(tensor, src=0)

    def average_gradients(self, parameters: Iterable[torch.nn.Parameter]) -> None:
        """Replace each gradient by its mean over ranks, in one flattened all-reduce."""
        if not self.distributed:
            return
        import torch
        import torch.distributed as dist

        params = [p for p in parameters if p.requires_grad]
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= self.world_size
        offset = 0
        for p, g in zip(params, grads):
            p.grad = flat[offset : offset + g.numel()].view_as(g).clone()
            offset += g.numel()

    def mean(self, metrics: Mapping[str, float]) -> dict[str, float]:
        """Each metric averaged over ranks (every rank must report the same keys)."""
        if not self.distributed:
            return dict(metrics)
        import torch
        import torch.distributed as dist

        keys = sorted(metrics)
        values = torch.tensor([float(metrics[k]) for k in keys], dtype=torch.float64)
        dist.all_reduce(values)
        return dict(zip(keys, (values / self.world_size).tolist()))

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()


def init_world() -> World:
    """Join the process group that ``accelerate launch``/``torchrun`` describe in the environment
    (``WORLD_SIZE``, ``RANK``, ``MASTER_ADDR``...); a plain run is a world of one."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return World()
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return World(rank=dist.get_rank(), world_size=dist.get_world_size())
