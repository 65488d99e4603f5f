"""Threads for blocking env calls, and blocking calls awaited from an event loop.

- ``WorkerThreads``: daemon threads for blocking env calls. Each task gets a free worker or a new
  one, so calls blocked in a hung env never hold up the rest (up to ``max_workers``); daemons, so
  an env hung forever cannot keep the process from exiting.
- ``SessionThread``: one thread for one env's calls (an env server session), in order.
- ``LoopCalls``: blocking calls awaited from an event loop, on either kind of thread.
  ``ThreadPoolExecutor`` plus ``asyncio.wrap_future`` costs a condition variable, two futures and
  a loop wakeup per call; this hands results back with one wakeup per burst.
- ``EnvCaller``: how an async caller (the env server, an in-process client's ``a*`` methods) runs an
  env: a sync method on worker threads (never inline on the loop), an ``async def`` one awaited;
  ``EnvCaller.own_thread()`` gives one env (one server session) a thread of its own, so an env
  bound to the thread that built it (sqlite, Playwright's sync API) works.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import os
import queue
import threading
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar

__all__ = ["WorkerThreads", "SessionThread", "LoopCalls", "default_threads", "EnvCaller"]

T = TypeVar("T")
log = logging.getLogger(__name__)

# -- worker threads ----------------------------------------------------------------------------


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

    def start_call(self, calls: LoopCalls, future: asyncio.Future[Any], fn: Callable[..., Any],
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Run ``fn(*args, **kwargs)`` on a worker; ``calls`` hands the outcome to ``future``."""
        self.submit(partial(calls.finish, future, fn, args, kwargs))

    @property
    def idle(self) -> bool:
        """True when a worker is free and no task waits (a new task starts at once)."""
        return self._free > 0

    def shutdown(self) -> None:
        """Let idle workers exit once the tasks already queued ran; one stuck in a call exits when
        the call returns."""
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
        get = self._queue.get
        while True:
            task = get()
            if task is None:
                return
            task()
            # Drop the task before waiting for the next: an idle worker holding its last task
            # would keep that call's env (and whatever it allocated) alive after it is closed.
            task = None
            with self._lock:
                self._free += 1


