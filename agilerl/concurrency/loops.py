"""Event loops: which kind, one on its own thread, and the signals a long command stops on.

- ``new_event_loop`` / ``run``: uvloop where it is installed (uvicorn, OpenEnv's server, picks it
  the same way), asyncio's own loop otherwise or when asked (``$AGILERL_EVENT_LOOP``, ``--loop``).
- ``LoopThread`` and ``shared_loop()``: an event loop on its own thread, which no coroutine's
  ``sys.exit()`` ends; one per process for all remote clients, one per env server.
- ``stop_signals``: the signals a long-running command (``train``, ``serve``) stops cleanly on.
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import signal
import threading
from collections.abc import Awaitable, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from agilerl.errors import InvalidArgument

__all__ = ["LOOP_ENV_VAR", "LOOP_KINDS", "loop_kind", "new_event_loop", "run", "LoopThread", "shared_loop", "stop_signals"]

T = TypeVar("T")
log = logging.getLogger(__name__)


LOOP_ENV_VAR = "AGILERL_EVENT_LOOP"
LOOP_KINDS = ("auto", "uvloop", "asyncio")


def loop_kind(kind: str | None) -> str:
    """'uvloop' or 'asyncio' for ``kind`` (None: ``$AGILERL_EVENT_LOOP``, else 'auto')."""
    chosen = kind or os.environ.get(LOOP_ENV_VAR) or "auto"
    if chosen not in LOOP_KINDS:
        raise InvalidArgument(
            f"event loop {chosen!r} (from {'--loop' if kind else LOOP_ENV_VAR}) is not one of "
            f"{', '.join(LOOP_KINDS)}; 'auto' takes uvloop when it is installed."
        )
    if chosen == "asyncio":
        return chosen
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if chosen == "uvloop":
            raise InvalidArgument(
                "event loop 'uvloop' was asked for but uvloop is not installed: pip install uvloop "
                "(Linux and macOS), or choose 'auto' or 'asyncio'."
            ) from None
        return "asyncio"
    return "uvloop"


def new_event_loop(kind: str | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop of ``kind`` ('auto', 'uvloop', 'asyncio'; see ``loop_kind``).

    uvloop serves the same frames for a good deal less CPU (bench/README.md, the server's sync
    case); uvicorn, which runs OpenEnv's server, picks it the same way whenever it is installed."""
    if loop_kind(kind) == "uvloop":
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(coro: Coroutine[Any, Any, T], kind: str | None = None) -> T:
    """``asyncio.run(coro)`` on a ``new_event_loop(kind)``."""
    if loop_kind(kind) == "uvloop":
        import uvloop

        return uvloop.run(coro)
    return asyncio.run(coro)


# -- event-loop threads ------------------------------------------------------------------------


class LoopThread:
    """An asyncio event loop running forever on its own daemon thread, whatever its coroutines raise.

    asyncio (and uvloop) hand a task's ``SystemExit`` or ``KeyboardInterrupt`` to its awaiter and
    also re-raise it out of ``run_forever``, which would end the thread: one ``sys.exit()`` in an
    async rubric, judge or env would then leave every later call on the loop (every remote client
    in the process) waiting forever. The loop thread resumes instead; the exception still reaches
    whoever awaits that coroutine (a rubric's ``RubricError``, a failed episode, a re-raised
    Ctrl-C). No signal reaches this thread, so such an exception is always a coroutine's own.
    """

    def __init__(self, name: str) -> None:
        self.loop = new_event_loop()
        self._cleanups: list[Callable[[], Awaitable[Any]]] = []
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        while True:
            try:
                self.loop.run_forever()
                return
            except BaseException as exc:  # a coroutine's SystemExit or KeyboardInterrupt: not the loop's end
                if self._stopping:
                    return
                log.debug("%s: a coroutine raised %r; its awaiter gets it, the loop goes on",
                          self._thread.name, exc)

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block the calling thread until it finishes."""
        if self.on_loop_thread():
            coro.close()
            raise InvalidArgument(
                "a synchronous env-client call was made from inside its own event loop; "
                "await the async method (areset/astep/astate/aclose) instead."
            )
        return self.submit(coro).result()

    async def run_async(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on this loop from any loop (directly when already on it)."""
        if self.on_loop_thread():
            return await coro
        return await asyncio.wrap_future(self.submit(coro))

    def on_loop_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def at_stop(self, cleanup: Callable[[], Awaitable[Any]]) -> None:
        """Await ``cleanup()`` on the loop when ``stop()`` is called (e.g. close an HTTP session)."""
        self._cleanups.append(cleanup)

    def stop(self) -> None:
        """Run the ``at_stop`` cleanups, stop the loop and join its thread (idempotent)."""
        cleanups, self._cleanups = self._cleanups, []
        if cleanups and self.loop.is_running() and not self.on_loop_thread():
            try:
                self.submit(_run_all(cleanups)).result(timeout=5)
            except Exception:  # interpreter shutdown, or a cleanup that failed: nothing to report to
                pass
        self._stopping = True
        if self._thread.is_alive() and not self.on_loop_thread():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


async def _run_all(cleanups: list[Callable[[], Awaitable[Any]]]) -> None:
    for cleanup in cleanups:
        try:
            await cleanup()
        except Exception:  # one failed cleanup must not skip the rest
            log.debug("loop cleanup failed", exc_info=True)


_shared: LoopThread | None = None
_shared_lock = threading.Lock()


def shared_loop() -> LoopThread:
    """The process-wide loop every remote client runs on (started on first use, stopped at exit);
    hundreds of sessions share it instead of each holding a thread."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = LoopThread("agilerl-remote-clients")
            atexit.register(_shared.stop)
        return _shared



def stop_signals() -> list[signal.Signals]:
    """SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session), less SIGHUP where it is
    ignored, as ``nohup`` leaves it: a command started that way must outlive its terminal."""
    stops = [signal.SIGINT, signal.SIGTERM]
    hangup = getattr(signal, "SIGHUP", None)
    if hangup is not None and signal.getsignal(hangup) is not signal.SIG_IGN:
        stops.append(hangup)
    return stops
