"""Serve any text env, or an OpenEnv env as it is, over OpenEnv's protocol (aiohttp): the routes.

``/ws`` holds one fresh env per WebSocket session, and the HTTP routes (``/health``,
``/metadata``, ``/schema``, and ``/reset``, ``/step``, ``/state``, ``/mcp`` as OpenEnv's server
defines them: each call on a fresh env, closed after it: ``fresh_env_routes``) answer beside it.
The parts live in their own modules: frame dispatch (``dispatch``, ``openenv_host``), envs built and closed
exactly once on their session's own thread (``lifecycle``), deadlines and how a session ends
(``watchdog``), connection limits in front of aiohttp (``guard``).

No env call can stall the server: a sync env runs on its session's own thread, never on the
event loop, so a call that hangs holds only its session, not /health, heartbeats, other sessions
or shutdown. No peer can hold its resources without a deadline (what nginx, uvicorn and
websockets do): a request head must arrive within ``header_timeout_s``; idle keep-alive
connections close after ``keepalive_timeout_s``; open connections are capped
(``max_connections``, then 503) and the listen backlog is bounded; a reply the peer does not
take within ``send_timeout_s``, or a close it does not complete within ``close_timeout_s``,
aborts the connection, so a client that stops reading frees its slot and its env is closed.
"""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
import time
from collections.abc import Awaitable, Callable
from itertools import count
from typing import Any, TypeVar

from aiohttp import WSCloseCode, WSMessage, WSMsgType, web

from agilerl.concurrency import EnvCaller, WorkerThreads
from agilerl.errors import InvalidArgument
from agilerl.images import DEFAULT_MAX_IMAGE_PIXELS, ImageLimits
from agilerl.protocol import describe_env
from agilerl.remote.dispatch import Session, session_for
from agilerl.remote.frames import INFO_QUERY, ErrorCode, encode, encode_reply, error_frame, schema
from agilerl.remote.fresh_env_routes import FreshEnvRoutes
from agilerl.remote.guard import ConnectionGuard, credential_matches, is_loopback, quiet_bad_requests, url_host
from agilerl.remote.lifecycle import EnvLifecycle, concurrency_limit, served_class
from agilerl.remote.limits import (
    DEFAULT_BACKLOG,
    DEFAULT_CLOSE_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_KEEPALIVE_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT_ENVS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_SEND_TIMEOUT_S,
    TOKEN_ENV_VAR,
    clean_token,
)
from agilerl.remote.openenv_host import hosts_natively, native_schema
from agilerl.remote.watchdog import Link, Watchdog, send_quietly

__all__ = ["EnvServer"]

log = logging.getLogger(__name__)

T = TypeVar("T")
PONG_WITHIN_S = 0.25
"""A session busy in an env call answers its client's pings within this (a client's heartbeat,
``RemoteEnvClient(heartbeat_s=...)``, drops a session whose pong is late), however long the call."""


