"""What a collection returns (``RolloutBatch``, ``CollectStats``, ``EvalResult``) and the
bookkeeping (``Run``) that builds it while the collector plays."""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, replace

from agilerl.errors import CollectionError, EnvProtocolError, InvalidArgument, ObservationError
from agilerl.rollout.assigner import Task
from agilerl.rollout.trajectory import Trajectory

__all__ = [
    "SlotFailure",
    "CollectStats",
    "RolloutBatch",
    "EvalResult",
    "ENV_CHECK_HINT",
    "Run",
    "end_of_last_action",
    "merge_batches",
    "evaluation_episodes",
]


@dataclass
class SlotFailure:
    """One failed attempt at a rollout: where (``create``/``reset``/``step``/``context``), why, and
    whether the slot played its task again (``retried``) or the rollout was lost."""

    slot: int
    group: int
    phase: str
    error: str
    retried: bool = False


@dataclass
class CollectStats:
    """What one ``collect`` cost and earned. Rewards are over the rollouts that finished: a lost
    rollout leaves its group's statistics (see docs/collector.md, "When an env fails").
    ``informative_groups`` counts the groups whose finished rewards differ (the others teach a
    group-relative algorithm nothing)."""

    reward_mean: float
    reward_std: float
    group_reward_mean: list[float]
    group_reward_std: list[float]
    turns_mean: float
    generated_tokens: int
    generation_calls: int
    generation_time_s: float
    env_time_s: float
    wall_time_s: float
    truncated: int
    retries: int = 0
    lost: int = 0
    groups_dropped: int = 0
    context_truncated: int = 0
    context_restarts: int = 0
    context_truncations: int = 0
    informative_groups: int = 0
    failures: list[SlotFailure] = field(default_factory=list)

    def metrics(self) -> dict[str, float]:
        """Flat numbers for a logger."""
        skip = {"group_reward_mean", "group_reward_std", "failures"}
        numbers = {f"rollout/{k}": float(v) for k, v in asdict(self).items() if k not in skip}
        numbers["rollout/failures"] = float(len(self.failures))
        return numbers


@dataclass
class RolloutBatch:
    """Trajectories in slot order (group ``g`` is slots ``g*G .. g*G+G-1``) and their stats."""

    trajectories: list[Trajectory]
    group_size: int
    stats: CollectStats

    @property
    def groups(self) -> list[list[Trajectory]]:
        g = self.group_size
        return [self.trajectories[i : i + g] for i in range(0, len(self.trajectories), g)]


@dataclass
class EvalResult:
    """Greedy evaluation: mean reward, and accuracy (reward / max_reward) when that is known;
    ``failures`` episodes were lost, after ``retries`` replays in all."""

    mean_reward: float
    accuracy: float | None
    episodes: int
    failures: int
    retries: int = 0


ENV_CHECK_HINT = (
    "`agilerl env check MANIFEST` (or ENTRYPOINT) plays the env on its own and names what it "
    "does wrong"
)

_NOT_REPLAYED = (TimeoutError, EnvProtocolError, ObservationError)
"""Failures a replay would only repeat: the collector's own ``env_timeout_s`` costs the whole
wait again, and a protocol or observation error is the env's code or its configuration, the same
on every attempt. A remote ``RemoteEnvTimeout`` is replayed (up to ``episode_retries``): a peer
that vanished without closing its socket is an outage like one that closed it, and the replay's
reset reconnects (another replica, or the server back up)."""


