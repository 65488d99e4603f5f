"""Liveness of the env server's WebSocket sessions: who is idle, half-open or not reading, and how
a session is ended (politely within ``close_timeout_s``, else the connection is aborted).

No peer holds a session past a deadline: an idle one past ``session_timeout_s``, one whose pong
never comes after a heartbeat ping, one that does not take a reply within ``send_timeout_s``.
A session busy in an env call is not reading, so its silence means nothing.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from agilerl.remote.frames import ErrorCode, encode, error_frame

__all__ = ["Link", "Watchdog", "send_quietly"]


class Link:
    """One session's socket and what the watchdog reads of it."""

    __slots__ = ("busy", "ending", "handler", "last_active", "last_seen", "ping_sent", "sending", "transport", "ws")

    def __init__(self, ws: web.WebSocketResponse, transport: Any) -> None:
        self.ws = ws
        self.transport = transport
        self.handler = asyncio.current_task()
        self.busy = self.ending = self.sending = False  # in an env call / ended / in a reply send
        self.last_active = self.last_seen = time.monotonic()  # last frame / last frame or pong
        self.ping_sent: float | None = None


class Watchdog:
    """Ends sessions that break a deadline; ``end`` and ``hang_up`` end one from anywhere."""

    def __init__(
        self,
        links: set[Link],
        spawn: Callable[[Coroutine[Any, Any, Any]], Any],
        *,
        session_timeout_s: float | None,
        heartbeat_s: float | None,
        send_timeout_s: float,
        close_timeout_s: float,
    ) -> None:
        self.links = links
        self._spawn = spawn
        self.session_timeout_s = session_timeout_s
        self.heartbeat_s = heartbeat_s
        self.send_timeout_s = send_timeout_s
        self.close_timeout_s = close_timeout_s

    async def run(self) -> None:
        """Forever: end idle sessions and those whose peer takes no reply; ping quiet ones and
        drop those whose pong never comes (half-open)."""
        timeout, heartbeat, send_timeout = self.session_timeout_s, self.heartbeat_s, self.send_timeout_s
        tick = min(t for t in (1.0, timeout and timeout / 4, heartbeat and heartbeat / 4, send_timeout / 4) if t)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for s in list(self.links):
                if s.busy or s.ending or s.ws.closed:
                    continue
                if s.sending and now - s.last_active > send_timeout:
                    self._spawn(self.end(s, WSCloseCode.GOING_AWAY, "the client took no reply"))
                elif timeout and now - s.last_active > timeout:
                    self._spawn(self.end(s, WSCloseCode.OK, f"idle for more than {timeout:g} s"))
                elif heartbeat and now - s.last_seen > heartbeat:
                    if s.ping_sent is None or s.ping_sent < s.last_seen:
                        s.ping_sent = now
                        self._spawn(_ping_quietly(s.ws))
                    elif now - s.ping_sent > heartbeat / 2:
                        self._spawn(self.end(s, WSCloseCode.GOING_AWAY, "no pong to a heartbeat ping"))

    async def end(self, link: Link, code: int, why: str) -> None:
        """End a session from the server side: tell the client why, then close the socket (or
        abort it, when the peer is not taking what was already sent)."""
        if link.ending:
            return
        link.ending = True
        if link.sending:  # stuck behind a reply the peer does not read: nothing polite gets through
            if link.transport is not None:
                link.transport.abort()
            return
        frame = encode(error_frame(ErrorCode.SESSION_ERROR, f"session ended: {why}"))
        await self.hang_up(link.ws, link.transport, code, frame, why)

    async def hang_up(
        self, ws: web.WebSocketResponse, transport: Any, code: int, frame: bytes | None = None, why: str = ""
    ) -> None:
        """Send ``frame`` (if any) and close ``ws`` politely within ``close_timeout_s``; past it,
        abort the connection: aiohttp waits for the peer to drain with no deadline of its own,
        and a closed asyncio transport still waits to flush its buffer."""
        try:
            await asyncio.wait_for(_close_politely(ws, code, frame, why), self.close_timeout_s)
        except (asyncio.TimeoutError, ConnectionError, RuntimeError):
            if transport is not None:
                transport.abort()


async def send_quietly(ws: web.WebSocketResponse, frame: bytes) -> bool:
    """Send one text frame; False when the peer is gone (that ends the session, not the server)."""
    if ws.closed:
        return False
    try:
        await ws.send_frame(frame, WSMsgType.TEXT)
        return True
    except (ConnectionError, RuntimeError):
        return False


async def _ping_quietly(ws: web.WebSocketResponse) -> None:
    try:
        await ws.ping()
    except (ConnectionError, RuntimeError):
        pass  # the session is ending anyway


async def _close_politely(ws: web.WebSocketResponse, code: int, frame: bytes | None, why: str) -> None:
    if frame is not None:
        await send_quietly(ws, frame)
    await ws.close(code=code, message=why[:120].encode())
