"""Running one call per env at once, each bounded by a timeout.

In-process envs block, so their calls run on worker threads; async (remote) clients run as
coroutines on the shared remote event loop, where a timeout really cancels the call. Worker
threads are daemons: an env hung forever cannot keep the process from exiting, and each
abandoned call gets a fresh worker so the pool never silently shrinks.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Future, wait
from typing import Any

from agilerl.errors import AgileRLError


class EnvTimeoutError(AgileRLError, TimeoutError):
    """An env call did not finish within the collector's ``env_timeout_s``."""


class DaemonPool:
    """A fixed set of daemon worker threads, started once and reused for every call."""

    def __init__(self, size: int, name: str = "agilerl-env") -> None:
        self._queue: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._name = name
        self._workers = 0
        for _ in range(size):
            self.add_worker()

    def add_worker(self) -> None:
        """One more worker (replacing one stuck in an abandoned call)."""
        self._workers += 1
        threading.Thread(target=self._work, name=f"{self._name}-{self._workers}", daemon=True).start()

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        future: Future[Any] = Future()
        self._queue.put((future, fn))
        return future

    def shutdown(self) -> None:
        """Let idle workers exit; a stuck one exits when its call returns."""
        for _ in range(self._workers):
            self._queue.put(None)
        self._workers = 0

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            future, fn = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    future.set_exception(exc)


def run_in_threads(
    pool: DaemonPool, calls: Sequence[Callable[[], Any]], timeout_s: float | None, what: str
) -> list[Any]:
    """Each call's result, or the exception it raised, or an ``EnvTimeoutError``."""
    futures = [pool.submit(call) for call in calls]
    done, _ = wait(futures, timeout=timeout_s)
    results: list[Any] = []
    for future in futures:
        if future in done:
            results.append(future.exception() or future.result())
        else:
            if not future.cancel():  # it is running: its worker is stuck, replace it
                pool.add_worker()
            results.append(_timeout(what, timeout_s))
    return results


def run_on_loop(
    loop_run: Callable[[Any], Any], calls: Sequence[Callable[[], Awaitable[Any]]], timeout_s: float | None, what: str
) -> list[Any]:
    """The same contract for coroutines, run together on an event loop via ``loop_run``."""

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        try:
            return await asyncio.wait_for(call(), timeout_s)
        except asyncio.TimeoutError:
            raise _timeout(what, timeout_s) from None

    async def every() -> list[Any]:
        return await asyncio.gather(*(one(call) for call in calls), return_exceptions=True)

    return loop_run(every())


def _timeout(what: str, timeout_s: float | None) -> EnvTimeoutError:
    return EnvTimeoutError(
        f"env {what} did not finish within env_timeout_s={timeout_s}s; the env was replaced "
        "(raise env_timeout_s if the env is just slow)"
    )