class Run:
    """The bookkeeping of one collection: a trajectory per slot, failures and replays, counters.

    A slot whose attempt fails is replayed (its task again, from ``reset``) up to ``retries``
    times; ``take_replays`` hands the collector the slots to start again."""

    def __init__(self, tasks: dict[int, Task], group_size: int, *, retries: int = 0) -> None:
        self.tasks = tasks
        self.group_size = group_size
        self.retries = retries
        self.trajectories: dict[int, Trajectory] = {}
        self.failures: list[SlotFailure] = []
        self.generation_time_s = 0.0
        self.env_time_s = 0.0
        self.generation_calls = 0
        self.generated_tokens = 0
        self.context_truncated = 0
        self.context_rewrites = {"restart": 0, "truncate": 0}  # context_policy's rewrites, by kind
        self.oldest_version: int | None = None  # the policy version of the first generation (async)
        self._attempts: dict[int, int] = {}
        self._replays: list[int] = []

    def finish(self, slot: int, traj: Trajectory, *, cut_at: int | None = None) -> None:
        """Record a slot's ended episode; ``cut_at`` marks a context overflow and cuts it there,
        after the last generated token (what follows would not fit)."""
        if cut_at is not None:
            traj = _cut(traj, cut_at)
            traj.truncated = True
            traj.info["truncated_by"] = "max_model_len"
            self.context_truncated += 1
        traj.group = slot // self.group_size
        self.trajectories[slot] = traj

    def fail(self, slot: int, phase: str, exc: BaseException, partial: Trajectory | None) -> bool:
        """Record a failed attempt; True when the slot plays its task again (see the class doc)."""
        attempt = self._attempts.get(slot, 0)
        self._attempts[slot] = attempt + 1
        replay = attempt < self.retries and not isinstance(exc, _NOT_REPLAYED)
        message = f"{type(exc).__name__}: {exc}"
        group = slot // self.group_size
        self.failures.append(SlotFailure(slot, group, phase, message, retried=replay))
        if replay:
            self._replays.append(slot)
            return True
        self._lose(slot, partial, f"{phase}: {message}")
        return False

    def overflow(self, slot: int, why: str) -> None:
        """The episode cannot start within the model's context: lost, before any model work."""
        self.context_truncated += 1
        self.failures.append(SlotFailure(slot, slot // self.group_size, "context", why))
        self._lose(slot, None, f"context: {why}")

    def rewrote_context(self, policy: str) -> None:
        """Count one rewrite of an episode's context (``context_policy``: restart or truncate)."""
        self.context_rewrites[policy] += 1

    def take_replays(self) -> list[int]:
        """The slots to start again from ``reset``, in order (each once)."""
        replays, self._replays = self._replays, []
        return replays

    @property
    def replayed(self) -> int:
        return sum(f.retried for f in self.failures)

    def _lose(self, slot: int, partial: Trajectory | None, error: str) -> None:
        task = self.tasks[slot]
        traj = partial or Trajectory(seed=task.seed, row_index=task.row_index)
        traj.group, traj.error = slot // self.group_size, error
        self.trajectories[slot] = traj

    def batch(self, wall_time_s: float, *, min_finished: int = 1) -> RolloutBatch:
        """The batch, with every group left with fewer than ``min_finished`` finished rollouts
        dropped whole (too few to compare); raises when no group is left."""
        trajectories = [self.trajectories[s] for s in sorted(self.tasks)]
        lost = sum(t.error is not None for t in trajectories)
        dropped = _drop_small_groups(trajectories, min_finished)
        finished = [t for t in trajectories if t.error is None]
        if not finished:
            raise CollectionError(self._nothing_left(len(trajectories), lost, min_finished))
        rewards = [t.total_reward for t in finished]
        groups: dict[int, list[float]] = {}
        for t in trajectories:
            groups.setdefault(t.group, [])
            if t.error is None:
                groups[t.group].append(t.total_reward)
        stats = CollectStats(
            reward_mean=statistics.fmean(rewards),
            reward_std=_pstdev(rewards),
            group_reward_mean=[statistics.fmean(g) if g else 0.0 for g in groups.values()],
            group_reward_std=[_pstdev(g) if g else 0.0 for g in groups.values()],
            turns_mean=statistics.fmean(t.num_turns for t in finished),
            generated_tokens=self.generated_tokens,
            generation_calls=self.generation_calls,
            generation_time_s=self.generation_time_s,
            env_time_s=self.env_time_s,
            wall_time_s=wall_time_s,
            truncated=sum(t.truncated for t in finished),
            retries=self.replayed,
            lost=lost,
            groups_dropped=dropped,
            context_truncated=self.context_truncated,
            context_restarts=self.context_rewrites["restart"],
            context_truncations=self.context_rewrites["truncate"],
            informative_groups=sum(len(g) > 1 and max(g) > min(g) for g in groups.values()),
            failures=self.failures,
        )
        return RolloutBatch(trajectories, self.group_size, stats)

    def first_loss(self) -> str:
        """The first failure that lost a rollout (else the first failure), as ``slot S, in PHASE: ...``."""
        first = next((f for f in self.failures if not f.retried), self.failures[0])
        return f"slot {first.slot}, in {first.phase}: {first.error}"

    def _nothing_left(self, total: int, lost: int, min_finished: int) -> str:
        if lost == total:
            head = f"all {total} rollouts failed"
        else:
            head = (
                f"no group kept the {min_finished} finished rollouts it needs to compare "
                f"({lost} of {total} rollouts were lost)"
            )
        return f"{head}; the first, {self.first_loss()}. {ENV_CHECK_HINT}."


def merge_batches(batches: list[RolloutBatch]) -> RolloutBatch:
    """One batch of the groups of ``batches`` (one group each in the async pipeline), renumbered
    ``0..n-1`` in the given order; costs add up, rewards are over all finished rollouts."""
    if not batches:
        raise CollectionError("no group to train on")
    trajectories: list[Trajectory] = []
    group_size = batches[0].group_size
    offset = 0
    for batch in batches:
        renumber = {g: offset + i for i, g in enumerate(sorted({t.group for t in batch.trajectories}))}
        offset += len(renumber)
        for traj in batch.trajectories:
            traj.group = renumber[traj.group]
        trajectories += batch.trajectories
    stats = [b.stats for b in batches]
    finished = [t.total_reward for t in trajectories if t.error is None]
    merged = CollectStats(
        reward_mean=statistics.fmean(finished) if finished else 0.0,
        reward_std=_pstdev(finished) if finished else 0.0,
        group_reward_mean=[m for s in stats for m in s.group_reward_mean],
        group_reward_std=[m for s in stats for m in s.group_reward_std],
        turns_mean=statistics.fmean(t.num_turns for t in trajectories if t.error is None) if finished else 0.0,
        generated_tokens=sum(s.generated_tokens for s in stats),
        generation_calls=sum(s.generation_calls for s in stats),
        generation_time_s=sum(s.generation_time_s for s in stats),
        env_time_s=sum(s.env_time_s for s in stats),
        wall_time_s=max(s.wall_time_s for s in stats),
        truncated=sum(s.truncated for s in stats),
        retries=sum(s.retries for s in stats),
        lost=sum(s.lost for s in stats),
        groups_dropped=sum(s.groups_dropped for s in stats),
        context_truncated=sum(s.context_truncated for s in stats),
        context_restarts=sum(s.context_restarts for s in stats),
        context_truncations=sum(s.context_truncations for s in stats),
        informative_groups=sum(s.informative_groups for s in stats),
        failures=[f for s in stats for f in s.failures],
    )
    return RolloutBatch(trajectories, group_size, merged)


def _drop_small_groups(trajectories: list[Trajectory], min_finished: int) -> int:
    """Mark the finished rollouts of groups too small to compare as lost; how many groups went."""
    by_group: dict[int, list[Trajectory]] = {}
    for t in trajectories:
        by_group.setdefault(t.group, []).append(t)
    dropped = 0
    for members in by_group.values():
        finished = [t for t in members if t.error is None]
        if finished and len(finished) < min_finished:
            dropped += 1
            for t in finished:
                t.error = (
                    f"group dropped: {len(finished)} of its {len(members)} rollouts finished, "
                    f"fewer than the {min_finished} needed to compare"
                )
        elif not finished:
            dropped += 1
    return dropped


def _pstdev(values: list[float]) -> float:
    """Population standard deviation in plain floats (``statistics.pstdev`` works in exact
    fractions: a third of a millisecond per batch of 64)."""
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / len(values))


def end_of_last_action(traj: Trajectory) -> int:
    """Where the last generated token ends (the whole prompt when nothing was generated)."""
    mask = traj.action_mask
    return next((i + 1 for i in range(len(mask) - 1, -1, -1) if mask[i]), len(mask))


def _cut(traj: Trajectory, num_tokens: int) -> Trajectory:
    """A copy of ``traj`` cut to its first ``num_tokens`` tokens and the turns they hold (its
    earlier samples' turns included); a last sample left without a generated token is dropped."""
    if traj.prior_samples and not any(traj.action_mask[:num_tokens]):  # a fresh context never answered
        last = traj.prior_samples[-1]
        traj = replace(
            traj, prior_samples=traj.prior_samples[:-1], token_ids=last.token_ids, action_mask=last.action_mask,
            turn_ids=last.turn_ids, logprobs=last.logprobs, versions=last.versions, media=last.media,
        )
        num_tokens = len(traj.token_ids)
    earlier = (t for sample in traj.prior_samples for t in sample.turn_ids)
    turns = max((*traj.turn_ids[:num_tokens], *earlier), default=-1) + 1
    return replace(
        traj,
        token_ids=traj.token_ids[:num_tokens],
        action_mask=traj.action_mask[:num_tokens],
        turn_ids=traj.turn_ids[:num_tokens],
        logprobs=None if traj.logprobs is None else traj.logprobs[:num_tokens],
        versions=None if traj.versions is None else traj.versions[:num_tokens],
        media=None if traj.media is None else traj.media.cut(traj.token_ids[:num_tokens], traj.action_mask[:num_tokens]),
        rewards=traj.rewards[:turns],
        info=dict(traj.info),
    )


def evaluation_episodes(held_out: int | None, num_episodes: int | None, source: str) -> int:
    """How many greedy evaluation episodes to play: the held-out rows (all, or the first
    ``num_episodes``), else ``num_episodes`` seeds; ``source`` names what has no held-out split."""
    if num_episodes is None:
        if held_out is None:
            raise InvalidArgument(f"{source} has no held-out split (eval_dataset_size): pass num_episodes=")
        num_episodes = held_out
    if held_out is not None:
        num_episodes = min(num_episodes, held_out)
    if num_episodes < 1:
        raise InvalidArgument(f"evaluation needs at least one episode, got num_episodes={num_episodes}")
    return num_episodes
