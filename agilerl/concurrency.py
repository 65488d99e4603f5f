"""Daemon worker threads for blocking env calls, shared by the collector and the env server.

Tasks are plain callables that report their own results. Each submitted task gets a free worker
or a new one, so calls blocked in a hung env never hold up the rest (up to ``max_workers``; past
it tasks wait their turn). Workers are daemons: an env hung forever cannot keep the process from
exiting.

``ThreadPoolExecutor`` plus ``asyncio.wrap_future`` costs a condition variable, two futures and a
loop wakeup per call; ``LoopCalls`` hands results back to an event loop with one wakeup per burst
(64 envs finishing together wake the loop once, not 64 times).
"""

from __future__ import annotations

import asyncio
import collections
import queue
import threading
from collections.abc import Callable
from typing import Any


class WorkerThreads:
    """Daemon threads running submitted callables; started as needed, reused for every call."""

    def __init__(self, name: str, *, min_workers: int = 0, max_workers: int | None = None) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._name = name
        self._max = max_workers
        self._lock = threading.Lock()
        self._workers = 0
        self._free = 0  # workers waiting for a task, minus tasks waiting for a worker
        self._closed = False
        with self._lock:
            for _ in range(min_workers):
                self._start_worker()

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on a free worker (a new one when none is free); it must not raise."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self._name} worker threads are shut down")
            if self._free <= 0 and (self._max is None or self._workers < self._max):
                self._start_worker()
            self._free -= 1
        self._queue.put(task)

    def shutdown(self) -> None:
        """Let idle workers exit; one stuck in a call exits when the call returns."""
        with self._lock:
            self._closed = True
            workers, self._workers = self._workers, 0
        for _ in range(workers):
            self._queue.put(None)

    def _start_worker(self) -> None:
        self._workers += 1
        self._free += 1
        threading.Thread(target=self._work, name=f"{self._name}-{self._workers}", daemon=True).start()

    def _work(self) -> None:
        while (task := self._queue.get()) is not None:
            task()
            with self._lock:
                self._free += 1


class LoopCalls:
    """Blocking calls awaited from one event loop, run on ``WorkerThreads``."""

    def __init__(self, threads: WorkerThreads, loop: asyncio.AbstractEventLoop) -> None:
        self._threads = threads
        self.loop = loop
        self._lock = threading.Lock()
        self._finished: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = collections.deque()
        self._wakeup_pending = False

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a worker thread; call on this object's loop."""
        future = self.loop.create_future()

        def task() -> None:
            try:
                outcome = (future, True, fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
                outcome = (future, False, exc)
            with self._lock:
                self._finished.append(outcome)
                wake, self._wakeup_pending = not self._wakeup_pending, True
            if wake:
                try:
                    self.loop.call_soon_threadsafe(self._deliver)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    pass

        self._threads.submit(task)
        return await future

    def _deliver(self) -> None:
        with self._lock:
            finished = list(self._finished)
            self._finished.clear()
            self._wakeup_pending = False
        for future, ok, value in finished:
            if future.done():  # the awaiting coroutine was cancelled
                continue
            if ok:
                future.set_result(value)
            elif isinstance(value, StopIteration):  # a future refuses it: it would end a generator
                future.set_exception(RuntimeError(f"the env call raised {value!r}"))
            else:
                future.set_exception(value)
