"""One background event loop per process for remote clients, and event-loop threads for servers.

Hundreds of remote sessions share one loop thread and one ``aiohttp.ClientSession``; synchronous
callers hand coroutines to it instead of each holding a thread.
"""

from __future__ import annotations

import asyncio
import atexit
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from agilerl.errors import AgileRLError

T = TypeVar("T")


class LoopThread:
    """An asyncio event loop running forever on its own daemon thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop from any thread."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and block the calling thread until it finishes."""
        if self.on_loop_thread():
            coro.close()
            raise AgileRLError(
                "a synchronous remote-env call was made from inside its own event loop; "
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

    def stop(self) -> None:
        """Stop the loop and join its thread (idempotent)."""
        if self._thread.is_alive() and not self.on_loop_thread():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(timeout=10)
        if not self._thread.is_alive() and not self.loop.is_closed():
            self.loop.close()


_shared: LoopThread | None = None
_shared_lock = threading.Lock()
_sessions: dict[int, Any] = {}


def shared_loop() -> LoopThread:
    """The process-wide loop every ``RemoteEnvClient`` runs on (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = LoopThread("agilerl-remote-clients")
            atexit.register(_shutdown_shared)
        return _shared


def client_session() -> Any:
    """The one ``aiohttp.ClientSession`` of the running loop (call on that loop)."""
    import aiohttp

    loop = asyncio.get_running_loop()
    session = _sessions.get(id(loop))
    if session is None or session.closed:
        # limit=0: every WebSocket holds a connection; the default pool of 100 would queue them.
        connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=False)
        session = aiohttp.ClientSession(connector=connector)
        _sessions[id(loop)] = session
    return session


def _shutdown_shared() -> None:
    loop_thread = _shared
    if loop_thread is None:
        return
    session = _sessions.pop(id(loop_thread.loop), None)
    if session is not None and loop_thread.loop.is_running():
        try:
            loop_thread.submit(session.close()).result(timeout=5)
        except Exception:  # interpreter shutdown: nothing left to report to
            pass
    loop_thread.stop()