class SessionThread:
    """One daemon thread running one env's calls in the order they came, started at once.

    The env server's hot path (a call a step per session), so it is leaner than a
    ``WorkerThreads`` of one: no lock, a call is one queue item. Submit from one thread only (the
    server's loop): the two counters behind ``idle`` each have a single writer.

    The thread asks Linux for ``SCHED_BATCH``: woken by a new call, it waits for the event loop to
    go idle instead of preempting it. On one CPU that saves the loop a switch out and back for
    every call, and the loop (sockets, heartbeats, /health) keeps its latency; the env's calls
    get the same CPU share as before.
    """

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._sent = 0  # written by the submitting thread only
        self._done = 0  # written by this thread only
        self._closed = False
        threading.Thread(target=self._work, name=name, daemon=True).start()

    def start_call(self, calls: LoopCalls, future: asyncio.Future[Any], fn: Callable[..., Any],
                   args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Run ``fn(*args, **kwargs)`` on this thread; ``calls`` hands the outcome to ``future``."""
        self._put(self._call, (calls, future, fn, args, kwargs))

    def submit(self, task: Callable[[], None]) -> None:
        """Run ``task`` on this thread after the calls already queued; it must not raise."""
        self._put(self._task, (task,))

    @property
    def idle(self) -> bool:
        """True when no call is running or queued."""
        return self._sent == self._done

    def shutdown(self) -> None:
        """Let the thread exit once the calls already queued ran."""
        self._closed = True
        self._queue.put(None)

    def _put(self, run: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self._closed:
            raise RuntimeError("this session's thread is shut down")
        self._sent += 1
        self._queue.put((run, args))

    def _work(self) -> None:
        _yield_to_the_loop()
        get = self._queue.get
        while (item := get()) is not None:
            run, args = item
            item = None
            run(*args)
            run = args = None  # an idle thread must not keep its last call's env alive

    def _call(self, calls: LoopCalls, future: asyncio.Future[Any], fn: Callable[..., Any],
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        outcome = calls.outcome(future, fn, args, kwargs)
        # Counted before the hand-off: the awaiting coroutine, once resumed, must see this thread
        # idle (a close goes to this thread then, not to a spare one: thread-bound envs need it).
        self._done += 1
        calls.hand_off(outcome)

    def _task(self, task: Callable[[], None]) -> None:
        task()
        self._done += 1


def _yield_to_the_loop() -> None:
    """``SCHED_BATCH`` for the calling thread where the platform has it (see ``SessionThread``)."""
    try:
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    except (AttributeError, OSError):  # not Linux, or refused: the default policy works too
        pass


Threads = WorkerThreads | SessionThread


class LoopCalls:
    """Blocking calls awaited from one event loop, run on ``WorkerThreads`` or a ``SessionThread``."""

    def __init__(self, threads: Threads, loop: asyncio.AbstractEventLoop) -> None:
        self._threads = threads
        self.loop = loop
        self._finished: collections.deque[tuple[asyncio.Future[Any], bool, Any]] = collections.deque()
        self._wakeup_pending = False

    async def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a worker thread; call on this object's loop."""
        return await self.start(self._threads, fn, args, kwargs)

    def start(
        self, threads: Threads, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> asyncio.Future[Any]:
        """Start ``fn(*args, **kwargs)`` on one of ``threads``; await the future on this loop.
        Results of every pool come back in the same bursts (one loop wakeup for many)."""
        future = self.loop.create_future()
        threads.start_call(self, future, fn, args, kwargs)
        return future

    def finish(self, future: asyncio.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> None:
        """Run the call here (a worker thread) and queue its outcome for the loop."""
        self.hand_off(self.outcome(future, fn, args, kwargs))

    @staticmethod
    def outcome(future: asyncio.Future[Any], fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> tuple[asyncio.Future[Any], bool, Any]:
        """Run the call here (a worker thread): what ``hand_off`` gives ``future``."""
        try:
            return (future, True, fn(*args, **kwargs))
        except BaseException as exc:  # handed to the awaiting coroutine
            return (future, False, exc)

    def hand_off(self, outcome: tuple[asyncio.Future[Any], bool, Any]) -> None:
        """Queue ``outcome`` for the loop, waking it unless a wakeup is already pending.

        Lock-free: the loop clears ``_wakeup_pending`` before it drains, so a result queued after
        the drain began either is drained or sees the flag clear and wakes the loop again."""
        self._finished.append(outcome)
        if not self._wakeup_pending:
            self._wakeup_pending = True
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass

    def _deliver(self) -> None:
        self._wakeup_pending = False
        finished = self._finished
        while finished:
            future, ok, value = finished.popleft()
            if future.done():  # the awaiting coroutine was cancelled
                continue
            if ok:
                future.set_result(value)
            elif isinstance(value, StopIteration):  # a future refuses it: it would end a generator
                future.set_exception(RuntimeError(f"the env call raised {value!r}"))
            else:
                future.set_exception(value)


_default_threads: WorkerThreads | None = None
_default_lock = threading.Lock()


def default_threads() -> WorkerThreads:
    """Process-wide worker threads for blocking env calls made on behalf of async code (an
    in-process client's ``a*`` methods when no server supplies its own)."""
    global _default_threads
    with _default_lock:
        if _default_threads is None:
            _default_threads = WorkerThreads("agilerl-env-calls")
        return _default_threads


# -- the env server's call policy --------------------------------------------------------------


class EnvCaller:
    """Runs an env's calls for async code (the env server's sessions, an in-process client's
    ``a*`` methods): a sync method on a worker thread, always; an ``async def`` one awaited.

    Sync calls never run on the event loop, not even fast ones: a fast env that stalls once would
    hold the loop, and with it /health, heartbeats, every other session and shutdown, for the
    whole stall. On a worker thread a stalled call holds only its own thread. ``LoopCalls`` keeps
    the hop cheap (one loop wakeup per burst of finished calls). An ``async def`` method runs on
    the loop and must not block it (that is the env's contract, as for any asyncio code).
    """

    def __init__(self, threads: Threads, *, shares: EnvCaller | None = None) -> None:
        self._threads = threads
        self._root = shares or self  # whose LoopCalls (and async-ness memo) this caller uses
        self._calls: LoopCalls | None = None
        self._is_async: dict[Any, bool] = self._root._is_async if shares else {}

    def own_thread(self, name: str) -> EnvCaller:
        """A caller whose sync calls all run on one new thread of its own (OpenEnv gives each
        session one executor thread); finished calls still reach the loop in this caller's
        bursts. ``release()`` lets the thread exit after the calls already queued."""
        return EnvCaller(SessionThread(name), shares=self._root)

    @property
    def idle(self) -> bool:
        """True when a sync call would start at once (no call of this caller's is stuck)."""
        return self._threads.idle

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn(*args)`` on this caller's thread and wait for nothing; it must not raise."""
        self._threads.submit(partial(fn, *args))

    def release(self) -> None:
        """Let this caller's threads exit once the calls already queued ran (see ``own_thread``)."""
        self._threads.shutdown()

    async def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``: awaited on this loop when ``async def``, else on a worker
        thread (an awaitable it returns is awaited here)."""
        key = getattr(fn, "__func__", fn)
        is_async = self._is_async.get(key)
        if is_async is None:
            is_async = self._is_async[key] = inspect.iscoroutinefunction(fn)
        if is_async:
            return await fn(*args, **kwargs)
        # in_thread's two lines, not a call to it: one coroutine less on the server's step path
        result = await self._loop_calls().start(self._threads, fn, args, kwargs)
        return await result if _pending(result) else result

    async def in_thread(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on a worker thread, always; an awaitable result is awaited here."""
        result = await self._loop_calls().start(self._threads, fn, args, kwargs)
        return await result if _pending(result) else result

    def _loop_calls(self) -> LoopCalls:
        """The running loop's ``LoopCalls``, shared by every caller made from this one."""
        loop = asyncio.get_running_loop()
        root = self._root
        calls = root._calls  # one read: another loop's thread may swap it meanwhile
        if calls is None or calls.loop is not loop:
            calls = root._calls = LoopCalls(root._threads, loop)
        return calls


def _pending(result: Any) -> bool:
    """True when a sync call returned an awaitable (a sync ``close`` handing back a coroutine)."""
    return type(result) is not tuple and inspect.isawaitable(result)
