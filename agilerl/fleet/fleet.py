"""``Fleet``: the replicas of one env, balanced by free capacity, health-checked, replaced when
they die, and stopped when the run ends however it ends.

Sessions go to the replica with the most free sessions (``pick``); the remote client reports
each session's end (``released``) and each connection that failed (``failed``). A replica that
is dead, or misses two health checks in a row, is replaced; the sessions it held fail at the
client and are replayed by the collector's outage replay (a dead replica costs a replay, never
a lost or doubled episode). Every fleet still open when the process exits is closed then.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import sys
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Protocol

from agilerl.fleet.health import healthy, metadata_of
from agilerl.fleet.limits import StartLimiter, start_with_retry
from agilerl.fleet.provider import Provider, Replica, ReplicaSpec, ReplicaStartError
from agilerl.remote.connection import ConnectionLost

__all__ = ["Fleet", "Scaler", "fleet_metrics"]

log = logging.getLogger(__name__)

START_ATTEMPTS = 3
"""Tries of a start whose failure is ``retryable`` (with backoff) before it counts as failed."""


class Scaler(Protocol):
    """Sizes a fleet (``replicas: auto``): called on every health tick, it may ``add_replica`` or
    ``remove_replica``; ``fleet.refused`` counts the sessions that found every replica full."""

    def tick(self, fleet: Fleet) -> None: ...


@dataclass
class _Slot:
    index: int
    replica: Replica | None
    capacity: int
    sessions: int = 0
    suspect: bool = False  # a connection to it failed: no new sessions until a health check passes
    misses: int = 0  # health checks failed in a row


class Fleet:
    """``replicas`` servers of ``spec`` started by ``provider``; the picker a ``RemoteEnvClient`` takes."""

    def __init__(
        self,
        spec: ReplicaSpec,
        provider: Provider,
        replicas: int,
        *,
        start_timeout_s: float = 300.0,
        health_interval_s: float = 2.0,
        health_timeout_s: float = 5.0,
        max_replacements: int | None = None,
        scaler: Scaler | None = None,
        limiter: StartLimiter | None = None,
    ) -> None:
        self.spec = spec
        self.provider = provider
        self.size = replicas
        self.start_timeout_s = start_timeout_s
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        self.max_replacements = max_replacements if max_replacements is not None else 4 * replicas + 4
        """Replacement starts tried over the run; past it a dead replica stays down (bounded)."""
        self.scaler = scaler
        self.limiter = limiter
        """Every start passes it (``max_starts_per_s``): the first ones, replacements, growth, retries."""
        self.clients = 0
        """The clients alive that place sessions here: each may hold one at any moment (a scaler's demand)."""
        self.replaced = 0
        self.refused = 0
        self.start_s = 0.0
        """Seconds spent starting replicas (the first start includes building the venv)."""
        self._slots: list[_Slot] = []
        self._indexes = itertools.count()
        self._turn = itertools.count()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._monitor: threading.Thread | None = None
        self._replace_tries = 0

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Fleet:
        """Start every replica (the first alone: it may build the venv), then the health checks."""
        _LIVE.add(self)
        try:
            self.add_replica()
            if self.size > 1:
                errors: list[BaseException] = []
                threads = [threading.Thread(target=self._add_catching, args=(errors,), daemon=True)
                           for _ in range(self.size - 1)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                if errors:
                    raise errors[0]
        except BaseException:
            self.close()
            raise
        self._monitor = threading.Thread(target=self._watch, name="agilerl-fleet-health", daemon=True)
        self._monitor.start()
        print(f"env: {self.describe()}", file=sys.stderr, flush=True)
        return self

    def close(self) -> None:
        """Stop the health checks and every replica (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._wake.set()
        monitor = self._monitor
        if monitor is not None and monitor is not threading.current_thread():
            monitor.join(timeout=self.health_timeout_s + 10)
        try:
            self.provider.close()
        finally:
            _LIVE.discard(self)

    def __enter__(self) -> Fleet:
        return self if self._monitor is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def add_replica(self) -> Replica:
        """Start one more replica and put it in the rotation."""
        index = next(self._indexes)
        slot = _Slot(index, None, self.spec.max_concurrent_envs)
        with self._lock:
            self._slots.append(slot)
        try:
            self._fill(slot)
        except BaseException:
            with self._lock:
                self._slots.remove(slot)
            raise
        assert slot.replica is not None
        return slot.replica

    def remove_replica(self, url: str) -> bool:
        """Stop the replica at ``url`` if it holds no session (False otherwise)."""
        with self._lock:
            slot = self._slot_of(url)
            if slot is None or slot.sessions:
                return False
            self._slots.remove(slot)
        assert slot.replica is not None
        self.provider.stop(slot.replica)
        return True

    # -- the picker (RemoteEnvClient calls these) ----------------------------------------------

    def pick(self) -> str:
        """The URL of the up replica with the most free sessions (ties in turn); counted taken."""
        with self._lock:
            up = [s for s in self._slots if s.replica is not None]
            candidates = [s for s in up if not s.suspect] or up
            if not candidates:
                raise ConnectionLost("no replica of the env is up (being replaced)")
            most = max(s.capacity - s.sessions for s in candidates)
            best = [s for s in candidates if s.capacity - s.sessions == most]
            slot = best[next(self._turn) % len(best)]
            if most <= 0:
                self.refused += 1
                if self.scaler is not None:
                    self._wake.set()  # the scaler grows the fleet now, not at the next tick
            slot.sessions += 1
            assert slot.replica is not None
            return slot.replica.url

    def released(self, url: str) -> None:
        """A session on ``url`` ended."""
        with self._lock:
            slot = self._slot_of(url)
            if slot is not None:
                slot.sessions = max(0, slot.sessions - 1)

    def failed(self, url: str) -> None:
        """A session on ``url`` could not connect or was cut: check that replica now."""
        with self._lock:
            slot = self._slot_of(url)
            if slot is not None:
                slot.sessions = max(0, slot.sessions - 1)
                slot.suspect = True
        self._wake.set()

    def client_made(self, client: object) -> None:
        """Count ``client`` among those that place sessions here until it is dropped; past the
        fleet's capacity, the scaler is asked at once rather than at the next tick."""
        with self._lock:
            self.clients += 1
            over = self.clients > sum(s.capacity for s in self._slots)
        weakref.finalize(client, self._client_gone)
        if over and self.scaler is not None:
            self._wake.set()

    def _client_gone(self) -> None:
        with self._lock:
            self.clients -= 1

    # -- what it is doing ----------------------------------------------------------------------

    def load(self) -> list[tuple[str | None, int]]:
        """``(url, open sessions)`` of every replica; url None while one is being replaced."""
        with self._lock:
            return [(s.replica.url if s.replica is not None else None, s.sessions) for s in self._slots]

    @property
    def urls(self) -> list[str]:
        with self._lock:
            return [s.replica.url for s in self._slots if s.replica is not None]

    def metrics(self) -> dict[str, float]:
        """``envs/replicas`` (up), ``envs/replaced`` (so far), ``envs/sessions`` (open now),
        ``envs/start_s`` (spent starting replicas so far)."""
        with self._lock:
            return {
                "envs/replicas": float(sum(s.replica is not None and not s.suspect for s in self._slots)),
                "envs/replaced": float(self.replaced),
                "envs/sessions": float(sum(s.sessions for s in self._slots)),
                "envs/start_s": round(self.start_s, 3),
            }

    def describe(self) -> str:
        """Where the env runs, for a header: the provider, and each replica's URL and place."""
        with self._lock:
            replicas = [s.replica for s in self._slots if s.replica is not None]
        places = "; ".join(f"{r.url} ({r.where})" for r in replicas)
        return f"{len(replicas)} {self.provider.name} replica{'s' if len(replicas) != 1 else ''}: {places}"

    # -- health --------------------------------------------------------------------------------

    def _watch(self) -> None:
        while not self._closed:
            self._wake.wait(self.health_interval_s)
            self._wake.clear()
            if self._closed:
                return
            try:
                self._check_all()
                if self.scaler is not None:
                    self.scaler.tick(self)
            except Exception:  # the watch must outlive any one bad tick
                log.exception("env fleet: health tick failed")

    def _check_all(self) -> None:
        with self._lock:
            slots = list(self._slots)
        for slot in slots:
            if self._closed:
                return
            replica = slot.replica
            if replica is None:  # its replacement failed earlier: try again
                self._replace(slot, None, "its last start failed")
                continue
            alive = self.provider.alive(replica)
            if alive and healthy(replica.url, self.health_timeout_s):
                with self._lock:
                    slot.misses, slot.suspect = 0, False
                continue
            slot.misses += 1
            if alive and slot.misses < 2:  # one miss may be a busy server; two in a row are not
                continue
            self._replace(slot, replica, "exited" if not alive else "failed 2 health checks")

    def _replace(self, slot: _Slot, old: Replica | None, why: str) -> None:
        if self._replace_tries >= self.max_replacements:
            if old is not None and not slot.suspect:
                log.error("env replica %d (%s) %s; not replaced: the fleet has used its %d replacements",
                          slot.index, old.where, why, self.max_replacements)
            slot.suspect = True
            return
        self._replace_tries += 1
        with self._lock:
            slot.replica, slot.sessions, slot.misses = None, 0, 0
        if old is not None:
            print(f"env: replica {slot.index} ({old.where}) {why}; replacing it", file=sys.stderr, flush=True)
            self.provider.stop(old)
        try:
            self._fill(slot)
        except ReplicaStartError as exc:
            if not self._closed:
                log.error("env replica %d could not be replaced (%s); trying again at the next health check",
                          slot.index, exc)
            return
        self.replaced += 1

    def _fill(self, slot: _Slot) -> None:
        """Start ``slot``'s replica (retrying a retryable failure) and read its capacity."""
        started = time.monotonic()

        def start() -> Replica:
            if self._closed:
                raise ReplicaStartError("the fleet is closed: no replica starts", retryable=False)
            return self.provider.start(self.spec, slot.index, self.start_timeout_s)

        try:
            replica = start_with_retry(start, self.limiter, what=f"env replica {slot.index}",
                                       attempts=START_ATTEMPTS, max_delay_s=5.0)
        finally:
            self.start_s += time.monotonic() - started
        capacity = metadata_of(replica.url, self.health_timeout_s).get("max_concurrent_envs")
        with self._lock:
            if self._closed:
                self.provider.stop(replica)
                raise ReplicaStartError("the fleet closed while a replica started", retryable=False)
            slot.replica, slot.suspect, slot.misses = replica, False, 0
            slot.capacity = capacity if isinstance(capacity, int) and capacity > 0 else self.spec.max_concurrent_envs

    def _add_catching(self, errors: list[BaseException]) -> None:
        try:
            self.add_replica()
        except BaseException as exc:
            errors.append(exc)

    def _slot_of(self, url: str) -> _Slot | None:
        return next((s for s in self._slots if s.replica is not None and s.replica.url == url), None)


_LIVE: set[Fleet] = set()
"""Every fleet started and not closed in this process: its metrics are logged, and it is closed
at exit if nothing closed it before."""


def fleet_metrics() -> dict[str, float]:
    """``envs/...`` summed over this process's open fleets (empty when there is none)."""
    totals: dict[str, float] = {}
    for fleet in list(_LIVE):
        for key, value in fleet.metrics().items():
            totals[key] = totals.get(key, 0.0) + value
    return totals


@atexit.register
def _close_all() -> None:
    for fleet in list(_LIVE):
        fleet.close()
