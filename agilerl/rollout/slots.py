"""The collector's envs: one ``RolloutHarness`` per slot, built, dropped and closed in one place.

Slots ``0 .. count-1`` roll out; one more, after them, is built at the first evaluation and
evaluates. Every slot runs the same kind of env, so all share one ``ChatRenderer``. An env that
failed is dropped (closed in the background: it may still hang) and rebuilt at its slot's next
use; a remote env's client is kept instead: its next ``reset`` opens a fresh session.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from agilerl.chat import ChatRenderer
from agilerl.concurrency import WorkerThreads, run_in_threads
from agilerl.protocol import EnvInfo
from agilerl.rollout.harness import RolloutHarness
from agilerl.rollout.results import CollectionError

__all__ = ["EnvSlots", "check_capacity"]

log = logging.getLogger(__name__)


class EnvSlots:
    """The harnesses of a collector's slots (see the module doc). ``slots[i]`` is slot ``i``'s."""

    def __init__(
        self, env_factory: Callable[[], Any], tokenizer: Any, count: int, *, max_turns: int | None, **harness: Any
    ) -> None:
        self.count = count
        self._factory = env_factory
        self._tokenizer = tokenizer
        self._harness_kwargs = harness  # RolloutHarness's keywords, the same for every slot
        self._renderer: ChatRenderer | None = None
        self._slots: list[RolloutHarness | None] = [None] * (count + 1)
        first = env_factory()
        try:
            self._slots[0] = self._harness(first, max_turns)  # None: the env's own
            self.max_turns = self[0].max_turns
            check_capacity(self[0].info, count)  # the first env's description stands for every slot's
        except BaseException:
            _close_quietly(first)
            raise
        self.threads = WorkerThreads("agilerl-env", min_workers=count)
        """The collector's worker threads: one per slot, for builds and blocking env calls."""
        try:
            self._build_many(range(1, count))
        except BaseException:
            self.close()
            raise

    @property
    def info(self) -> EnvInfo:
        return self[0].info

    def __getitem__(self, slot: int) -> RolloutHarness:
        harness = self._slots[slot]
        assert harness is not None, f"slot {slot} has no env"
        return harness

    def ready(self, slot: int) -> RolloutHarness:
        """Slot ``slot``'s harness, built first when its env was dropped (or never built)."""
        harness = self._slots[slot]
        if harness is None:
            harness = self._slots[slot] = self._harness(self._factory(), self.max_turns)
        return harness

    def grow(self, count: int) -> range:
        """``count`` more rollout slots (before the evaluation slot), their envs built at once."""
        new = range(self.count, self.count + count)
        check_capacity(self.info, new.stop)
        evaluation = self._slots[self.count]
        self._slots[self.count :] = [None] * count + [evaluation]
        self.count = new.stop
        self._build_many(new)
        return new

    def drop(self, slot: int) -> None:
        """Drop a failed env (closed in the background: it may still hang); rebuilt at next use.
        A remote env's client stays: it has dropped its session, and its next ``reset`` opens a
        fresh one (a fresh env on the server), reconnecting through an outage."""
        old = self._slots[slot]
        if old is not None and old.client.reconnects:
            return
        self._slots[slot] = None
        if old is not None:
            threading.Thread(target=_close_quietly, args=(old,), daemon=True).start()

    def close(self) -> None:
        """Close every env once, the threads, and a fleet's factory (its replicas stop too)."""
        for harness in self._slots:
            if harness is not None:
                _close_quietly(harness)
        self._slots = [None] * len(self._slots)
        if hasattr(self, "threads"):
            self.threads.shutdown()
        if hasattr(self._factory, "close"):
            _close_quietly(self._factory)

    def _harness(self, env: Any, max_turns: int | None) -> RolloutHarness:
        harness = RolloutHarness(env, self._tokenizer, max_turns=max_turns, renderer=self._renderer, **self._harness_kwargs)
        self._renderer = harness.renderer  # every slot runs the same kind of env: one renderer
        return harness

    def _build_many(self, slots: range) -> None:
        """Build the envs of ``slots`` at once; raise the first failure."""
        build = [lambda: self._harness(self._factory(), self.max_turns)] * len(slots)
        built = run_in_threads(self.threads, build, None, "creation")
        for slot, result in zip(slots, built):
            if not isinstance(result, BaseException):
                self._slots[slot] = result
        errors = [r for r in built if isinstance(r, BaseException)]
        if errors:
            raise CollectionError(f"could not build the rollout envs: {errors[0]}") from errors[0]


def check_capacity(info: EnvInfo, num_slots: int) -> None:
    """Fail before the first batch when a server admits fewer sessions than the run holds:
    one per slot, plus one for evaluation."""
    limit = info.max_concurrent_envs
    needed = num_slots + 1
    if limit is not None and limit < needed:
        raise CollectionError(
            f"the env server admits {limit} concurrent sessions but this run needs {needed} "
            f"(batch_size x group_size = {num_slots}, + 1 for evaluation); start the server with "
            f"max_concurrent_envs >= {needed} or lower batch_size/group_size"
        )


def _close_quietly(env: Any) -> None:
    """Close an env that may be broken; its error must not mask the one being reported."""
    try:
        env.close()
    except Exception:
        log.debug("closing a failed env raised", exc_info=True)
