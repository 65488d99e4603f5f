"""The env server's envs, from build to close: each built from the factory on the thread of the
session that will use it, and closed exactly once, whatever ends the session.

A sync env's every call (build, reset, step, close) runs on its session's own thread, as OpenEnv
gives each session one executor thread, so an env bound to the thread that built it (an sqlite
connection made in ``__init__``, Playwright's sync API) works. Only a close that would queue
behind a call that never returned (a hung env, abandoned by ``stop()``) runs on a spare thread.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from agilerl.concurrency import EnvCaller
from agilerl.envs.openenv_native import OpenEnvTextEnv
from agilerl.protocol import close_env

__all__ = ["served_class", "concurrency_limit", "EnvLifecycle"]

log = logging.getLogger(__name__)


def served_class(env: Any) -> type:
    """The class that describes a built env: an OpenEnv env's own, not its text adapter's."""
    return type(env.env if isinstance(env, OpenEnvTextEnv) else env)


def concurrency_limit(env: Any, asked: int) -> tuple[int, str | None]:
    """Sessions the server may hold for ``env``: ``asked``, unless its class declares
    ``SUPPORTS_CONCURRENT_SESSIONS = False`` (OpenEnv's default), then 1; with the reason."""
    klass = served_class(env)
    if asked <= 1 or getattr(klass, "SUPPORTS_CONCURRENT_SESSIONS", True):
        return asked, None
    return 1, (
        f"{klass.__name__} does not declare SUPPORTS_CONCURRENT_SESSIONS = True, so it is served one "
        f"session at a time (--max-concurrent-envs asked for {asked}); set "
        "SUPPORTS_CONCURRENT_SESSIONS = True on the class once its instances share no state."
    )


class EnvLifecycle:
    """Builds envs with ``factory`` and closes each exactly once; counts both."""

    def __init__(self, factory: Callable[[], Any], spare: EnvCaller) -> None:
        self._factory = factory
        self._spare = spare  # for closes whose own thread is stuck in a call
        self._counts = threading.Lock()
        self.created = 0
        self.closed = 0

    async def build(self, caller: EnvCaller) -> Any:
        """A fresh env, built on ``caller``'s thread. If the awaiting coroutine is cancelled
        first (``stop()``'s grace ran out), the env is closed once it exists: none is left open."""
        claim = _Claim()
        try:
            return await caller.in_thread(self._build_in_thread, claim)
        except asyncio.CancelledError:
            orphan = claim.abandon()
            if orphan is not None:  # built, but its delivery was cancelled
                (caller if caller.idle else self._spare).submit(self._close_in_thread, orphan)
            raise

    async def close(self, env: Any, caller: EnvCaller) -> None:
        """Close ``env`` on ``caller``'s thread, or on a spare one when that thread is stuck in a
        call; never raises (the session is over either way)."""
        await (caller if caller.idle else self._spare).in_thread(self._close_in_thread, env)

    def _build_in_thread(self, claim: _Claim) -> Any:
        env = self._factory()
        with self._counts:
            self.created += 1
        if not claim.deliver(env):
            self._close_in_thread(env)
        return env

    def _close_in_thread(self, env: Any) -> None:
        try:
            close_env(env)
        except Exception:
            log.exception("env.close() failed")
        finally:
            with self._counts:
                self.closed += 1


class _Claim:
    """Hands a built env to the coroutine still waiting for it; once that gave up, the builder
    thread closes the env itself."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._abandoned = False
        self._env: Any = None

    def deliver(self, env: Any) -> bool:
        with self._lock:
            if self._abandoned:
                return False
            self._env = env
            return True

    def abandon(self) -> Any:
        """Give up; returns the env when it was already built (the caller must close it)."""
        with self._lock:
            self._abandoned = True
            env, self._env = self._env, None
            return env
