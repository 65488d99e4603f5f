"""How fast replicas start: a token bucket (``max_starts_per_s``) every start passes, and the
one retry loop, which tries again only what can succeed (``ReplicaStartError.retryable``).

Peers show why both matter: a fleet that starts every replica at once, and retries every failure
at once, turns one slow cluster into a storm of refusals (verifiers #1720: 429s; verl: Modal
sandboxes failing above 128 at once). A retry takes a token too, so retries never outrun the rate.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable
from typing import TypeVar

from agilerl.errors import InvalidArgument, ReplicaStartError

__all__ = ["StartLimiter", "start_with_retry"]

T = TypeVar("T")


class StartLimiter:
    """A token bucket: at most ``burst`` starts at once (default: a second's worth, at least
    one), then one every ``1 / rate_per_s`` seconds.

    Thread-safe; shared by every start of one fleet (the first ones, replacements, growth), so the
    rate bounds them all together. ``clock``/``sleep`` are injectable for tests."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not (rate_per_s > 0 and math.isfinite(rate_per_s)):
            raise InvalidArgument(f"max_starts_per_s must be a positive number, not {rate_per_s!r}.")
        burst = max(1, int(rate_per_s)) if burst is None else burst
        if burst < 1:
            raise InvalidArgument(f"a start limiter's burst must be at least 1, not {burst!r}.")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock, self._sleep = clock, sleep
        self._tokens = float(burst)
        self._at = clock()
        self._lock = threading.Lock()

    def acquire(self, timeout_s: float | None = None) -> bool:
        """Take one start's token, waiting for it; False when none comes within ``timeout_s``
        (None: wait as long as it takes)."""
        deadline = None if timeout_s is None else self._clock() + timeout_s
        while True:
            with self._lock:
                now = self._clock()
                self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate_per_s)
                self._at = now
                if self._tokens >= 1:
                    self._tokens -= 1
                    return True
                wait = (1 - self._tokens) / self.rate_per_s
            if deadline is not None:
                if now + wait > deadline:
                    return False
            self._sleep(wait)


def start_with_retry(
    start: Callable[[], T],
    limiter: StartLimiter | None,
    *,
    what: str,
    attempts: int = 5,
    first_delay_s: float = 0.5,
    max_delay_s: float = 30.0,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``start()`` once the limiter allows, again after a jittered exponential backoff while it
    raises a ``retryable`` ``ReplicaStartError``, at most ``attempts`` times in all. A failure that
    cannot succeed (the env's own error, a missing package) is raised at once; the last retryable
    one is raised naming how many tries were made."""
    if attempts < 1:
        raise InvalidArgument(f"attempts must be at least 1, not {attempts!r}.")
    attempt = 1
    while True:
        if limiter is not None:
            limiter.acquire()
        try:
            return start()
        except ReplicaStartError as exc:
            if not exc.retryable:
                raise
            if attempt >= attempts:
                raise ReplicaStartError(
                    f"{what} did not start in {attempts} tries; the last: {exc}", retryable=True
                ) from exc
        sleep(random.uniform(0.5, 1.0) * min(max_delay_s, first_delay_s * 2 ** (attempt - 1)))
        attempt += 1
