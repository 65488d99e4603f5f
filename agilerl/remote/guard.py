"""Limits on the env server's TCP connections, in front of aiohttp's HTTP protocol.

aiohttp (3.9 on) has no deadline for a request head that arrives slowly or never, and no cap on
open connections: 1,000 half-sent requests hold 1,000 file descriptors for minutes. As nginx
(``client_header_timeout``, ``worker_connections``) and uvicorn (``limit_concurrency``) do, each
connection must deliver its first request head within ``header_timeout_s`` (else 408 and close),
and past ``max_connections`` open ones a new connection gets 503 and is closed at once. Later
requests on a kept-alive connection are bounded by aiohttp's own ``keepalive_timeout``.
A malformed request (a header past aiohttp's size cap, bytes that are not HTTP) is answered 400
by aiohttp and logged here as one warning line, never as a traceback per request; a bearer
credential is checked here too, and any value that is not the token (malformed, non-ASCII) is
simply refused.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import logging
from collections.abc import Callable
from typing import Any

__all__ = [
    "ConnectionGuard",
    "quiet_bad_requests",
    "credential_matches",
    "is_loopback",
    "url_host",
]

_TIMED_OUT = (
    b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n"
)
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nConnection: close\r\nRetry-After: 1\r\n"
    b"Content-Length: 0\r\n\r\n"
)


class ConnectionGuard:
    """Wraps an asyncio protocol factory: a head deadline per connection and a connection cap."""

    def __init__(self, header_timeout_s: float, max_connections: int) -> None:
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self.open: set[_Guarded] = set()
        self.timed_out = 0  # connections closed for a late request head
        self.refused = 0  # connections refused over max_connections

    def wrap(self, factory: Callable[[], asyncio.Protocol]) -> Callable[[], asyncio.Protocol]:
        """The factory to give ``loop.create_server``."""
        return lambda: _Guarded(self, factory)

    def abort_all(self) -> None:
        """Drop every connection still open (at shutdown: idle keep-alives, half-sent heads)."""
        for conn in list(self.open):
            conn.abort()


class _OneLineBadRequests(logging.Filter):
    """aiohttp logs each malformed request with its traceback (``logger.exception``): a peer's
    mistake, not the server's, so it becomes one warning line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        from aiohttp.http_exceptions import HttpProcessingError

        if isinstance(exc, HttpProcessingError):
            record.msg, record.args = "%s: %s", (record.getMessage(), str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            record.exc_info = record.exc_text = None
        return True


_ONE_LINE = _OneLineBadRequests()


def quiet_bad_requests() -> None:
    """Log malformed requests as one line (idempotent)."""
    logger = logging.getLogger("aiohttp.server")
    if _ONE_LINE not in logger.filters:
        logger.addFilter(_ONE_LINE)


class _Guarded(asyncio.Protocol):
    """One connection: forwards everything to aiohttp's protocol; until the first request head is
    in, watches the bytes for its end (then the watching ``data_received`` steps aside)."""

    def __init__(self, guard: ConnectionGuard, factory: Callable[[], asyncio.Protocol]) -> None:
        self._guard = guard
        self._factory = factory
        self._inner: Any = None
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._tail = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        guard = self._guard
        self._transport = transport  # type: ignore[assignment]
        if len(guard.open) >= guard.max_connections:
            guard.refused += 1
            transport.write(_BUSY)  # type: ignore[attr-defined]
            # Half-close and linger briefly, reading what the client sends: closing with its
            # request unread would reset the connection before it reads the 503.
            transport.write_eof()  # type: ignore[attr-defined]
            asyncio.get_running_loop().call_later(1.0, transport.abort)  # type: ignore[attr-defined]
            return
        guard.open.add(self)
        self._inner = inner = self._factory()
        inner.connection_made(transport)
        self.eof_received = inner.eof_received  # type: ignore[method-assign]
        self.pause_writing = inner.pause_writing  # type: ignore[method-assign]
        self.resume_writing = inner.resume_writing  # type: ignore[method-assign]
        self._timer = asyncio.get_running_loop().call_later(guard.header_timeout_s, self._too_late)

    def data_received(self, data: bytes) -> None:
        inner = self._inner
        if inner is None:
            return  # refused: the 503 is sent, what the client sends is dropped
        seen = self._tail + data
        if b"\r\n\r\n" in seen:
            self._head_is_in()
        else:
            self._tail = seen[-3:]
        inner.data_received(data)

    def _head_is_in(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.data_received = self._inner.data_received  # type: ignore[method-assign]
        if self._transport is not None:
            # uvloop's transports look data_received up once, when given their protocol: give it
            # this one again, so they call aiohttp's protocol directly from now on too
            self._transport.set_protocol(self)

    def _too_late(self) -> None:
        self._timer = None
        transport = self._transport
        if transport is not None and not transport.is_closing():
            self._guard.timed_out += 1
            transport.write(_TIMED_OUT)
            transport.close()  # a few bytes into an empty buffer: the socket closes at once
            asyncio.get_running_loop().call_later(1.0, transport.abort)  # unless the peer stalls it

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._inner is not None:
            self._guard.open.discard(self)
            self._inner.connection_lost(exc)
            self._inner = None
        self._transport = None


def credential_matches(given: str, expected: bytes | None) -> bool:
    """Constant-time check of an ``Authorization`` value; any value that is not even text
    (non-ASCII bytes aiohttp kept as surrogates) simply does not match."""
    try:
        return expected is not None and hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected)
    except (UnicodeError, TypeError):
        return False


def is_loopback(host: str) -> bool:
    """True for an address only this machine can reach (serving there needs no token)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_host(host: str) -> str:
    """``host`` as written in a URL a client can reach (a wildcard bind is reached on loopback)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