class EnvServer:
    """The aiohttp application: ``/ws`` sessions and the HTTP routes beside them."""

    def __init__(
        self,
        factory: Callable[[], Any],
        *,
        name: str,
        host: str = "127.0.0.1",
        port: int = 0,
        max_concurrent_envs: int = DEFAULT_MAX_CONCURRENT_ENVS,
        session_timeout_s: float | None = None,
        token: str | None = None,
        heartbeat_s: float | None = DEFAULT_HEARTBEAT_S,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S,
        keepalive_timeout_s: float = DEFAULT_KEEPALIVE_TIMEOUT_S,
        send_timeout_s: float = DEFAULT_SEND_TIMEOUT_S,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
        max_connections: int | None = None,
        backlog: int = DEFAULT_BACKLOG,
        max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS,
    ) -> None:
        if max_concurrent_envs < 1:
            raise InvalidArgument(f"max_concurrent_envs must be at least 1 (got {max_concurrent_envs}).")
        self.name = name
        self.host, self.port = host, port
        self.max_concurrent_envs = max_concurrent_envs
        self.session_timeout_s = session_timeout_s or None
        token = clean_token(token, "token=")
        self._expected = f"Bearer {token}".encode() if token else None
        self._max_message_bytes = max_message_bytes
        self._keepalive_timeout_s = keepalive_timeout_s
        self._close_timeout_s = close_timeout_s
        self._backlog = backlog
        self._image_limits = ImageLimits(max_pixels=max_image_pixels, setting="agilerl serve --max-image-pixels")
        # Every session's socket, plus room for /health probes and clients told CAPACITY_REACHED.
        self.guard = ConnectionGuard(
            header_timeout_s, max_connections if max_connections is not None else 2 * max_concurrent_envs + 64
        )
        # Sessions get a thread each (own_thread); these spare ones take the closes that would
        # queue behind a hung call.
        self._spare = EnvCaller(WorkerThreads("agilerl-env", max_workers=max_concurrent_envs + 2))
        self.envs = EnvLifecycle(factory, self._spare)
        self._active = 0
        self._turned_away = 0
        self._links: set[Link] = set()
        self._closing: set[asyncio.Task[Any]] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._sessions: set[asyncio.Task[Any]] = set()  # every /ws handler, until it returns
        self._pongers: dict[Link, asyncio.Task[WSMessage]] = {}  # reading busy sessions' sockets
        self._ponging: asyncio.Task[None] | None = None
        self.watchdog = Watchdog(
            self._links, self._spawn, session_timeout_s=self.session_timeout_s, heartbeat_s=heartbeat_s,
            send_timeout_s=send_timeout_s, close_timeout_s=close_timeout_s,
        )
        self._env_info: dict[str, Any] | None = None
        self._describing: asyncio.Task[dict[str, Any]] | None = None
        self._stopping = False
        self._thread_names = count(1)
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def active_sessions(self) -> int:
        """Sessions holding a slot: from the handshake until their env is closed."""
        return self._active

    @property
    def sessions_turned_away(self) -> int:
        """Sessions refused with ``CAPACITY_REACHED`` (full, or stopping): how often clients retried."""
        return self._turned_away

    @property
    def envs_created(self) -> int:
        return self.envs.created

    @property
    def envs_closed(self) -> int:
        return self.envs.closed

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth] if self._expected else [])
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metadata", self._metadata)
        app.router.add_get("/schema", self._schema)
        FreshEnvRoutes(self._with_fresh_env).add_to(app.router)
        return app

    async def start(self) -> str:
        """Bind and start serving; returns the base URL (the real port when ``port`` was 0)."""
        if not is_loopback(self.host) and not self._expected:
            log.warning(
                "serving on %s without a token: anyone who can reach it can run the env. "
                "Set --token or %s.", self.host, TOKEN_ENV_VAR,
            )
        quiet_bad_requests()
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, keepalive_timeout=self._keepalive_timeout_s,
        )
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        # Our own listener, not a TCPSite: every connection goes through the guard first.
        try:
            self._listener = await asyncio.get_running_loop().create_server(
                self.guard.wrap(server), self.host or None, self.port, backlog=self._backlog, reuse_address=True,
            )
        except OSError as exc:
            await self._runner.cleanup()
            self._spare.release()
            in_use = exc.errno == errno.EADDRINUSE
            raise InvalidArgument(
                f"cannot listen on {self.host}:{self.port}: "
                + ("another process is using that port" if in_use else (exc.strerror or str(exc)))
                + "; pick another with --port (--port 0 picks a free one)."
            ) from None
        self.port = self._listener.sockets[0].getsockname()[1]
        self._watcher = asyncio.create_task(self.watchdog.run())
        self._ponging = asyncio.create_task(self._answer_pings_while_busy())
        return self.url

    async def stop(self, grace_s: float = 10.0) -> None:
        """Close every session and the listener, then close each env exactly once; no env call
        delays this: a call still in flight is abandoned at once (its session is closed, so its
        reply could go nowhere) and its env closed. ``grace_s`` bounds the whole stop: an env
        close still hung near its end is left to its (daemon) thread, and the sessions waiting
        on it are ended; a client bounds nothing (``close_timeout_s``)."""
        loop = asyncio.get_running_loop()
        # what is left once the closes' share of the grace is spent: ending what still waits
        reserve = min(self._close_timeout_s, grace_s / 4)
        deadline = loop.time() + grace_s - reserve

        def left(cap: float | None = None) -> float:
            remaining = max(0.01, deadline - loop.time())
            return remaining if cap is None else min(cap, remaining)

        self._stopping = True
        for task in (self._watcher, self._ponging):
            if task is not None:
                task.cancel()
        if self._listener is not None:
            self._listener.close()  # no new connections while the sessions end
        await asyncio.gather(
            *(self.watchdog.end(s, WSCloseCode.GOING_AWAY, "the server is stopping") for s in list(self._links))
        )
        unwinding = {s.handler for s in self._links if not s.busy}
        for task in self._handlers - unwinding:  # in an env call, or building its env
            task.cancel()
        if self._handlers:
            _, late = await asyncio.wait(self._handlers, timeout=left(self._close_timeout_s))
            for task in late:  # a close handshake that hangs
                task.cancel()
        if self._closing:
            await asyncio.wait(self._closing, timeout=left())
        for task in self._sessions:  # still waiting on an env close that hangs: it is abandoned
            task.cancel()
        if self._sessions:
            await asyncio.wait(self._sessions, timeout=reserve / 2)
        self.guard.abort_all()  # keep-alive and half-sent connections
        if self._runner is not None:
            # aiohttp's own wait for handlers (an HTTP route in a hung env call) gets what is left
            self._runner._shutdown_timeout = max(0.01, deadline + reserve - loop.time())
            await self._runner.cleanup()
        self._spare.release()

    # -- what every route shares ----------------------------------------------------------------

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if not credential_matches(request.headers.get("Authorization", ""), self._expected):
            return web.json_response(
                {"error": "missing or wrong bearer token: send 'Authorization: Bearer <token>'."},
                status=401,
            )
        return await handler(request)

    def _own_thread(self) -> EnvCaller:
        return self._spare.own_thread(f"agilerl-session-{next(self._thread_names)}")

    def _note(self, env: Any) -> None:
        """The first env built describes them all (``/metadata``) and sets the session limit."""
        if self._env_info is not None:
            return
        self._describe(env)
        limit, why = concurrency_limit(env, self.max_concurrent_envs)
        if why is not None:
            log.warning(why)
            self.max_concurrent_envs = limit

    # -- HTTP routes ---------------------------------------------------------------------------

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    async def _schema(self, request: web.Request) -> web.Response:
        info = await self._described()
        return web.json_response(info.get("native_schema") or schema())

    async def _metadata(self, request: web.Request) -> web.Response:
        info = {k: v for k, v in (await self._described()).items() if k != "native_schema"}
        return web.json_response(
            {
                "name": self.name,
                **info,
                "active_sessions": self._active,
                "max_concurrent_envs": self.max_concurrent_envs,
                "session_timeout_s": self.session_timeout_s,
                "protocol": "openenv-websocket",
            }
        )

    async def _with_fresh_env(self, use: Callable[[Session], Awaitable[T]]) -> T:
        """``use`` a session on a fresh env (its own thread), closed right after."""
        caller = self._own_thread()
        try:
            env = await self.envs.build(caller)
            try:
                self._note(env)
                session = session_for(env, caller, with_info=False, image_limits=self._image_limits)
                await session.open()
                try:
                    return await use(session)
                finally:
                    await session.close()
            finally:
                await self.envs.close(env, caller)
        finally:
            caller.release()

    async def _described(self) -> dict[str, Any]:
        """What ``_describe`` found; when no session has built an env yet, one is built for it."""
        info = self._env_info
        if info is None:
            if self._describing is None:  # one build, however many clients ask at once
                self._describing = self._spawn(self._describe_a_new_env())  # stop() waits for it
            info = await asyncio.shield(self._describing)
        return info

    async def _describe_a_new_env(self) -> dict[str, Any]:
        caller = self._own_thread()
        try:
            env = await self.envs.build(caller)
            self._note(env)
            await self.envs.close(env, caller)
            assert self._env_info is not None
            return self._env_info
        except Exception as exc:
            return {"description": "", "factory_error": f"{type(exc).__name__}: {exc}"}
        finally:
            caller.release()
            self._describing = None  # after a failed build, the next request tries again

    def _describe(self, env: Any) -> dict[str, Any]:
        """What clients need to treat the env as a local one (its ``EnvInfo``, which
        ``RemoteEnvClient.describe`` parses back), plus a summary: the first line of the env
        class's docstring (an OpenEnv env's own, not its adapter's)."""
        doc = inspect.getdoc(served_class(env)) or ""
        info = {"description": doc.splitlines()[0] if doc else "", **describe_env(env).metadata()}
        if hosts_natively(env):
            info["native_schema"] = native_schema(env)
        self._env_info = info
        return info

    # -- WebSocket sessions --------------------------------------------------------------------

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            timeout=2.0,  # for the peer's close reply; a silent peer must not hold the slot long
            autoping=False,  # pings and pongs are ours: aiohttp's heartbeat costs ~10% per frame
            max_msg_size=self._max_message_bytes,
            compress=False,
        )
        if self._stopping or self._active >= self.max_concurrent_envs:
            self._turned_away += 1
            await ws.prepare(request)
            why = (
                "the server is stopping"
                if self._stopping
                else f"server at capacity: {self._active} of {self.max_concurrent_envs} sessions in "
                "use; retry later or start the server with a larger --max-concurrent-envs."
            )
            await self.watchdog.hang_up(ws, request.transport, WSCloseCode.OK, encode(error_frame(
                ErrorCode.CAPACITY_REACHED, why, active_sessions=self._active, max_sessions=self.max_concurrent_envs,
            )))
            return ws
        self._active += 1  # the slot is held from here until the env is closed
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        self._sessions.add(task)
        try:
            return await self._hold(request, ws, task)
        finally:
            self._sessions.discard(task)

    async def _hold(
        self, request: web.Request, ws: web.WebSocketResponse, task: asyncio.Task[Any]
    ) -> web.WebSocketResponse:
        """One session from its env's build to its close (the slot taken by ``_ws`` is freed
        when the env is closed)."""
        caller = self._own_thread()
        env: Any = None
        link: Link | None = None
        session: Session | None = None
        try:
            await ws.prepare(request)
            try:
                env = await self.envs.build(caller)
            except Exception as exc:
                log.exception("env factory failed")
                await self.watchdog.hang_up(ws, request.transport, WSCloseCode.INTERNAL_ERROR, encode(error_frame(
                    ErrorCode.FACTORY_ERROR, f"the env factory failed: {type(exc).__name__}: {exc}",
                    factory_name=self.name,
                )))
                return ws
            self._note(env)
            link = Link(ws, request.transport)
            self._links.add(link)
            if self._stopping:  # stop() began while the env was being built
                await self.watchdog.end(link, WSCloseCode.GOING_AWAY, "the server is stopping")
                return ws
            session = session_for(
                env, caller, with_info=request.query.get(INFO_QUERY) in ("1", "true"), image_limits=self._image_limits
            )
            await self._serve(link, session)
        finally:
            self._handlers.discard(task)
            if link is not None:
                self._links.discard(link)
            try:
                if session is not None:
                    await self._leave(session)
            finally:  # even when stop() cancels the leaving: the env is closed, the slot freed
                if env is None:
                    self._active -= 1
                    caller.release()
                else:
                    closing = self._spawn(self._close_and_release(env, caller))
                    try:
                        await asyncio.shield(closing)
                    except asyncio.CancelledError:
                        pass  # the close task carries on and releases the slot
                    if link is not None and not ws.closed:
                        await self.watchdog.hang_up(ws, link.transport, WSCloseCode.OK)
        return ws

    async def _serve(self, link: Link, session: Session) -> None:
        ws = link.ws
        try:
            await session.open()
        except Exception as exc:
            log.exception("opening the env's session failed")
            await self.watchdog.hang_up(ws, link.transport, WSCloseCode.INTERNAL_ERROR, encode(error_frame(
                ErrorCode.SESSION_ERROR, f"the env's session could not start: {type(exc).__name__}: {exc}",
            )))
            return
        held: WSMessage | None = None  # what the socket's reader got during the last env call
        while True:
            msg = held or await ws.receive()
            held = None
            kind = msg.type
            if kind is not WSMsgType.TEXT and kind is not WSMsgType.BINARY:
                if kind is WSMsgType.PONG:
                    link.last_seen = time.monotonic()
                    continue
                if kind is WSMsgType.PING:
                    link.last_seen = time.monotonic()
                    await ws.pong(msg.data)
                    continue
                return  # close, error, or the socket went away
            link.busy = True
            try:
                reply = await session.reply(msg.data)
            finally:
                link.busy = False
                link.last_active = link.last_seen = time.monotonic()
                ponger = self._pongers.pop(link, None) if self._pongers else None
                if ponger is not None:
                    ponger.cancel()
            if ponger is not None:
                await asyncio.wait((ponger,))  # it must stop reading before this handler reads
                held = None if ponger.cancelled() or ponger.exception() else ponger.result()
            if reply is None:
                await self.watchdog.hang_up(ws, link.transport, WSCloseCode.OK)
                return
            link.sending = True  # the watchdog aborts a send the peer does not take in time
            try:
                if not await send_quietly(ws, encode_reply(reply)):
                    return
            finally:
                link.sending = False

    async def _answer_pings_while_busy(self) -> None:
        """Forever: give each session busy in an env call a reader of its socket until the call
        returns (its handler reads nothing meanwhile), so a slow step answers its client's
        heartbeat pings and is not taken for a peer that is gone. A fast call never gets one."""
        while True:
            await asyncio.sleep(PONG_WITHIN_S)
            for link in self._links:
                if link.busy and link not in self._pongers and not link.ws.closed:
                    self._pongers[link] = asyncio.ensure_future(_pong_meanwhile(link))

    async def _leave(self, session: Session) -> None:
        """Close what the session held open (an MCP client session), within ``close_timeout_s``."""
        try:
            await asyncio.wait_for(session.close(), self._close_timeout_s)
        except Exception:  # noqa: BLE001 - the env is closed next either way
            log.warning("closing the env's session failed", exc_info=True)

    async def _close_and_release(self, env: Any, caller: EnvCaller) -> None:
        try:
            await self.envs.close(env, caller)
        finally:
            caller.release()
            self._active -= 1

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task


async def _pong_meanwhile(link: Link) -> WSMessage:
    """Answer pings on ``link`` and note pongs; the first other message (a close, a frame sent
    before the reply) is returned for its handler to take next."""
    ws = link.ws
    while True:
        msg = await ws.receive()
        if msg.type is WSMsgType.PING:
            await ws.pong(msg.data)
        elif msg.type is not WSMsgType.PONG:
            return msg
        link.last_seen = time.monotonic()
