"""Serve any text env over OpenEnv's WebSocket protocol (aiohttp), one fresh env per session.

Each session drives its env through an ``InProcessEnvClient``'s async methods, so its answers are
checked by the same protocol rules as in-process rollouts. The clients share the server's
``EnvCaller``: sync env calls run on worker threads, never on the event loop, so an env call that
stalls holds only its own thread, not /health, heartbeats, other sessions or shutdown. Each
session's env is closed exactly once, whatever ends the session.

No peer can hold the server's resources without a deadline (what nginx, uvicorn and websockets
do): a request head must arrive within ``header_timeout_s``; idle keep-alive connections close
after ``keepalive_timeout_s``; open connections are capped (``max_connections``, then 503) and
the listen backlog is bounded; a reply the peer does not take within ``send_timeout_s``, or a
close it does not complete within ``close_timeout_s``, aborts the connection, so a client that
stops reading frees its slot and its env is closed.
"""

from __future__ import annotations

import asyncio
import hmac
import inspect
import ipaddress
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from agilerl.concurrency import EnvCaller, WorkerThreads
from agilerl.envs.client import InProcessEnvClient
from agilerl.errors import InvalidArgument
from agilerl.protocol import close_env, describe_env
from agilerl.remote.frames import (
    ErrorCode,
    FrameError,
    ResetFrame,
    StateFrame,
    StepFrame,
    error_frame,
    observation_frame,
    parse_client_frame,
    schema,
    state_frame,
)
from agilerl.remote.guard import ConnectionGuard
from agilerl.remote.limits import (
    DEFAULT_BACKLOG,
    DEFAULT_CLOSE_TIMEOUT_S,
    DEFAULT_HEADER_TIMEOUT_S,
    DEFAULT_HEARTBEAT_S,
    DEFAULT_KEEPALIVE_TIMEOUT_S,
    DEFAULT_MAX_CONCURRENT_ENVS,
    DEFAULT_MAX_MESSAGE_BYTES,
    DEFAULT_SEND_TIMEOUT_S,
)
from agilerl.remote.openenv_host import NativeSession, hosts_natively, native_schema

log = logging.getLogger(__name__)

TOKEN_ENV_VAR = "AGILERL_ENV_TOKEN"


class _Session:
    __slots__ = (
        "busy", "client", "ending", "env", "episode_id", "handler", "last_active", "last_seen", "native",
        "ping_sent", "sending", "steps", "transport", "ws",
    )

    def __init__(self, ws: web.WebSocketResponse, transport: Any, env: Any, caller: EnvCaller) -> None:
        self.ws = ws
        self.transport = transport
        self.handler = asyncio.current_task()
        self.env = env
        self.client = InProcessEnvClient(env, caller=caller)
        # an OpenEnv env speaks its own Action/Observation fields, as openenv's server would
        self.native = NativeSession(env, caller) if hosts_natively(env) else None
        self.busy = self.ending = self.sending = False  # in an env call / ended / in a reply send
        self.last_active = self.last_seen = time.monotonic()  # last frame / last frame or pong
        self.ping_sent: float | None = None
        self.steps = 0
        self.episode_id: str | None = None


