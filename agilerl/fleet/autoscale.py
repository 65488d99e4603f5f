"""``replicas: auto``: how many replicas a fleet runs, from the sessions the run needs and what
one replica admits; more when a session is refused for capacity, fewer when replicas sit idle.

Pure logic with an injected clock: the ``Fleet`` asks ``target`` on its health tick and starts or
stops replicas to match. Growth is at once (a refused session waits in backoff); shrinking is
one replica at a time, only after one sat idle ``shrink_after_s`` and as long after the last
growth (hysteresis: a fleet never flaps between two sizes on every tick).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from agilerl.errors import InvalidArgument

__all__ = ["Autoscaler", "sessions_needed"]

DEFAULT_SHRINK_AFTER_S = 60.0
"""A replica idle this long (and as long after the last growth) may be stopped."""


def sessions_needed(training: Any) -> int:
    """The sessions a run holds at once (``training:`` settings): ``batch_size x group_size``
    rollouts per lane (async: ``max_staleness + 1`` lanes), plus the evaluation's episodes when it
    evaluates."""
    lanes = training.max_staleness + 1 if training.rollout_mode == "async" else 1
    evaluation = training.eval_episodes if training.evaluation_interval else 0
    return training.batch_size * training.group_size * lanes + evaluation


class Autoscaler:
    """The size of a ``replicas: auto`` fleet, between ``minimum`` and ``maximum`` replicas of
    ``per_replica`` sessions each (``max_concurrent_envs``)."""

    def __init__(
        self,
        per_replica: int,
        *,
        minimum: int = 1,
        maximum: int,
        shrink_after_s: float = DEFAULT_SHRINK_AFTER_S,
    ) -> None:
        if per_replica < 1:
            raise InvalidArgument(f"max_concurrent_envs must be at least 1, not {per_replica!r}.")
        if not 1 <= minimum <= maximum:
            raise InvalidArgument(f"replicas: auto needs 1 <= minimum <= maximum (got {minimum}, {maximum}).")
        self.per_replica = per_replica
        self.minimum, self.maximum = minimum, maximum
        self.shrink_after_s = shrink_after_s
        self._grew_at: float | None = None

    @classmethod
    def for_run(cls, needed: int, per_replica: int, **kwargs: Any) -> Autoscaler:
        """Bounded at twice the size the run's sessions need (at least 2): growth past that means
        sessions leak or the env admits fewer than it says, and more replicas would not help."""
        return cls(per_replica, maximum=max(2, 2 * math.ceil(needed / per_replica)), **kwargs)

    def floor(self, needed: int) -> int:
        """The replicas ``needed`` sessions fill, within the bounds: the size to start with, and
        below which the fleet never shrinks."""
        return min(self.maximum, max(self.minimum, math.ceil(needed / self.per_replica)))

    def target(
        self,
        needed: int,
        in_use: int,
        refused_recently: int,
        idle_since: Sequence[float | None],
        now: float,
    ) -> int:
        """The replicas to run now. ``idle_since`` has one entry per running replica: the time
        since which it has held no session (None while it holds one); ``refused_recently`` counts
        the sessions refused for capacity (``CAPACITY_REACHED``) since the last call; ``in_use``
        the sessions open now."""
        current = len(idle_since)
        floor = self.floor(needed)
        if refused_recently > 0:
            if current < self.maximum:
                self._grew_at = now
            grown = current + math.ceil(refused_recently / self.per_replica)
            return max(floor, min(self.maximum, grown))
        if current <= floor:
            return floor
        if self._grew_at is not None and now - self._grew_at < self.shrink_after_s:
            return current
        idle = [t for t in idle_since if t is not None and now - t >= self.shrink_after_s]
        if idle and in_use <= (current - 1) * self.per_replica:
            return current - 1
        return current
