"""How the server calls an env: inline on the event loop while fast, on worker threads once slow.

Handing every frame to a worker thread costs about half of a small step's time, so a
synchronous env runs inline on the loop as long as its calls are fast; a method that proves slow
moves to the worker threads for every session, so a slow env stalls the others for at most a few
calls. ``async def`` env methods are awaited on the loop.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any

from agilerl.concurrency import LoopCalls, WorkerThreads

log = logging.getLogger(__name__)


class EnvCaller:
    """Runs env calls: inline while fast, on worker threads once slow, awaited when async.

    A method moves to worker threads after ``SLOW_STRIKES`` calls over the budget (a thread switch
    can stretch one fast call), or at once after a call over ``10 x`` the budget. Decisions are
    per method name and shared by all sessions: they all run one factory's envs.
    """

    SLOW_STRIKES = 3
    STRIKES_FORGOTTEN_AFTER = 1000  # fast calls

    def __init__(self, threads: WorkerThreads, inline_budget_s: float) -> None:
        self._threads = threads
        self._calls: LoopCalls | None = None
        self._budget = inline_budget_s
        self._offloaded: set[str] = set() if inline_budget_s > 0 else {"reset", "step", "state"}
        self._strikes: dict[str, int] = {}
        self._fast_calls: dict[str, int] = {}

    async def call(self, key: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if key in self._offloaded:
            result = await self.in_thread(fn, *args, **kwargs)
        else:
            start = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
            finally:
                self._record(key, time.perf_counter() - start)
        if type(result) is not tuple and inspect.isawaitable(result):  # async def env methods
            result = await result
        return result

    def _record(self, key: str, duration: float) -> None:
        if duration <= self._budget:
            fast = self._fast_calls.get(key, 0) + 1
            if fast >= self.STRIKES_FORGOTTEN_AFTER:
                self._strikes[key] = fast = 0
            self._fast_calls[key] = fast
            return
        strikes = self._strikes.get(key, 0) + 1
        self._strikes[key] = strikes
        if strikes >= self.SLOW_STRIKES or duration > 10 * self._budget:
            self._offloaded.add(key)
            log.info("env.%s took %.1f ms: running it on worker threads from now on", key, duration * 1e3)

    async def in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        if self._calls is None or self._calls.loop is not loop:
            self._calls = LoopCalls(self._threads, loop)
        result = await self._calls.run(fn, *args, **kwargs)
        if inspect.isawaitable(result):
            result = await result
        return result

    @property
    def offloaded(self) -> frozenset[str]:
        """Method names now running on worker threads."""
        return frozenset(self._offloaded)
