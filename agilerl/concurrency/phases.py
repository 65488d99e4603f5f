"""One call per env at once, each phase bounded by one timeout: ``run_in_threads`` for blocking
envs (one latch per phase, no event loop), ``run_on_loop`` for coroutines (a timeout really cancels).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from agilerl.concurrency.loops import LoopThread
from agilerl.concurrency.threads import WorkerThreads
from agilerl.errors import EnvTimeoutError

__all__ = ["run_in_threads", "run_on_loop"]

class _Phase:
    """One batch of calls in flight: results land in place, the caller wakes once when all are in.

    One latch per phase instead of a ``Future`` per call: with 64 envs finishing together, the
    per-call condition variables cost more than the work (about 1 ms a phase).
    """

    def __init__(self, size: int) -> None:
        self.results: list[Any] = [None] * size
        self.finished = [False] * size
        self.abandoned = False
        self._remaining = size
        self._lock = threading.Lock()
        self._done = threading.Event()
        if size == 0:
            self._done.set()

    def start(self) -> bool:
        """Claim a call; False once the caller gave up on this phase (its timeout passed)."""
        with self._lock:
            return not self.abandoned

    def finish(self, index: int, result: Any) -> None:
        with self._lock:
            self.results[index] = result
            self.finished[index] = True
            self._remaining -= 1
            if self._remaining == 0:
                self._done.set()

    def wait(self, timeout_s: float | None) -> None:
        self._done.wait(timeout_s)
        with self._lock:
            self.abandoned = True


def run_in_threads(
    threads: WorkerThreads, calls: Sequence[Callable[[], Any]], timeout_s: float | None, what: str
) -> list[Any]:
    """Run blocking calls at once on ``threads``: each one's result, or the exception it raised,
    or an ``EnvTimeoutError`` (a call stuck in a hung env keeps its thread; the next phase gets a
    fresh one).

    Hand-tuned fast path for blocking envs: one latch for the whole phase, no event loop."""
    phase = _Phase(len(calls))
    for index, call in enumerate(calls):
        threads.submit(partial(_run_call, phase, index, call))
    phase.wait(timeout_s)
    return [
        phase.results[index] if phase.finished[index] else _timeout(what, timeout_s)
        for index in range(len(calls))
    ]


def _run_call(phase: _Phase, index: int, call: Callable[[], Any]) -> None:
    if phase.start():
        try:
            result = call()
        except BaseException as exc:  # handed to the caller
            result = exc
        phase.finish(index, result)


def run_on_loop(
    loop: LoopThread, calls: Sequence[Callable[[], Awaitable[Any]]], timeout_s: float | None, what: str
) -> list[Any]:
    """The same contract for coroutines, run together on ``loop``, where a timeout really cancels.

    One deadline for the whole phase (they all start together) rather than a ``wait_for`` per
    call: a timer and a wrapper task per call cost about as much as a fast remote step.
    """

    async def every() -> list[Any]:
        tasks = [asyncio.ensure_future(call()) for call in calls]
        if not tasks:
            return []
        _, late = await asyncio.wait(tasks, timeout=timeout_s)
        for task in late:
            task.cancel()
        if late:
            await asyncio.wait(late)  # let them unwind (drop their sessions) before reporting
        return [
            _timeout(what, timeout_s) if task in late else task.exception() or task.result()
            for task in tasks
        ]

    return loop.run(every())


def _timeout(what: str, timeout_s: float | None) -> EnvTimeoutError:
    return EnvTimeoutError(
        f"env {what} did not finish within env_timeout_s={timeout_s}s; the env was replaced "
        "(raise env_timeout_s if the env is just slow)"
    )
