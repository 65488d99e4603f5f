"""WorkerThreads and LoopCalls: the worker threads behind the collector and the env server."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import threading
import time
from collections.abc import Callable

import pytest

from agilerl.concurrency import LoopCalls, SessionThread, WorkerThreads


def _run_all(threads: WorkerThreads, count: int, fn) -> list[object]:
    results: list[object] = [None] * count
    done = threading.Semaphore(0)

    def task(i: int) -> None:
        results[i] = fn(i)
        done.release()

    for i in range(count):
        threads.submit(lambda i=i: task(i))
    for _ in range(count):
        assert done.acquire(timeout=10)
    return results


def test_blocking_calls_run_at_once_on_as_many_threads() -> None:
    threads = WorkerThreads("t")
    # Each call blocks until all 16 are in flight at once: calls run one after another (or on
    # fewer threads) never get past the barrier, and its timeout turns that into a failure.
    all_in_flight = threading.Barrier(16, timeout=5)

    def blocking(i: int) -> object:
        try:
            all_in_flight.wait()
        except threading.BrokenBarrierError:
            return None
        return threading.current_thread().name

    names = _run_all(threads, 16, blocking)
    assert None not in names, "the 16 blocking calls were never all in flight at once"
    assert len(set(names)) == 16
    threads.shutdown()


def test_idle_workers_are_reused() -> None:
    threads = WorkerThreads("reused", min_workers=2)
    for _ in range(5):
        _run_all(threads, 2, lambda i: None)
    assert sum(t.name.startswith("reused-") for t in threading.enumerate()) == 2
    threads.shutdown()


def test_a_worker_stuck_in_a_hung_call_is_replaced_by_a_new_one() -> None:
    threads = WorkerThreads("t", min_workers=1)
    release = threading.Event()
    threads.submit(lambda: release.wait(10) and None)
    assert _run_all(threads, 1, lambda i: "served") == ["served"]
    release.set()
    threads.shutdown()


def test_past_max_workers_tasks_wait_their_turn() -> None:
    threads = WorkerThreads("t", max_workers=2)
    active = 0
    peak = 0
    lock = threading.Lock()

    def call(i: int) -> int:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        time.sleep(0.05)
        with lock:
            active -= 1
        return i

    assert _run_all(threads, 6, call) == list(range(6))
    assert peak == 2
    threads.shutdown()


def test_submit_after_shutdown_is_refused() -> None:
    threads = WorkerThreads("t", min_workers=1)
    threads.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        threads.submit(lambda: None)


def test_loop_calls_return_results_and_raise_errors_in_order() -> None:
    async def main() -> None:
        calls = LoopCalls(WorkerThreads("t"), asyncio.get_running_loop())

        def boom() -> None:
            raise ValueError("env broke")

        def stop() -> None:
            raise StopIteration

        results = await asyncio.gather(
            *(calls.run(lambda i=i: (time.sleep(0.01), i * i)[1]) for i in range(32)),
            calls.run(boom),
            calls.run(stop),
            return_exceptions=True,
        )
        assert results[:32] == [i * i for i in range(32)]
        assert isinstance(results[32], ValueError) and str(results[32]) == "env broke"
        assert isinstance(results[33], RuntimeError) and "StopIteration" in str(results[33])

    asyncio.run(main())


def test_loop_calls_wake_the_loop_once_per_burst() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        wakeups = 0
        original = loop.call_soon_threadsafe

        def counting(*args, **kwargs):  # type: ignore[no-untyped-def]
            nonlocal wakeups
            wakeups += 1
            return original(*args, **kwargs)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        threads = WorkerThreads("t", max_workers=1)  # idle again only once every call finished
        calls = LoopCalls(threads, loop)
        tasks = [asyncio.ensure_future(calls.run(lambda: None)) for _ in range(32)]
        await asyncio.sleep(0)  # every call is submitted
        assert _wait_for(lambda: threads.idle)  # the loop is busy (blocked here) while all 32 finish
        await asyncio.gather(*tasks)
        return wakeups

    assert asyncio.run(main()) == 1


def test_a_cancelled_wait_drops_the_late_result() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        reported: list[dict] = []  # a late result set on the cancelled future would land here
        loop.set_exception_handler(lambda _, context: reported.append(context))
        threads = WorkerThreads("t", max_workers=1)
        calls = LoopCalls(threads, loop)
        started, release = threading.Event(), threading.Event()

        def late() -> str:
            started.set()
            release.wait(10)
            return "late"

        waiting = asyncio.ensure_future(calls.run(late))
        assert await asyncio.to_thread(started.wait, 10)  # the call runs on its worker
        waiting.cancel()
        release.set()
        assert await asyncio.to_thread(lambda: _wait_for(lambda: threads.idle))  # the late result is in
        # its delivery was scheduled first, so it has run once this call's result is back
        assert await asyncio.wait_for(calls.run(lambda: "next"), 10) == "next"
        assert waiting.cancelled() and reported == []

    asyncio.run(main())



@pytest.mark.parametrize("kind", ["pool", "session"])
def test_an_idle_worker_keeps_nothing_of_its_last_task(kind: str) -> None:
    """A worker waiting for work must not hold its last task (and through it an env the server
    already closed): issue 20.4."""
    import gc
    import weakref

    class Env:
        pass

    threads = WorkerThreads("idle", min_workers=1) if kind == "pool" else SessionThread("idle")
    env = Env()
    alive = weakref.ref(env)
    ran = threading.Event()
    threads.submit(lambda env=env: ran.set())
    del env
    assert ran.wait(10)
    deadline = time.monotonic() + 10
    while alive() is not None and time.monotonic() < deadline:  # the worker drops it once it ran
        gc.collect()
        time.sleep(0.01)
    assert alive() is None
    threads.shutdown()


def test_an_own_thread_caller_runs_every_call_on_one_thread() -> None:
    from agilerl.concurrency import EnvCaller

    async def main() -> set[str]:
        session = EnvCaller(WorkerThreads("pool")).own_thread("session")
        names = [await session.in_thread(lambda: threading.current_thread().name) for _ in range(20)]
        session.release()
        return set(names)

    assert asyncio.run(main()) == {"session"}


def test_a_session_thread_runs_calls_in_order_and_reports_idle_only_when_all_ran() -> None:
    async def main() -> None:
        thread = SessionThread("ordered")
        calls = LoopCalls(thread, asyncio.get_running_loop())
        release = threading.Event()
        seen: list[int] = []
        first = asyncio.ensure_future(calls.run(lambda: (release.wait(10), seen.append(0))[1]))
        rest = [asyncio.ensure_future(calls.run(seen.append, i)) for i in range(1, 20)]
        await asyncio.sleep(0.05)
        assert not thread.idle and seen == []  # the first call holds the thread; the rest queue
        release.set()
        await asyncio.gather(first, *rest)
        assert seen == list(range(20)) and thread.idle
        thread.shutdown()
        with pytest.raises(RuntimeError, match="shut down"):
            thread.submit(lambda: None)

    asyncio.run(main())


def test_a_session_thread_is_idle_as_soon_as_the_awaited_call_returns() -> None:
    """The thread counts a call done before it hands the result over: the coroutine it resumes
    closes a thread-bound env on this thread only when ``idle`` (else on a spare thread). Counted
    after the hand-off, a few thousand calls saw it busy a few times."""
    async def main() -> int:
        thread = SessionThread("counted")
        calls = LoopCalls(thread, asyncio.get_running_loop())
        busy = 0
        for i in range(3000):
            await calls.run(int, i)
            busy += not thread.idle
        thread.shutdown()
        return busy

    assert asyncio.run(main()) == 0


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies only")
def test_a_session_thread_waits_for_the_loop_instead_of_preempting_it() -> None:
    """SCHED_BATCH: on one CPU a woken session thread does not preempt the event loop, which
    saves a switch out and back per step (bench/README.md, the server's sync case)."""
    async def main() -> int:
        thread = SessionThread("batch")
        policy = await LoopCalls(thread, asyncio.get_running_loop()).run(os.sched_getscheduler, 0)
        thread.shutdown()
        return policy

    assert asyncio.run(main()) == os.SCHED_BATCH


def _wait_for(condition: Callable[[], bool], limit_s: float = 10.0) -> bool:
    """Poll ``condition`` (bounded); True once it holds."""
    deadline = time.monotonic() + limit_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def _loop_module(kind: str | None) -> str:
    from agilerl.concurrency import new_event_loop

    loop = new_event_loop(kind)
    try:
        return type(loop).__module__.split(".")[0]
    finally:
        loop.close()


@pytest.mark.skipif(importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed on this platform")
def test_the_event_loop_is_uvloop_when_installed_unless_asyncio_is_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    from agilerl.concurrency import LOOP_ENV_VAR, run

    monkeypatch.delenv(LOOP_ENV_VAR, raising=False)
    assert _loop_module(None) == "uvloop" == _loop_module("auto") == _loop_module("uvloop")
    assert _loop_module("asyncio") == "asyncio"
    monkeypatch.setenv(LOOP_ENV_VAR, "asyncio")
    assert _loop_module(None) == "asyncio"
    assert _loop_module("uvloop") == "uvloop"  # an explicit choice (serve --loop) wins over the variable

    async def running() -> str:
        return type(asyncio.get_running_loop()).__module__.split(".")[0]

    assert run(running(), "uvloop") == "uvloop" and run(running(), "asyncio") == "asyncio"


def test_an_unknown_or_missing_event_loop_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from agilerl.concurrency import LOOP_ENV_VAR
    from agilerl.errors import InvalidArgument

    monkeypatch.setenv(LOOP_ENV_VAR, "trio")
    with pytest.raises(InvalidArgument, match=r"'trio' \(from AGILERL_EVENT_LOOP\) is not one of auto, uvloop, asyncio"):
        _loop_module(None)
    monkeypatch.delenv(LOOP_ENV_VAR)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    assert _loop_module("auto") == "asyncio"
    with pytest.raises(InvalidArgument, match="uvloop is not installed: pip install uvloop"):
        _loop_module("uvloop")
