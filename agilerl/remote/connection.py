"""The transport under ``RemoteEnvClient``: one WebSocket session (``Connection``) and the
process-wide ``aiohttp.ClientSession`` pool every session shares (``client_session()``).

It knows frames only as bytes in and text out; what to send, when to retry and which replica to
use is the client's policy (``agilerl.remote.client``), the way httpx keeps its transport apart.
"""

from __future__ import annotations

import asyncio
import collections
import weakref
from typing import Any

from agilerl.concurrency import shared_loop
from agilerl.errors import RemoteEnvError
from agilerl.remote.frames import CLOSE_FRAME, peer_text
from agilerl.remote.limits import TOKEN_ENV_VAR

__all__ = [
    "DEFAULT_CLIENT_HEARTBEAT_S",
    "DEFAULT_MAX_REPLY_BYTES",
    "ConnectionLost",
    "Connection",
    "client_session",
    "token_refused",
]


DEFAULT_MAX_REPLY_BYTES = 64 * 1024 * 1024
"""The largest frame a client reads: a bound on the memory one env answer can take."""

DEFAULT_CLIENT_HEARTBEAT_S = 20.0
"""A client pings a server that has sent nothing for this long; no pong within half of it ends
the session. A peer gone without closing its socket is found in 1.5x this, not in
``request_timeout_s``; a server answers pings while an env step runs (ours, aiohttp's, OpenEnv's)."""


def token_refused(url: str, status: int, *, sent: bool) -> RemoteEnvError:
    """The error for a server that answered 401/403: a token problem, never "is it running"."""
    what = (
        "refused the token this client sent" if sent else "requires a token and this client sent none"
    )
    return RemoteEnvError(
        f"{url} {what} (HTTP {status}): set {TOKEN_ENV_VAR} (or RemoteEnvClient(token=...)) to the "
        f"token the server was started with (agilerl serve --token, or its {TOKEN_ENV_VAR})."
    )


class ConnectionLost(Exception):
    """The socket failed or closed; the client retries it at reset and replays an episode it broke."""


