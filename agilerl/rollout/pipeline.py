"""RolloutPipeline: collection as a producer of finished groups, the trainer as their consumer.

``take()`` hands the trainer one batch of ``batch_size`` groups. In ``sync`` mode the queue has
depth zero: ``take`` plays the batch itself (``RolloutCollector.collect``) with the weights of
the step it feeds. In ``async`` mode lanes (threads, one group each at a time) play groups
without pause: each draws its task when its group starts, plays it to the end, and puts the
finished group in the queue; the trainer takes groups in the order they finish, so a straggler
holds back only its own group. Weights move forward between two generate calls
(``VersionedPolicy.publish``); an episode in flight goes on across an update, its later tokens
carrying the new version.

The bound (``max_staleness`` N): every generated token entering the update of the weights at
version v was produced by version >= v - N. A lane starts a group only when the group can be
trained within the bound, counting the groups ahead of it (so generation pauses, on a
condition, when it would only produce stale samples or the queue is full). A group whose oldest
token is already past the bound (a straggler overtaken by later groups) is dropped, as soon as
that is known, even mid-episode, and its task is played again from the start: a multi-turn
episode cannot regenerate a stale prefix without replaying the env. Every drop is counted.

Every wait has a bound: a lane that fails ends the run with its error at the next ``take``; no
progress from any lane for ``stall_timeout_s`` is an error naming what each lane was doing.
See docs/async.md.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from agilerl.errors import CollectionError, InvalidArgument
from agilerl.rollout.results import Run, merge_batches
from agilerl.generation.versioned import VersionedPolicy

if TYPE_CHECKING:
    from agilerl.rollout.assigner import Task
    from agilerl.rollout.collector import RolloutCollector
    from agilerl.rollout.results import RolloutBatch
    from agilerl.rollout.trajectory import Trajectory

__all__ = ["RolloutPipeline", "staleness", "stall_bound"]

log = logging.getLogger(__name__)

RolloutMode = Literal["sync", "async"]
_IDLE_WAKE_S = 1.0  # a held lane looks again at least this often (every event that may admit it wakes it at once)


@dataclass(eq=False)
class _Group:
    number: int  # its task's place in the task stream (what a resume replays by)
    task: Task
    batch: RolloutBatch | None = None
    oldest: int | None = None  # the version of its first generation
    replay: bool = False  # dropped once already: never again (the trainer waits for it if it must)
    started_at: int = 0  # the policy version when it started: its oldest token's can only be newer
    run: Run | None = None  # while it plays


@dataclass
class _Lane:
    index: int
    doing: str = "starting"
    since: float = 0.0
    paused_at: float | None = None  # waiting on the bound or the queue since (perf_counter)
    thread: threading.Thread | None = None


class RolloutPipeline:
    """Batches of finished groups for the trainer (see the module doc)."""

    def __init__(
        self,
        collector: RolloutCollector,
        policy: VersionedPolicy,
        *,
        mode: RolloutMode = "sync",
        max_staleness: int = 1,
        groups_per_step: int | None = None,
        lanes: int | None = None,
        stall_timeout_s: float | None = None,
    ) -> None:
        if max_staleness < 0:
            raise InvalidArgument(f"max_staleness must be >= 0, got {max_staleness}")
        self.collector, self.policy, self.mode, self.max_staleness = collector, policy, mode, max_staleness
        self.batch_size = collector.batch_size
        self.groups_per_step = groups_per_step or self.batch_size
        self.stall_timeout_s = stall_timeout_s or stall_bound(collector)
        self._cond = threading.Condition()
        self._queue: collections.deque[_Group] = collections.deque()
        self._replays: collections.deque[tuple[int, Task]] = collections.deque()
        self._taken = 0  # groups handed to the trainer
        self._outstanding = 0  # groups started and not yet taken or dropped
        self._drawn = 0  # the next task number
        self._done_below = 0  # every task number below is trained (or lost)
        self._done: set[int] = set()  # task numbers trained (or lost) above it
        self._handed: list[int] = []  # taken by the trainer, trained once its update is done (``trained``)
        self._error: BaseException | None = None
        self._stopping = False
        self._lost_in_a_row = 0
        self._progress_at = time.monotonic()
        self._since_take = self._interval()
        self._lanes: list[_Lane] = []
        self._in_flight: set[_Group] = set()
        self._unsubscribe = lambda: None
        if mode == "async":
            self._unsubscribe = policy.on_publish(self._wake)  # a new version may admit held groups
            wanted = lanes or self.batch_size * (max_staleness + 1)  # as many groups as the bound admits
            have = collector.num_slots // collector.group_size
            collector.add_groups(wanted - have)
            self._lanes = [_Lane(i) for i in range(wanted)]

    # -- the consumer -----------------------------------------------------------------------------

    def take(self) -> tuple[RolloutBatch, dict[str, float]]:
        """The next batch (``batch_size`` groups) for the update of the weights at the policy's
        current version, and its pipeline metrics (docs/async.md, "Metrics")."""
        if self.mode == "sync":
            return self._take_inline()
        self._start()
        t0 = time.perf_counter()
        version = self.policy.version
        groups: list[_Group] = []
        with self._cond:
            # lanes paused while the trainer was away (an update, an evaluation) were not stalled:
            # the stall clock starts at the latest when the trainer starts waiting
            self._progress_at = max(self._progress_at, time.monotonic())
            depth = len(self._queue)
            while len(groups) < self.batch_size:
                self._raise_failure()
                for group in [g for g in self._queue if g.oldest is not None and version - g.oldest > self.max_staleness]:
                    self._queue.remove(group)
                    self._outstanding -= 1
                    self._drop_stale(group, group.batch)
                if len(self._queue) < self.batch_size - len(groups) or self._last_chance_in_flight(version):
                    self._cond.wait(timeout=1.0)
                    self._check_stall()
                    continue
                # replays first (a task dropped once is never dropped again), then in finish order
                ordered = sorted(self._queue, key=lambda g: not g.replay)[: self.batch_size - len(groups)]
                for group in ordered:
                    self._queue.remove(group)
                    self._outstanding -= 1
                    groups.append(group)
                    self._taken += 1
                    self._handed.append(group.number)
            self._cond.notify_all()  # room in the queue: paused lanes may start
        batch = merge_batches([g.batch for g in groups if g.batch is not None])
        return batch, self._metrics(batch, version, depth, time.perf_counter() - t0)

    def _take_inline(self) -> tuple[RolloutBatch, dict[str, float]]:
        """Depth zero: the batch is played now, with the weights it trains."""
        t0 = time.perf_counter()
        batch = self.collector.collect(self.policy)
        waited = time.perf_counter() - t0
        # sync trains the task stream in order, lost groups included
        with self._cond:
            self._handed.extend(range(self._taken, self._taken + self.batch_size))
            self._taken += self.batch_size
            self._drawn = self._taken
        self._since_take["tokens"] += batch.stats.generated_tokens
        return batch, self._metrics(batch, self.policy.version, 0, waited)

    def trained(self) -> None:
        """The update of every batch taken so far is done: their tasks count as trained from now
        on. Until then a checkpoint (one saved on an interrupt or a failure between a ``take``
        and the end of its update) counts them as not trained, and a resume replays them."""
        with self._cond:
            for number in self._handed:
                self._finish_task(number)
            self._handed.clear()

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: which task numbers were trained, so a resume replays the rest
        (the groups in flight, and those taken for an update that never finished, are dropped)
        and none twice."""
        with self._cond:
            taken = self._taken - len(self._handed)
            return {"trained_below": self._done_below, "trained": sorted(self._done), "taken": taken}

    def resume(self, steps: int, state: dict[str, Any] | None = None) -> None:
        """Continue after ``steps`` trained steps. Sync passes over their tasks. Async restores
        the task stream of ``state`` (its checkpoint's): tasks drawn but never trained come
        first; without one (a sync run's checkpoint) the first ``steps`` steps' tasks count as
        trained, as sync would have drawn them."""
        done = steps * self.groups_per_step
        if self.mode == "sync":
            self.collector.skip(steps * self.groups_per_step // self.batch_size)
            self._taken = self._drawn = self._done_below = done
            return
        if "trained_below" not in (state or {}):
            state = {"trained_below": done, "trained": [], "taken": done}
        below, trained = int(state["trained_below"]), set(state["trained"])
        end = max(trained, default=below - 1) + 1
        for number in range(end):
            task = self.collector.assigner.assign(1, self.collector.group_size)[0]
            if number >= below and number not in trained:
                self._replays.append((number, task))
        self._drawn, self._done_below, self._done = end, below, trained
        self._taken = int(state["taken"])

    def close(self) -> None:
        """Stop the lanes (groups in flight are dropped); waits a bounded time for them."""
        with self._cond:
            if not self._stopping:
                self._unsubscribe()
            self._stopping = True
            self._cond.notify_all()
        deadline = time.monotonic() + 10.0
        for lane in self._lanes:
            if lane.thread is not None:
                lane.thread.join(timeout=max(0.0, deadline - time.monotonic()))

    def __enter__(self) -> RolloutPipeline:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the lanes --------------------------------------------------------------------------------

    def _start(self) -> None:
        for lane in self._lanes:
            if lane.thread is None:
                lane.since = time.monotonic()
                lane.thread = threading.Thread(
                    target=self._lane, args=(lane,), name=f"agilerl-lane-{lane.index}", daemon=True
                )
                lane.thread.start()

    def _lane(self, lane: _Lane) -> None:
        try:
            while True:
                group = self._admit(lane)
                if group is None:
                    return
                self._play(lane, group)
        except BaseException as exc:  # the trainer raises it at its next take
            with self._cond:
                exc.add_note(f"in rollout lane {lane.index} (slot-group {lane.index}), while it was {lane.doing}")
                self._error = self._error or exc
                self._cond.notify_all()

    def _admit(self, lane: _Lane) -> _Group | None:
        """The lane's next group, once it can be trained within the bound; None when stopping."""
        with self._cond:
            self._set(lane, "waiting for the bound or queue room")
            lane.paused_at = time.perf_counter()
            while not self._stopping and not self._admissible():
                self._cond.wait(timeout=_IDLE_WAKE_S)  # woken by a take, a finished group or a publish
            self._since_take["paused_s"] += time.perf_counter() - lane.paused_at
            lane.paused_at = None
            if self._stopping:
                return None
            self._outstanding += 1
            replay = bool(self._replays)
            if replay:
                number, task = self._replays.popleft()
            else:
                number, task = self._drawn, self.collector.assigner.assign(1, self.collector.group_size)[0]
                self._drawn += 1
            self._set(lane, f"playing task {number}")
            group = _Group(number, task, replay=replay, started_at=self.policy.version)
            self._in_flight.add(group)
            return group

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _last_chance_in_flight(self, version: int) -> bool:
        """A replayed group still playing whose oldest token this update is the last one to
        accept: the trainer waits for it rather than drop it a second time."""
        return any(g.replay and version - _oldest_so_far(g) >= self.max_staleness for g in self._in_flight)

    def _admissible(self) -> bool:
        """A group started now would enter the update of version ``(taken + ahead) // P``
        (P groups per step, all groups ahead of it first); the generator's version must be
        within ``max_staleness`` of it."""
        target = (self._taken + self._outstanding) // self.groups_per_step
        return target - self.policy.version <= self.max_staleness

    def _play(self, lane: _Lane, group: _Group) -> None:
        def stop(run: Run) -> bool:
            self._progress_at = time.monotonic()
            group.run = run
            if self._stopping:
                return True
            doomed = run.oldest_version is not None and self.policy.version - run.oldest_version > self.max_staleness
            return doomed and not group.replay

        try:
            run = self.collector.play_group(lane.index, group.task, self.policy, stop=stop)
        finally:
            with self._cond:
                self._in_flight.discard(group)
        group.oldest = run.oldest_version
        with self._cond:
            self._since_take["tokens"] += run.generated_tokens
            self._progress_at = time.monotonic()
            if self._stopping:
                return
            if len(run.trajectories) < len(run.tasks):  # stopped early: past the bound already
                self._outstanding -= 1
                self._drop_stale(group, None, tokens=run.generated_tokens)
                return
            try:
                group.batch = run.batch(0.0, min_finished=min(2, self.collector.group_size))
            except CollectionError as exc:  # every rollout of the group was lost
                self._lost(group, exc)
                return
            self._lost_in_a_row = 0
            self._queue.append(group)
            self._set(lane, "queued its group")
            self._cond.notify_all()

    def _lost(self, group: _Group, exc: CollectionError) -> None:
        """A group with no finished rollout leaves the run (as in sync mode); many in a row end it."""
        self._outstanding -= 1
        self._finish_task(group.number)
        self._since_take["lost_groups"] += 1
        self._lost_in_a_row += 1
        if self._lost_in_a_row >= 2 * max(1, len(self._lanes)):
            self._error = CollectionError(f"the last {self._lost_in_a_row} groups were all lost; the last: {exc}")
        self._cond.notify_all()

    def _drop_stale(self, group: _Group, batch: RolloutBatch | None, *, tokens: int | None = None) -> None:
        """Past the bound: dropped, counted, and its task played again (it keeps its number)."""
        if tokens is None and batch is not None:
            tokens = sum(sum(t.action_mask) for t in batch.trajectories)
        self._since_take["dropped_stale"] += 1
        self._since_take["dropped_stale_tokens"] += tokens or 0
        self._replays.appendleft((group.number, group.task))
        self._cond.notify_all()

    # -- bookkeeping ------------------------------------------------------------------------------

    def _finish_task(self, number: int) -> None:
        self._done.add(number)
        while self._done_below in self._done:
            self._done.remove(self._done_below)
            self._done_below += 1

    def _set(self, lane: _Lane, doing: str) -> None:
        lane.doing, lane.since = doing, time.monotonic()

    def _raise_failure(self) -> None:
        if self._error is not None:
            self._stopping = True
            self._cond.notify_all()
            raise self._error

    def _check_stall(self) -> None:
        """No lane finished a turn for ``stall_timeout_s``: a hung generator or env; name it."""
        quiet = time.monotonic() - self._progress_at
        if quiet < self.stall_timeout_s:
            return
        now = time.monotonic()
        lanes = "; ".join(f"lane {lane.index}: {lane.doing} for {now - lane.since:.0f} s" for lane in self._lanes)
        self._error = CollectionError(
            f"no rollout lane made progress for {quiet:.0f} s (stall_timeout_s={self.stall_timeout_s:.0f}): "
            f"{lanes}. A generator or env that hangs is the usual cause; the last checkpoint is the one to resume from."
        )
        self._raise_failure()

    def _interval(self) -> dict[str, float]:
        return dict.fromkeys(("tokens", "paused_s", "dropped_stale", "dropped_stale_tokens", "lost_groups"), 0.0) | {
            "t0": time.perf_counter()
        }

    def _metrics(self, batch: RolloutBatch, version: int, depth: int, waited: float) -> dict[str, float]:
        with self._cond:
            since, self._since_take = self._since_take, self._interval()
            now = time.perf_counter()
            for lane in self._lanes:  # pauses still going on count up to now
                if lane.paused_at is not None:
                    since["paused_s"] += now - lane.paused_at
                    lane.paused_at = now
        elapsed = max(time.perf_counter() - since["t0"], 1e-9)
        metrics = {
            "train/reward": batch.stats.reward_mean,
            **batch.stats.metrics(),
            "rollout/groups_dropped": batch.stats.groups_dropped + since["lost_groups"],
            "rollout/tokens_per_s": since["tokens"] / elapsed,
            "train/wait_s": waited,
        }
        if self.mode == "sync":  # on-policy, no queue, nothing dropped, never paused: nothing more to say
            return metrics
        mean, most = staleness(batch.trajectories, version)
        return metrics | {
            "rollout/staleness_mean": mean,
            "rollout/staleness_max": most,
            "rollout/queue_depth": float(depth),
            "rollout/dropped_stale": since["dropped_stale"],
            "rollout/dropped_stale_tokens": since["dropped_stale_tokens"],
            "rollout/wait_s": since["paused_s"] / max(1, len(self._lanes)),
        }


def staleness(trajectories: list[Trajectory], version: int) -> tuple[float, float]:
    """Mean and max, over the generated tokens of rollouts that enter the update, of how many
    versions older than ``version`` their weights were (0, 0 when none carries versions)."""
    total = count = most = 0
    for traj in trajectories:
        if traj.error is not None or traj.versions is None:
            continue
        for made, generated in zip(traj.versions, traj.action_mask):
            if generated:
                lag = version - made
                total += lag
                count += 1
                most = max(most, lag)
    return (total / count if count else 0.0), float(most)


def _oldest_so_far(group: _Group) -> int:
    """The oldest version a playing group's tokens can have: its first generation's, or before
    that (or before the lane has recorded it), the version it started under."""
    known = group.run.oldest_version if group.run is not None else None
    return known if known is not None else group.started_at


def stall_bound(collector: RolloutCollector) -> float:
    """Long enough for the slowest legitimate turn (an env call up to its timeout, retried, and
    a generation), short enough that a hang is named within minutes."""
    env = collector.env_timeout_s or 300.0
    return env * (collector.episode_retries + 1) + 300.0
