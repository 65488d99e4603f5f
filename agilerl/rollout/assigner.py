"""TaskAssigner: which task (env seed, dataset row) each rollout slot plays.

One task per batch item, repeated across its GRPO group, so grouped advantages compare answers
to the same question. Two ways to choose (``training.task_sampling``):

- ``uniform`` (default): rows reshuffled every epoch and split between ranks, seeds at random;
  everything follows from ``seed``, so a run (and each rank of it) replays the same tasks.
- ``adaptive``: tasks whose groups were informative are drawn more often, with a floor
  (``agilerl.rollout.task_sampling``). The trainer reports each step's groups (``observe``);
  with several ranks their outcomes are merged in rank order (``pending``/``merge``), so every
  rank holds the same weights and draws from its own generator.

A resumed loop passes over the tasks it already trained (``collector.skip``; the async pipeline
draws its stream again from the first task): under uniform sampling a fresh assigner deals them
again from ``seed``. Adaptive draws depend on the outcomes seen, so ``state_dict`` keeps every
task handed out with the generators and counts; ``load_state_dict`` hands those tasks out again,
in order, then goes on exactly as the saved assigner would have.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from agilerl.errors import InvalidArgument
from agilerl.rollout.task_sampling import SEED_BUCKETS, AdaptiveSampler, restore, state_of

if TYPE_CHECKING:
    from agilerl.rollout.trajectory import Trajectory

__all__ = ["MAX_SHUFFLED_ROWS", "Task", "TaskAssigner", "TaskSampling", "refuse_too_many_rows"]

TaskSampling = Literal["uniform", "adaptive"]

MAX_SHUFFLED_ROWS = 10_000_000
"""The most rows a ``TaskAssigner`` shuffles (about 400 MB for the epoch's order): a larger
``dataset_size`` (a server may publish any number) is refused with a clear error, never a
``MemoryError``."""


def refuse_too_many_rows(what: str, rows: int | None, fix: str) -> None:
    """The one bound on the rows a run deals out, training's tasks and eval's episodes alike: past
    :data:`MAX_SHUFFLED_ROWS` an error naming ``what`` and the way out (``fix``), before any memory
    is spent on them."""
    if rows is not None and rows > MAX_SHUFFLED_ROWS:
        raise InvalidArgument(
            f"{what} {rows} is more rows than a run deals out (at most {MAX_SHUFFLED_ROWS:,}: the "
            f"order they are dealt in is held in memory); {fix}"
        )


class Task(NamedTuple):
    """What one slot's ``reset`` gets: the env seed and, for dataset envs, the row."""

    seed: int
    row_index: int | None


class TaskAssigner:
    """Deals tasks out batch by batch.

    ``dataset_size=None`` (an env without rows) deals seeds only. With ``world_size > 1`` every
    rank must pass the same ``seed``: ranks shuffle alike and each takes its own equal share of
    every epoch's rows (the few left over when rows do not divide evenly wait for a later epoch).
    ``sampling="adaptive"`` draws by informativeness instead (the module doc), keeping at least
    ``floor`` of uniform's chance for every task. Thread-safe: lanes draw while the trainer merges.
    """

    def __init__(
        self,
        dataset_size: int | None,
        *,
        seed: int | None = None,
        rank: int = 0,
        world_size: int = 1,
        sampling: TaskSampling = "uniform",
        floor: float = 0.25,
    ) -> None:
        if sampling not in ("uniform", "adaptive"):
            raise InvalidArgument(f"task sampling must be 'uniform' or 'adaptive', got {sampling!r}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise InvalidArgument(f"rank must be in 0..world_size-1, got rank={rank}, world_size={world_size}")
        refuse_too_many_rows(
            "dataset_size", dataset_size,
            "an env with that many tasks (generated ones) should declare no dataset_size and pick its "
            "task from reset's seed, or declare the rows it really has",
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
        self.sampling = sampling
        self._env_seeds = random.Random(f"agilerl-task-seeds/{seed}/{rank}")
        self._rows = self._epoch_rows(0) if sampling == "uniform" else []
        self._next_row = 0
        self._lock = threading.Lock()
        self._again: deque[Task] = deque()  # a loaded stream's tasks, handed out again first
        self._handed: list[Task] = []  # adaptive: every task handed out, from the first
        self.adaptive: AdaptiveSampler | None = None
        self.pending: list[tuple[int, bool]] = []
        """This rank's outcomes not merged yet (several ranks: ``merge`` takes every rank's)."""
        if sampling == "adaptive":
            self.adaptive = AdaptiveSampler(dataset_size or SEED_BUCKETS, floor)
            self._draws = random.Random(f"agilerl-task-adaptive/{seed}/{rank}")

    def with_sampling(self, sampling: TaskSampling, *, floor: float = 0.25) -> TaskAssigner:
        """A fresh assigner over the same tasks, seed and rank that samples another way (the
        trainer applies ``training.task_sampling`` to the collector's assigner with it)."""
        return TaskAssigner(
            self.dataset_size, seed=self.seed, rank=self.rank, world_size=self.world_size, sampling=sampling, floor=floor
        )

    def assign(self, batch_size: int, group_size: int) -> list[Task]:
        """``batch_size * group_size`` tasks, slot ``i`` playing batch item ``i // group_size``."""
        if batch_size < 1 or group_size < 1:
            raise InvalidArgument(f"batch_size and group_size must be >= 1, got {batch_size} and {group_size}")
        with self._lock:
            items = [self._next_task() for _ in range(batch_size)]
        return [task for task in items for _ in range(group_size)]

    def observe(self, trajectories: Iterable[Trajectory]) -> None:
        """Count finished groups (adaptive sampling; uniform ignores them): a group with two or
        more finished rollouts is informative when their rewards differ. One process counts them
        at once; several keep them in ``pending`` until ``merge``."""
        if self.adaptive is None:
            return
        groups: dict[int, list[Trajectory]] = {}
        for traj in trajectories:
            groups.setdefault(traj.group, []).append(traj)
        outcomes = []
        for members in groups.values():
            rewards = [t.total_reward for t in members if t.error is None]
            if len(rewards) >= 2:
                outcomes.append((self._unit(members[0]), max(rewards) > min(rewards)))
        with self._lock:
            if self.world_size == 1:
                self.adaptive.record(outcomes)
            else:
                self.pending += outcomes

    def merge(self, per_rank: Sequence[Sequence[Sequence[Any]]]) -> None:
        """Count every rank's ``pending`` outcomes (gathered, in rank order: every rank calls this
        with the same lists, so all hold the same weights); this rank's pending is cleared."""
        if self.adaptive is None:
            return
        with self._lock:
            for outcomes in per_rank:
                self.adaptive.record((int(unit), bool(informative)) for unit, informative in outcomes)
            self.pending = []

    def state_dict(self) -> dict[str, Any]:
        """The task stream as JSON-able values: the settings and, adaptive, every task handed out
        (about 25 bytes each), the generators, the counts and this rank's pending outcomes."""
        with self._lock:
            state: dict[str, Any] = {
                "sampling": self.sampling,
                "dataset_size": self.dataset_size,
                "seed": self.seed,
                "world_size": self.world_size,
            }
            if self.adaptive is not None:
                state |= {
                    "handed": [list(task) for task in (*self._handed, *self._again)],
                    "draws": state_of(self._draws),
                    "env_seeds": state_of(self._env_seeds),
                    "outcomes": self.adaptive.state(),
                    "pending": self.pending,
                }
            return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take up the stream :meth:`state_dict` saved: its tasks again, in order, then on as it
        would have gone (a freshly built assigner only); a stream of other settings is refused."""
        if self.sampling == state.get("sampling") == "uniform":
            return  # a fresh assigner deals the same stream from seed (a resume may change it, as before)
        mine = {"sampling": self.sampling, "dataset_size": self.dataset_size, "seed": self.seed, "world_size": self.world_size}
        changed = [f"{key} {state.get(key)!r} -> {value!r}" for key, value in mine.items() if state.get(key) != value]
        if changed:
            raise InvalidArgument(
                f"the checkpoint's task stream was drawn with other settings ({'; '.join(changed)}); resume "
                "with the settings it was saved with (training.task_sampling, training.seed, the env's rows, "
                "the number of processes) or start a new run"
            )
        with self._lock:
            self._again = deque(Task(int(seed), None if row is None else int(row)) for seed, row in state["handed"])
            self._handed = []
            restore(self._draws, state["draws"])
            restore(self._env_seeds, state["env_seeds"])
            self.adaptive.load(state["outcomes"])
            self.pending = [(int(unit), bool(flag)) for unit, flag in state["pending"]]

    def _unit(self, traj: Trajectory) -> int:
        """The adaptive sampler's unit of a rollout: its row, or its seed's bucket."""
        if self.dataset_size is not None and traj.row_index is not None:
            return traj.row_index
        return (traj.seed or 0) % SEED_BUCKETS

    def _next_task(self) -> Task:
        if self.adaptive is not None:
            task = self._again.popleft() if self._again else self._adaptive_task(self.adaptive)
            self._handed.append(task)
            return task
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

    def _adaptive_task(self, sampler: AdaptiveSampler) -> Task:
        unit = sampler.draw(self._draws)
        if self.dataset_size is not None:
            return Task(self._env_seeds.randrange(2**31), unit)
        return Task(unit + SEED_BUCKETS * self._draws.randrange(2**31 // SEED_BUCKETS), None)

    def _epoch_rows(self, epoch: int) -> list[int]:
        """This rank's share of the epoch's shuffled rows (equal shares keep ranks in step)."""
        if self.dataset_size is None:
            return []
        rows = list(range(self.dataset_size))
        random.Random(f"agilerl-task-rows/{self.seed}/{epoch}").shuffle(rows)
        share = self.dataset_size // self.world_size
        return rows[self.rank * share : (self.rank + 1) * share]