class Connection:
    """One WebSocket session. A reader task receives every frame, so the server's heartbeat
    pings are answered while the client is idle (the model may generate for minutes), and
    frames the server sends unasked (why it is closing) wait in order for the next request."""

    def __init__(self, ws: Any, close_timeout_s: float, heartbeat_s: float | None = None) -> None:
        self._ws = ws
        self._close_timeout_s = close_timeout_s
        self._heartbeat_s = heartbeat_s
        self._inbox: collections.deque[str | bytes | ConnectionLost] = collections.deque()
        self._waiter: asyncio.Future[str | bytes | ConnectionLost] | None = None
        self._reader = asyncio.ensure_future(self._read())

    @classmethod
    async def open(
        cls, url: str, headers: dict[str, str], timeout_s: float, max_message_bytes: int,
        heartbeat_s: float | None = None,
    ) -> Connection:
        """Open a session on ``url`` within ``timeout_s``; a frame over ``max_message_bytes`` ends
        it, and so does a ping unanswered for ``heartbeat_s / 2`` (sent after ``heartbeat_s`` of
        silence; None: no heartbeat)."""
        import aiohttp

        try:
            ws = await asyncio.wait_for(
                client_session().ws_connect(
                    url + "/ws?metadata=1",  # ask for each observation's info (agilerl servers; others ignore it)
                    headers=headers,
                    max_msg_size=max_message_bytes,
                    timeout=aiohttp.ClientWSTimeout(ws_close=timeout_s),
                    compress=0,
                    heartbeat=heartbeat_s or None,
                ),
                timeout=timeout_s,
            )
        except aiohttp.WSServerHandshakeError as exc:
            if exc.status in (401, 403):
                raise token_refused(url, exc.status, sent="Authorization" in headers) from None
            raise ConnectionLost(f"cannot open a session on {url}: {peer_text(str(exc))}") from exc
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise ConnectionLost(f"cannot connect to {url}: {exc}") from exc
        return cls(ws, timeout_s, heartbeat_s or None)

    @property
    def closed(self) -> bool:
        return self._reader.done() and not self._inbox

    async def _read(self) -> None:
        import aiohttp

        ws = self._ws
        try:
            while True:
                msg = await ws.receive()  # answers pings on the way
                if msg.type is aiohttp.WSMsgType.TEXT or msg.type is aiohttp.WSMsgType.BINARY:
                    self._deliver(msg.data)
                    continue
                reason = f"the server closed the connection (code {ws.close_code})"
                if msg.type is aiohttp.WSMsgType.ERROR and isinstance(msg.data, aiohttp.ServerTimeoutError):
                    reason = (  # aiohttp's only timeout on an open socket: the heartbeat's pong
                        f"the server answered no heartbeat ping (heartbeat_s={self._heartbeat_s}, the pong "
                        "due within half of it): it is gone, or its host is frozen"
                    )
                elif msg.type is aiohttp.WSMsgType.ERROR:
                    reason = f"the connection failed: {peer_text(str(msg.data))}"
                    if getattr(msg.data, "code", None) == aiohttp.WSCloseCode.MESSAGE_TOO_BIG:
                        reason += " (raise the client's max_message_bytes if the env means it)"
                self._deliver(ConnectionLost(reason))
                return
        except Exception as exc:  # the socket broke under the reader
            self._deliver(ConnectionLost(peer_text(str(exc) or type(exc).__name__)))

    def _deliver(self, item: str | bytes | ConnectionLost) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(item)
        else:
            self._inbox.append(item)

    async def request(self, frame: bytes, timeout_s: float | None) -> str | bytes:
        """Send one frame and return the next frame from the server."""
        import aiohttp

        if not self._inbox and not self._reader.done():
            try:
                await self._ws.send_frame(frame, aiohttp.WSMsgType.TEXT)
            except (ConnectionError, RuntimeError, aiohttp.ClientError):
                pass  # the reader reports why the connection ended
        if self._inbox:
            item = self._inbox.popleft()
        else:
            loop = asyncio.get_running_loop()
            self._waiter = waiter = loop.create_future()
            # A bare timer, not ``wait_for``: that wraps every request in a task of its own.
            expiry = None if timeout_s is None else loop.call_later(timeout_s, _expire, waiter)
            try:
                item = await waiter
            finally:
                if expiry is not None:
                    expiry.cancel()
        if isinstance(item, ConnectionLost):
            self._inbox.appendleft(item)  # every later request gets the same answer
            raise item
        return item

    async def close(self, *, polite: bool) -> None:
        """Politely: send a close frame and let the server close first (within the connect
        timeout). Else hang up at once: abort the connection, waiting for nothing (a server busy
        in an env call would answer a close handshake only when the call returns)."""
        import aiohttp

        if not polite:
            self.abort()
            return
        try:
            if not self._reader.done():
                await self._ws.send_frame(CLOSE_FRAME, aiohttp.WSMsgType.TEXT)
                await asyncio.wait_for(asyncio.shield(self._reader), timeout=self._close_timeout_s)
            await asyncio.wait_for(self._ws.close(), timeout=self._close_timeout_s)
        except (ConnectionError, RuntimeError, aiohttp.ClientError, asyncio.TimeoutError):
            self.abort()  # the server ends the session (and closes its env) either way
        self._reader.cancel()

    def abort(self) -> None:
        """Hang up now, waiting for nothing; the server ends the session and closes its env."""
        self._reader.cancel()
        # aiohttp has no public abort for a client WebSocket; its connection's transport has one.
        conn = getattr(self._ws, "_conn", None) or getattr(getattr(self._ws, "_response", None), "connection", None)
        transport = getattr(conn, "transport", None)
        if transport is not None:
            transport.abort()
            conn.close()  # hands the dead connection back to aiohttp's pool as closed
        else:  # an aiohttp without those attributes: close in the background, never awaited here
            task = asyncio.ensure_future(asyncio.wait_for(self._ws.close(), timeout=self._close_timeout_s))
            task.add_done_callback(lambda t: t.cancelled() or t.exception())


def client_session() -> Any:
    """The one ``aiohttp.ClientSession`` of the running loop (call on that loop); on the shared
    loop it is closed when that loop stops."""
    import aiohttp

    loop = asyncio.get_running_loop()
    session = _sessions.get(loop)
    if session is None or session.closed:
        # limit=0: every WebSocket holds a connection; the default pool of 100 would queue them.
        connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=False)
        session = aiohttp.ClientSession(connector=connector)
        _sessions[loop] = session
        shared = shared_loop()
        if shared.loop is loop:
            shared.at_stop(session.close)
    return session


_sessions: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


def _expire(waiter: asyncio.Future[Any]) -> None:
    if not waiter.done():
        waiter.set_exception(asyncio.TimeoutError())
