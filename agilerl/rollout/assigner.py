"""TaskAssigner: which task (env seed, dataset row) each rollout slot plays.

One task per batch item, repeated across its GRPO group, so grouped advantages compare answers
to the same question. Rows are reshuffled every epoch and split between ranks; everything
follows from ``seed``, so a run (and each rank of it) replays the same tasks.
"""

from __future__ import annotations

import random
from typing import NamedTuple

from agilerl.errors import InvalidArgument

__all__ = ["MAX_SHUFFLED_ROWS", "Task", "TaskAssigner"]

MAX_SHUFFLED_ROWS = 10_000_000
"""The most rows a ``TaskAssigner`` shuffles (about 400 MB for the epoch's order): a larger
``dataset_size`` (a server may publish any number) is refused with a clear error, never a
``MemoryError``."""


class Task(NamedTuple):
    """What one slot's ``reset`` gets: the env seed and, for dataset envs, the row."""

    seed: int
    row_index: int | None


class TaskAssigner:
    """Deals tasks out batch by batch.

    ``dataset_size=None`` (an env without rows) deals seeds only. With ``world_size > 1`` every
    rank must pass the same ``seed``: ranks shuffle alike and each takes its own equal share of
    every epoch's rows (the few left over when rows do not divide evenly wait for a later epoch).
    """

    def __init__(
        self, dataset_size: int | None, *, seed: int | None = None, rank: int = 0, world_size: int = 1
    ) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise InvalidArgument(f"rank must be in 0..world_size-1, got rank={rank}, world_size={world_size}")
        if dataset_size is not None and dataset_size > MAX_SHUFFLED_ROWS:
            raise InvalidArgument(
                f"dataset_size {dataset_size} is more rows than a run deals out "
                f"(at most {MAX_SHUFFLED_ROWS:,}: every epoch's shuffled order is held in memory); an "
                "env with that many tasks (generated ones) should declare no dataset_size and pick "
                "its task from reset's seed, or declare the rows it really has"
            )
        if dataset_size is not None and dataset_size < world_size:
            raise InvalidArgument(
                f"dataset_size {dataset_size} is smaller than world_size {world_size}: some ranks "
                "would get no rows; use a larger dataset or fewer ranks"
            )
        if seed is None:
            if world_size > 1:
                raise InvalidArgument(
                    f"TaskAssigner needs seed= with world_size={world_size}, so every rank shuffles "
                    "the rows the same way and their shares never overlap"
                )
            seed = random.randrange(2**32)
        self.dataset_size = dataset_size
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.epoch = 0
        self._env_seeds = random.Random(f"agilerl-task-seeds/{seed}/{rank}")
        self._rows = self._epoch_rows(0)
        self._next_row = 0

    def assign(self, batch_size: int, group_size: int) -> list[Task]:
        """``batch_size * group_size`` tasks, slot ``i`` playing batch item ``i // group_size``."""
        if batch_size < 1 or group_size < 1:
            raise InvalidArgument(f"batch_size and group_size must be >= 1, got {batch_size} and {group_size}")
        items = [self._next_task() for _ in range(batch_size)]
        return [task for task in items for _ in range(group_size)]

    def _next_task(self) -> Task:
        seed = self._env_seeds.randrange(2**31)
        if self.dataset_size is None:
            return Task(seed, None)
        if self._next_row == len(self._rows):
            self.epoch += 1
            self._rows = self._epoch_rows(self.epoch)
            self._next_row = 0
        row = self._rows[self._next_row]
        self._next_row += 1
        return Task(seed, row)

    def _epoch_rows(self, epoch: int) -> list[int]:
        """This rank's share of the epoch's shuffled rows (equal shares keep ranks in step)."""
        if self.dataset_size is None:
            return []
        rows = list(range(self.dataset_size))
        random.Random(f"agilerl-task-rows/{self.seed}/{epoch}").shuffle(rows)
        share = self.dataset_size // self.world_size
        return rows[self.rank * share : (self.rank + 1) * share]