class EnvServer:
    """The aiohttp application: ``/ws`` sessions, ``/health``, ``/metadata``, ``/schema``."""

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
    ) -> None:
        if max_concurrent_envs < 1:
            raise InvalidArgument(f"max_concurrent_envs must be at least 1 (got {max_concurrent_envs}).")
        self.name = name
        self.host, self.port = host, port
        self.max_concurrent_envs = max_concurrent_envs
        self.session_timeout_s = session_timeout_s or None
        self._factory = factory
        self._token = token
        self._heartbeat_s = heartbeat_s
        self._max_message_bytes = max_message_bytes
        self._keepalive_timeout_s = keepalive_timeout_s
        self._send_timeout_s = send_timeout_s
        self._close_timeout_s = close_timeout_s
        self._backlog = backlog
        # Every session's socket, plus room for /health probes and clients told CAPACITY_REACHED.
        self.guard = ConnectionGuard(
            header_timeout_s, max_connections if max_connections is not None else 2 * max_concurrent_envs + 64
        )
        # One call in flight per session, plus env builds and closes around them.
        self._threads = WorkerThreads("agilerl-env", max_workers=2 * max_concurrent_envs + 2)
        self.caller = EnvCaller(self._threads)
        self._active = 0
        self._sessions: set[_Session] = set()
        self._closing: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._env_info: dict[str, Any] | None = None
        self._describing: asyncio.Task[dict[str, Any]] | None = None
        self._stopping = False
        self._counts = threading.Lock()
        self.envs_created = 0
        self.envs_closed = 0
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self._watcher: asyncio.Task[None] | None = None

    @property
    def active_sessions(self) -> int:
        """Sessions holding a slot: from the handshake until their env is closed."""
        return self._active

    @property
    def url(self) -> str:
        return f"http://{_url_host(self.host)}:{self.port}"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth] if self._token else [])
        app.router.add_get("/ws", self._ws)
        app.router.add_get("/health", self._health)
        app.router.add_get("/metadata", self._metadata)
        app.router.add_get("/schema", self._schema)
        return app

    async def start(self) -> str:
        """Bind and start serving; returns the base URL (the real port when ``port`` was 0)."""
        if not _is_loopback(self.host) and not self._token:
            log.warning(
                "serving on %s without a token: anyone who can reach it can run the env. "
                "Set --token or %s.", self.host, TOKEN_ENV_VAR,
            )
        self._runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, keepalive_timeout=self._keepalive_timeout_s,
        )
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        # Our own listener, not a TCPSite: every connection goes through the guard first.
        self._listener = await asyncio.get_running_loop().create_server(
            self.guard.wrap(server), self.host or None, self.port, backlog=self._backlog, reuse_address=True,
        )
        self.port = self._listener.sockets[0].getsockname()[1]
        self._watcher = asyncio.create_task(self._watch())
        return self.url

    async def stop(self, grace_s: float = 10.0) -> None:
        """Close every session and the listener, then close each env exactly once; no env call
        delays this: a call still in flight is abandoned at once (its session is closed, so its
        reply could go nowhere) and its env closed. ``grace_s`` bounds the env closes (one still
        hung after it is left to its thread); a client bounds nothing (``close_timeout_s``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace_s
        self._stopping = True
        if self._watcher is not None:
            self._watcher.cancel()
        if self._listener is not None:
            self._listener.close()  # no new connections while the sessions end
        await asyncio.gather(
            *(self._end(s, WSCloseCode.GOING_AWAY, "the server is stopping") for s in list(self._sessions))
        )
        unwinding = {s.handler for s in self._sessions if not s.busy}
        for task in self._handlers - unwinding:  # in an env call, or building its env
            task.cancel()
        if self._handlers:
            _, late = await asyncio.wait(self._handlers, timeout=self._close_timeout_s)
            for task in late:  # a close handshake that hangs
                task.cancel()
        if self._closing:
            await asyncio.wait(self._closing, timeout=max(0.01, deadline - loop.time()))
        self.guard.abort_all()  # keep-alive and half-sent connections
        if self._runner is not None:
            await self._runner.cleanup()
        self._threads.shutdown()

    # -- HTTP routes ---------------------------------------------------------------------------

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self._token}".encode()):
            return web.json_response(
                {"error": "missing or wrong bearer token: send 'Authorization: Bearer <token>'."},
                status=401,
            )
        return await handler(request)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    async def _schema(self, request: web.Request) -> web.Response:
        info = await self._described()
        return web.json_response(info.get("native_schema") or schema())

    async def _described(self) -> dict[str, Any]:
        """What ``_describe`` found; when no session has built an env yet, one is built for it."""
        info = self._env_info
        if info is None:
            if self._describing is None:  # one build, however many clients ask at once
                self._describing = self._spawn(self._describe_a_new_env())  # stop() waits for it
            info = await asyncio.shield(self._describing)
        return info

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

    async def _describe_a_new_env(self) -> dict[str, Any]:
        try:
            env = await self._build_env()
            info = self._describe(env)
            await self._close_env(env)
            return info
        except Exception as exc:
            return {"description": "", "factory_error": f"{type(exc).__name__}: {exc}"}
        finally:
            self._describing = None  # after a failed build, the next request tries again

    def _describe(self, env: Any) -> dict[str, Any]:
        """What clients need to treat the env as a local one (``describe_env``), plus a summary."""
        doc = inspect.getdoc(type(env)) or ""
        described = describe_env(env)
        try:
            json.dumps(described["tools"])
        except (TypeError, ValueError):
            log.warning("env.tools is not JSON; /metadata leaves it out")
            described["tools"] = None
        self._env_info = {"description": doc.splitlines()[0] if doc else "", **described}
        if hosts_natively(env):
            self._env_info["native_schema"] = native_schema(env)
        return self._env_info

    # -- WebSocket sessions --------------------------------------------------------------------

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(
            timeout=2.0,  # for the peer's close reply; a silent peer must not hold the slot long
            autoping=False,  # pings and pongs are ours: aiohttp's heartbeat costs ~10% per frame
            max_msg_size=self._max_message_bytes,
            compress=False,
        )
        if self._stopping or self._active >= self.max_concurrent_envs:
            await ws.prepare(request)
            why = (
                "the server is stopping"
                if self._stopping
                else f"server at capacity: {self._active} of {self.max_concurrent_envs} sessions in "
                "use; retry later or start the server with a larger --max-concurrent-envs."
            )
            await self._hang_up(ws, request.transport, WSCloseCode.OK, error_frame(
                ErrorCode.CAPACITY_REACHED,
                why,
                active_sessions=self._active,
                max_sessions=self.max_concurrent_envs,
            ))
            return ws
        self._active += 1  # the slot is held from here until the env is closed
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        session: _Session | None = None
        try:
            await ws.prepare(request)
            try:
                env = await self._build_env()
            except Exception as exc:
                log.exception("env factory failed")
                await self._hang_up(ws, request.transport, WSCloseCode.INTERNAL_ERROR, error_frame(
                    ErrorCode.FACTORY_ERROR, f"the env factory failed: {type(exc).__name__}: {exc}",
                    factory_name=self.name,
                ))
                return ws
            if self._env_info is None:
                self._describe(env)
            session = _Session(ws, request.transport, env, self.caller)
            self._sessions.add(session)
            if self._stopping:  # stop() began while the env was being built
                await self._end(session, WSCloseCode.GOING_AWAY, "the server is stopping")
            else:
                await self._serve(session)
        finally:
            self._handlers.discard(task)
            if session is None:
                self._active -= 1
            else:
                self._sessions.discard(session)
                closing = asyncio.ensure_future(self._close_env(session.env, release=True))
                self._closing.add(closing)
                closing.add_done_callback(self._closing.discard)
                try:
                    await asyncio.shield(closing)
                except asyncio.CancelledError:
                    pass  # the close task carries on and releases the slot
                if not ws.closed:
                    await self._hang_up(ws, session.transport, WSCloseCode.OK)
        return ws

    async def _serve(self, session: _Session) -> None:
        ws = session.ws
        while True:
            msg = await ws.receive()
            kind = msg.type
            if kind is not WSMsgType.TEXT and kind is not WSMsgType.BINARY:
                if kind is WSMsgType.PONG:
                    session.last_seen = time.monotonic()
                    continue
                if kind is WSMsgType.PING:
                    session.last_seen = time.monotonic()
                    await ws.pong(msg.data)
                    continue
                return  # close, error, or the socket went away
            session.busy = True
            try:
                reply = await self._reply(session, msg.data)
            finally:
                session.busy = False
                session.last_active = session.last_seen = time.monotonic()
            if reply is None:
                await self._hang_up(ws, session.transport, WSCloseCode.OK)
                return
            session.sending = True  # the watcher aborts a send the peer does not take in time
            try:
                if not await _send_quietly(ws, reply):
                    return
            finally:
                session.sending = False

    async def _reply(self, session: _Session, raw: str | bytes) -> bytes | None:
        if session.native is not None:
            return await session.native.reply(raw)
        try:
            frame = parse_client_frame(raw)
            client = session.client
            if type(frame) is StepFrame:
                result = await client.astep(frame.data.message)
                session.steps += 1
                return observation_frame(*result)
            if type(frame) is ResetFrame:
                data = frame.data
                text, info = await client.areset(data.seed, row_index=data.row_index, evaluation=data.evaluation)
                session.steps = 0
                session.episode_id = uuid.uuid4().hex
                return observation_frame(text, 0.0, False, False, info)
            if type(frame) is StateFrame:
                state = await client.astate()
                return state_frame({"episode_id": session.episode_id, "step_count": session.steps, **state})
            return None  # close
        except FrameError as exc:
            return error_frame(exc.code, str(exc), **exc.extra)
        except Exception as exc:
            return error_frame(ErrorCode.EXECUTION_ERROR, f"{type(exc).__name__}: {exc}")

    async def _build_env(self) -> Any:
        """A fresh env from the factory, built on a worker thread. If the caller is cancelled
        first (``stop()``'s grace ran out), the env is closed once it exists: none is left open."""
        claim = _Claim()
        try:
            return await self.caller.in_thread(self._build_in_thread, claim)
        except asyncio.CancelledError:
            orphan = claim.abandon()
            if orphan is not None:  # built, but its delivery was cancelled
                self._threads.submit(lambda: self._close_in_thread(orphan))
            raise

    def _build_in_thread(self, claim: _Claim) -> Any:
        env = self._factory()
        with self._counts:
            self.envs_created += 1
        if not claim.deliver(env):
            self._close_in_thread(env)
        return env

    async def _close_env(self, env: Any, *, release: bool = False) -> None:
        try:
            await self.caller.in_thread(self._close_in_thread, env)
        finally:
            if release:
                self._active -= 1

    def _close_in_thread(self, env: Any) -> None:
        """Close an env; its failure is logged, never raised (the session is over either way)."""
        try:
            close_env(env)
        except Exception:
            log.exception("env.close() failed")
        finally:
            with self._counts:
                self.envs_closed += 1

    async def _end(self, session: _Session, code: int, why: str) -> None:
        """End a session from the server side: tell the client why, then close the socket (or
        abort it, when the peer is not taking what was already sent)."""
        if session.ending:
            return
        session.ending = True
        if session.sending:  # stuck behind a reply the peer does not read: nothing polite gets through
            if session.transport is not None:
                session.transport.abort()
            return
        frame = error_frame(ErrorCode.SESSION_ERROR, f"session ended: {why}")
        await self._hang_up(session.ws, session.transport, code, frame, why)

    async def _hang_up(
        self, ws: web.WebSocketResponse, transport: Any, code: int, frame: bytes | None = None, why: str = ""
    ) -> None:
        """Send ``frame`` (if any) and close ``ws`` politely within ``close_timeout_s``; past it,
        abort the connection: aiohttp waits for the peer to drain with no deadline of its own,
        and a closed asyncio transport still waits to flush its buffer."""
        try:
            await asyncio.wait_for(_close_politely(ws, code, frame, why), self._close_timeout_s)
        except (asyncio.TimeoutError, ConnectionError, RuntimeError):
            if transport is not None:
                transport.abort()

    async def _watch(self) -> None:
        """End idle sessions and those whose peer does not take a reply within ``send_timeout_s``;
        ping quiet ones and drop those whose pong never comes (half-open)."""
        timeout, heartbeat, send_timeout = self.session_timeout_s, self._heartbeat_s, self._send_timeout_s
        tick = min(t for t in (1.0, timeout and timeout / 4, heartbeat and heartbeat / 4, send_timeout / 4) if t)
        while True:
            await asyncio.sleep(tick)
            now = time.monotonic()
            for s in list(self._sessions):
                if s.busy or s.ending or s.ws.closed:
                    continue  # a busy session is in an env call, not reading; its silence means nothing
                if s.sending and now - s.last_active > send_timeout:
                    self._spawn(self._end(s, WSCloseCode.GOING_AWAY, "the client took no reply"))
                elif timeout and now - s.last_active > timeout:
                    self._spawn(self._end(s, WSCloseCode.OK, f"idle for more than {timeout:g} s"))
                elif heartbeat and now - s.last_seen > heartbeat:
                    if s.ping_sent is None or s.ping_sent < s.last_seen:
                        s.ping_sent = now
                        self._spawn(_ping_quietly(s.ws))
                    elif now - s.ping_sent > heartbeat / 2:
                        self._spawn(self._end(s, WSCloseCode.GOING_AWAY, "no pong to a heartbeat ping"))

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(coro)
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        return task


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


async def _ping_quietly(ws: web.WebSocketResponse) -> None:
    try:
        await ws.ping()
    except (ConnectionError, RuntimeError):
        pass  # the session is ending anyway


async def _close_politely(ws: web.WebSocketResponse, code: int, frame: bytes | None, why: str) -> None:
    if frame is not None:
        await _send_quietly(ws, frame)
    await ws.close(code=code, message=why[:120].encode())


async def _send_quietly(ws: web.WebSocketResponse, frame: bytes) -> bool:
    """Send one text frame; False when the peer is gone (that ends the session, not the server)."""
    if ws.closed:
        return False
    try:
        await ws.send_frame(frame, WSMsgType.TEXT)
        return True
    except (ConnectionError, RuntimeError):
        return False


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
