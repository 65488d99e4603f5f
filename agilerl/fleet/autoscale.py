"""``replicas: auto``: how many replicas a fleet runs, from the sessions the run needs and what
one replica admits; more when a session is refused for capacity, fewer when replicas sit idle.

Pure logic with an injected clock: the ``Fleet`` asks ``target`` on its health tick and starts or
stops replicas to match. Growth is at once (a refused session waits in backoff); shrinking is
one replica at a time, only after one sat idle ``shrink_after_s`` and as long after the last
growth (hysteresis: a fleet never flaps between two sizes on every tick).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from agilerl.errors import InvalidArgument, ReplicaStartError
from agilerl.fleet.provider import ReplicaSpec

if TYPE_CHECKING:
    from agilerl.fleet.fleet import Fleet

__all__ = ["AutoScaler", "AutoSizing", "autoscaler"]

log = logging.getLogger(__name__)

DEFAULT_SHRINK_AFTER_S = 60.0
"""A replica idle this long (and as long after the last growth) may be stopped."""
MAX_REPLICAS = 1024
"""The most replicas ``auto`` runs, whatever the sessions (the bound a manifest's ``replicas`` has)."""


class AutoSizing:
    """The size of a ``replicas: auto`` fleet, between ``minimum`` and ``maximum`` replicas of
    ``per_replica`` sessions each (``max_concurrent_envs``)."""

    def __init__(
        self,
        per_replica: int,
        *,
        minimum: int = 1,
        maximum: int | None = None,
        shrink_after_s: float = DEFAULT_SHRINK_AFTER_S,
    ) -> None:
        if per_replica < 1:
            raise InvalidArgument(f"max_concurrent_envs must be at least 1, not {per_replica!r}.")
        if minimum < 1 or (maximum is not None and maximum < minimum):
            raise InvalidArgument(f"replicas: auto needs 1 <= minimum <= maximum (got {minimum}, {maximum}).")
        self.per_replica = per_replica
        self.minimum, self.maximum = minimum, maximum
        self.shrink_after_s = shrink_after_s
        self._grew_at: float | None = None

    def bound(self, needed: int) -> int:
        """The most replicas: ``maximum``, else twice what ``needed`` sessions fill (at least 2):
        growth past that means sessions leak or the env admits fewer than it says, and more
        replicas would not help."""
        if self.maximum is not None:
            return self.maximum
        return min(MAX_REPLICAS, max(self.minimum, 2, 2 * math.ceil(needed / self.per_replica)))

    def floor(self, needed: int) -> int:
        """The replicas ``needed`` sessions fill, within the bounds: the size to start with, and
        below which the fleet never shrinks."""
        return min(self.bound(needed), max(self.minimum, math.ceil(needed / self.per_replica)))

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
        floor, bound = self.floor(needed), self.bound(needed)
        if refused_recently > 0:
            if current < bound:
                self._grew_at = now
            grown = current + math.ceil(refused_recently / self.per_replica)
            return max(floor, min(bound, grown))
        if current <= floor:
            return floor
        if self._grew_at is not None and now - self._grew_at < self.shrink_after_s:
            return current
        idle = [t for t in idle_since if t is not None and now - t >= self.shrink_after_s]
        if idle and in_use <= (current - 1) * self.per_replica:
            return current - 1
        return current


class AutoScaler:
    """The ``Fleet``'s scaler for ``replicas: auto``: on each health tick, reads the fleet's load
    and asks ``AutoSizing.target`` how many replicas to run, then starts or stops them.

    The sessions needed are the larger of ``sessions`` (what the caller holds, when it says: a
    collector's slots and its evaluation slot) and the clients alive on the fleet (each may hold
    a session at any moment, whoever made it: async lanes, an evaluation's own collector)."""

    def __init__(
        self, sizing: AutoSizing, sessions: int | None = None, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.sizing = sizing
        self.sessions = sessions or 0
        self._clock = clock
        self._idle: dict[str, float] = {}  # url -> since when it held no session
        self._refused_seen = 0

    def tick(self, fleet: Fleet) -> None:
        now = self._clock()
        load = fleet.load()
        for url, sessions in load:
            if url is not None and sessions == 0:
                self._idle.setdefault(url, now)
            elif url is not None:
                self._idle.pop(url, None)
        up = {url for url, _ in load}
        self._idle = {url: t for url, t in self._idle.items() if url in up}
        refused, self._refused_seen = fleet.refused - self._refused_seen, fleet.refused
        target = self.sizing.target(
            max(self.sessions, fleet.clients),
            in_use=sum(sessions for _, sessions in load),
            refused_recently=refused,
            idle_since=[self._idle.get(url) if url is not None else None for url, _ in load],
            now=now,
        )
        if target > len(load):
            self._grow(fleet, target - len(load))
            # The sessions refused while those replicas started were refused for the room they
            # now give: counted at the next tick, each would grow the fleet again (an overshoot).
            self._refused_seen = fleet.refused
        elif target < len(load) and self._idle:
            longest = min(self._idle, key=self._idle.__getitem__)
            if fleet.remove_replica(longest):
                self._idle.pop(longest)

    @staticmethod
    def _grow(fleet: Fleet, count: int) -> None:
        """Start ``count`` replicas at once (each through the fleet's start limiter)."""

        def add() -> None:
            try:
                fleet.add_replica()
            except ReplicaStartError as exc:  # the next tick asks again
                log.error("env fleet: a replica added for replicas: auto did not start (%s)", exc)

        threads = [threading.Thread(target=add, daemon=True) for _ in range(count)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def autoscaler(spec: ReplicaSpec, sessions: int | None = None) -> tuple[int, AutoScaler]:
    """``replicas: auto`` for ``spec``: the replicas to start with (what ``sessions`` fill, at
    least one), and the scaler that keeps the size right from then on."""
    sizing = AutoSizing(spec.max_concurrent_envs)
    return sizing.floor(sessions or 0), AutoScaler(sizing, sessions)
