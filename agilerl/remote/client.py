"""A text env that lives on a remote OpenEnv-protocol server (ours, or anyone's): the policy.

This module decides what to send and what to do when it fails: which replica a session starts
on, retrying a full or unreachable server with backoff, reading observations as text. The
WebSocket itself and the process-wide session pool are the transport, in
``agilerl.remote.connection``. Every client shares one background event loop (``shared_loop()``)
and one ``aiohttp.ClientSession``, so hundreds of sessions cost one thread. The synchronous
methods block on that loop; the ``a``-prefixed coroutines can be awaited from any event loop
(they hop onto the shared one). Frames are built and read in ``agilerl.remote.frames``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import random
import time
from collections.abc import Coroutine, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from agilerl.concurrency import shared_loop
from agilerl.envs.client import EnvClient
from agilerl.errors import (
    EnvProtocolError,
    EnvUnavailable,
    InvalidArgument,
    RemoteEnvError,
    RemoteEnvTimeout,
    ReplyTooLarge,
    redact,
)
from agilerl.peers import read_capped
from agilerl.protocol import EnvInfo, StepResult, valid_text
from agilerl.remote.action_schema import ActionFields
from agilerl.remote.frames import (
    LIST_TOOLS_FRAME,
    STATE_FRAME,
    call_tool_frame,
    ErrorCode,
    Reply,
    decode_peer,
    parse_reply,
    peer_text,
    read_observation,
    reset_frame,
    step_frame,
)
from agilerl.remote.connection import (
    DEFAULT_CLIENT_HEARTBEAT_S,
    DEFAULT_MAX_REPLY_BYTES,
    Connection,
    ConnectionLost,
    client_session,
    token_refused,
)
from agilerl.remote.limits import TOKEN_ENV_VAR, clean_token
from agilerl.remote.observations import ObservationProcessor, make_observation_reader

__all__ = ["RemoteEnvClient", "ReplicaPicker"]

log = logging.getLogger(__name__)
T = TypeVar("T")

_RETRIED_AT_RESET = frozenset({ErrorCode.CAPACITY_REACHED.value, ErrorCode.SESSION_ERROR.value})
_SERVER_CLOSES_AFTER = _RETRIED_AT_RESET | {ErrorCode.FACTORY_ERROR.value}
_next_replica = itertools.count()
MAX_METADATA_BYTES = 4 * 1024 * 1024
"""The most of a ``/metadata`` body a client reads (ours are a few kB): no server can take the
trainer's memory with it."""


class ReplicaPicker(Protocol):
    """Which replica a session starts on (a ``Fleet``: the one with the most free capacity).
    Each ``pick`` is answered exactly once: ``released`` when its session ends, ``failed`` when
    it could not connect or was cut (the picker checks that replica)."""

    def pick(self) -> str: ...

    def released(self, url: str) -> None: ...

    def failed(self, url: str) -> None: ...


class RemoteEnvClient(EnvClient):
    """The text-env interface (``reset``/``step``/``state``/``close``) over a WebSocket.

    ``url`` may be a list of replica URLs: sessions start on different replicas and move on
    when one is full or down. ``request_timeout_s`` bounds each message (0 disables);
    ``heartbeat_s`` pings a server silent that long and drops the session when the pong is not
    back within half of it (a peer gone without closing its socket; None or 0 disables);
    connection failures and ``CAPACITY_REACHED`` at reset, and an unreachable ``/metadata``, are
    retried with jittered backoff for up to ``retry_budget_s`` (the outage a run rides out), then
    ``EnvUnavailable``. Replies are held to the protocol's rules (``EnvProtocolError`` names the
    server and the field), and what a server says is shown bounded and escaped.
    ``max_message_bytes`` bounds a frame from the server, so no env's answer can take the
    trainer's memory.
    """

    blocking = False  # its calls wait on the network: many share one event loop
    reconnects = True  # a failed session is dropped; the next reset opens a fresh one

    def __init__(
        self,
        url: str | Sequence[str],
        *,
        action_field: str = "message",
        observation_field: str | None = None,
        observation_processor: str | ObservationProcessor | None = None,
        image_field: str | None = None,
        mcp_tool: str | None = None,
        request_timeout_s: float = 300,
        heartbeat_s: float | None = DEFAULT_CLIENT_HEARTBEAT_S,
        connect_timeout_s: float = 10,
        retry_budget_s: float = 120,
        max_message_bytes: int = DEFAULT_MAX_REPLY_BYTES,
        token: str | None = None,
        base_dir: str | Path | None = None,
        picker: ReplicaPicker | None = None,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise InvalidArgument("RemoteEnvClient needs at least one URL (env_url is empty).")
        self._urls = [_http_base(u) for u in urls]
        self._first = next(_next_replica)  # spreads sessions across replicas
        self._picker = picker  # given: it chooses each session's replica (round robin without)
        self._picked: str | None = None  # the picked URL this client's session holds
        self.action_field = action_field
        self.mcp_tool = mcp_tool
        self.serves_mcp = False
        """Whether the server answered MCP ``tools/list`` (``list_tools``): its env is an MCP env."""
        self.request_timeout_s = request_timeout_s or None
        if heartbeat_s is not None and not 0 <= heartbeat_s < float("inf"):
            raise InvalidArgument(f"heartbeat_s must be a finite number of seconds (0 or None: off), not {heartbeat_s}")
        self.heartbeat_s = heartbeat_s or None
        self.connect_timeout_s = connect_timeout_s
        self.retry_budget_s = retry_budget_s
        self.max_message_bytes = max_message_bytes
        self._read = make_observation_reader(
            observation_field, observation_processor, base_dir=base_dir, image_field=image_field
        )
        token = clean_token(token, "token=") if token else clean_token(
            os.environ.get(TOKEN_ENV_VAR) or None, f"${TOKEN_ENV_VAR}"
        )
        self._headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._loop = shared_loop()
        self._conn: Connection | None = None
        self._info: EnvInfo | None = None
        self._fields: ActionFields | None = None  # how a text fills the server's Action (its /schema)
        self._fields_read = False
        self.url: str | None = None
        """The replica this client's session is on (None before the first reset)."""

    # -- the text-env interface (synchronous) --------------------------------------------------

    def reset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode (connecting, or reconnecting, as needed)."""
        return self._loop.run(self._reset(seed, row_index, evaluation))

    def step(self, action: str) -> StepResult:
        return self._loop.run(self._step(action))

    def state(self) -> dict[str, Any]:
        """The server's ``state`` reply (``episode_id``, ``step_count``, the env's own state)."""
        return self._loop.run(self._state())

    def close(self) -> None:
        """End the session; the server closes its env. Safe to call more than once."""
        self._loop.run(self._close())

    def server_metadata(self) -> dict[str, Any]:
        """``GET /metadata``; with replicas, ``max_concurrent_envs`` is their sum."""
        return self._loop.run(self._metadata())

    def describe(self) -> EnvInfo:
        """What the server publishes about its env at ``/metadata``, parsed once by the rules a
        local env's members are read by (None where it does not say, as OpenEnv servers do not)."""
        if self._info is None:
            metadata = self.server_metadata()
            name = metadata.get("name")
            self._info = EnvInfo.parse(metadata, name=peer_text(name, 80) if isinstance(name, str) else self._urls[0])
        return self._info

    # -- the same, as coroutines (await them from any event loop) ------------------------------

    async def areset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        return await self._hop(self._reset(seed, row_index, evaluation))

    async def astep(self, action: str) -> StepResult:
        return await self._hop(self._step(action))

    async def astate(self) -> dict[str, Any]:
        return await self._hop(self._state())

    def call_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        """One parsed tool call, sent as OpenEnv's MCP ``call_tool`` step (``tool_parser``)."""
        return self._loop.run(self._call_tool(name, arguments))

    async def acall_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        return await self._hop(self._call_tool(name, arguments))

    def list_tools(self) -> list[dict[str, Any]] | None:
        """The session's MCP ``tools/list`` (call after ``reset``); a server whose env has no MCP
        tools answers with an error, and then the tools its ``/metadata`` declares are used."""
        return self._loop.run(self._list_tools())

    async def alist_tools(self) -> list[dict[str, Any]] | None:
        return await self._hop(self._list_tools())

    async def aclose(self) -> None:
        await self._hop(self._close())

    async def aserver_metadata(self) -> dict[str, Any]:
        return await self._hop(self._metadata())

    def __enter__(self) -> RemoteEnvClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _hop(self, coro: Coroutine[Any, Any, T]) -> Coroutine[Any, Any, T]:
        return self._loop.run_async(coro)

    # -- on the shared loop --------------------------------------------------------------------

    async def _reset(
        self, seed: int | None, row_index: int | None, evaluation: bool | None
    ) -> tuple[str, dict[str, Any]]:
        frame = reset_frame(seed, row_index, evaluation)
        backoff = _Backoff(self.retry_budget_s)
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    await self._connect(self._next_url(backoff.attempts))
                reply = await self._request(frame, "reset", "observation")
                break
            except (ConnectionLost, RemoteEnvError) as exc:
                if isinstance(exc, RemoteEnvError) and exc.code not in _RETRIED_AT_RESET:
                    raise
                await self._drop(failed=isinstance(exc, ConnectionLost))
                if not await backoff.wait():
                    raise self._unavailable("start an episode", backoff, exc) from exc
        text, _, _, _, info = self._observation(reply, "reset")
        return text, info

    async def _step(self, action: str) -> StepResult:
        if self._conn is None or self._conn.closed:
            raise RemoteEnvError("step() before reset(), or after the session ended: call reset() first.")
        if not self._fields_read and not self.mcp_tool:
            self._fields, self._fields_read = await self._action_fields(), True
        try:
            reply = await self._request(
                step_frame(action, self.action_field, self.mcp_tool, self._fields), "step", "observation"
            )
        except ConnectionLost as exc:
            await self._drop(failed=True)
            raise RemoteEnvError(
                f"the session on {self.url} ended mid-episode ({exc}); this episode is over, "
                "the next reset() reconnects."
            ) from exc
        return self._observation(reply, "step")

    async def _call_tool(self, name: str, arguments: dict[str, Any]) -> StepResult:
        if self._conn is None or self._conn.closed:
            raise RemoteEnvError("call_tool() before reset(), or after the session ended: call reset() first.")
        try:
            reply = await self._request(call_tool_frame(name, arguments), f"call_tool {name!r}")
        except ConnectionLost as exc:
            await self._drop()
            raise RemoteEnvError(f"the session on {self.url} ended mid-episode ({exc}); this episode is over.") from exc
        return self._observation(reply, f"call_tool {name!r}")

    async def _list_tools(self) -> list[dict[str, Any]] | None:
        if self._conn is None or self._conn.closed:
            raise RemoteEnvError("list_tools() before reset(): there is no session yet.")
        try:
            reply = await self._request(LIST_TOOLS_FRAME, "tools/list")
        except ConnectionLost as exc:
            await self._drop()
            raise RemoteEnvError(f"the session on {self.url} ended: {exc}") from exc
        except RemoteEnvError as exc:
            if exc.code != ErrorCode.UNKNOWN_TYPE.value:  # a server without the mcp frame: no MCP
                raise
            return self.describe().tools
        tools = (reply.get("result") or {}).get("tools") if isinstance(reply, dict) else None
        if isinstance(tools, list):
            self.serves_mcp = True
            return [t for t in tools if isinstance(t, dict)]
        return self.describe().tools

    async def _state(self) -> dict[str, Any]:
        if self._conn is None or self._conn.closed:
            raise RemoteEnvError("state() before reset(): there is no session yet.")
        try:
            reply = await self._request(STATE_FRAME, "state")
        except ConnectionLost as exc:
            await self._drop()
            raise RemoteEnvError(f"the session on {self.url} ended: {exc}") from exc
        return reply if isinstance(reply, dict) else {}

    async def _close(self) -> None:
        conn, self._conn = self._conn, None
        self._release(failed=False)
        if conn is not None:
            await conn.close(polite=True)

    def _next_url(self, attempt: int) -> str:
        """The replica a new session starts on: the picker's choice (held until released), else
        the next in turn."""
        if self._picker is None:
            return self._urls[(self._first + attempt) % len(self._urls)]
        self._release(failed=False)
        self._picked = self._picker.pick()
        return _http_base(self._picked)

    def _release(self, *, failed: bool) -> None:
        """Answer the picker for the session this client held (once)."""
        picked, self._picked = self._picked, None
        if picked is not None and self._picker is not None:
            (self._picker.failed if failed else self._picker.released)(picked)

    async def _connect(self, url: str) -> None:
        self._conn = await Connection.open(
            url, self._headers, self.connect_timeout_s, self.max_message_bytes, self.heartbeat_s
        )
        self.url = url

    async def _request(self, frame: bytes, what: str, expect: str | None = None) -> Any:
        """Send ``frame``; the reply's ``data``, or ``RemoteEnvError`` for an error frame
        (``EnvProtocolError`` for a frame of another type than ``expect``)."""
        assert self._conn is not None
        try:
            raw = await self._conn.request(frame, self.request_timeout_s)
        except asyncio.CancelledError:  # its reply would answer the next request: hang up at once
            conn, self._conn = self._conn, None
            conn.abort()
            self._release(failed=False)
            raise
        except asyncio.TimeoutError:
            await self._drop(failed=True)
            raise RemoteEnvTimeout(
                f"{self.url} sent no reply to {what} within request_timeout_s="
                f"{self.request_timeout_s:g} s; the session was dropped and this episode is over."
            ) from None
        reply: Reply = parse_reply(raw)
        if reply.type is None:
            raise RemoteEnvError(f"{self.url} sent a frame that is not a JSON object: {peer_text(reply.data, 200)}")
        error = reply.error
        if error is not None:
            code, message = error
            if code in _SERVER_CLOSES_AFTER:
                await self._drop()
            raise RemoteEnvError(f"{self.url} answered {what} with {code}: {message}", code)
        if expect is not None and reply.type != expect:
            raise EnvProtocolError(
                f"{self.url} answered {what} with a {peer_text(reply.type, 40)!r} frame where the "
                f"OpenEnv protocol has {expect!r}; this episode is lost"
            )
        return reply.data

    def _observation(self, data: Any, what: str) -> StepResult:
        """An observation reply as a step result, its text read by this client's rules; its
        values held to the protocol's rules, as a local env's are."""
        try:
            observation = read_observation(data)
        except EnvProtocolError as exc:  # names the field; this names the server
            raise EnvProtocolError(
                f"{self.url} answered {what} with a reply that breaks the OpenEnv protocol: {exc} "
                "(the server's env, or the server, is at fault; this episode is lost)"
            ) from None
        return valid_text(self._read(observation.observation)), *observation[1:]

    async def _drop(self, *, failed: bool = False) -> None:
        """End the session without its closing handshake; ``failed``: the replica is suspect."""
        conn, self._conn = self._conn, None
        self._release(failed=failed)
        if conn is not None:
            await conn.close(polite=False)

    async def _metadata(self) -> dict[str, Any]:
        """Every replica's ``/metadata``; while none answers (down, restarting: an outage), tried
        again with backoff within ``retry_budget_s``, as a reset is."""
        backoff = _Backoff(self.retry_budget_s)
        while True:
            found: list[dict[str, Any]] = []
            errors: list[str] = []
            for url in self._urls:
                try:
                    found.append(await self._metadata_of(url))
                except ConnectionLost as exc:
                    errors.append(str(exc))
            if found:
                break
            if not await backoff.wait():
                raise self._unavailable("read GET /metadata", backoff, "; ".join(errors))
        if len(self._urls) == 1:
            return found[0]
        total = sum(n for m in found if isinstance(n := m.get("max_concurrent_envs"), int))
        return {**found[0], "max_concurrent_envs": total, "replicas": found, "unreachable": errors}

    async def _metadata_of(self, url: str) -> dict[str, Any]:
        """One server's ``/metadata`` ({} when it has none), read at most ``MAX_METADATA_BYTES``;
        ``ConnectionLost`` when it cannot be reached (retried), ``RemoteEnvError`` otherwise."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.request_timeout_s, sock_connect=self.connect_timeout_s)
        try:
            async with client_session().get(url + "/metadata", headers=self._headers, timeout=timeout) as resp:
                if resp.status in (404, 405):  # a server without /metadata describes nothing
                    return {}
                if resp.status in (401, 403):
                    raise token_refused(url, resp.status, sent=bool(self._headers))
                if resp.status >= 500 or resp.status == 429:  # restarting, or a proxy before it
                    raise ConnectionLost(f"{url}: GET /metadata answered HTTP {resp.status}")
                if resp.status >= 400:
                    raise RemoteEnvError(f"{url} answered GET /metadata with HTTP {resp.status}: "
                                         f"{peer_text((await resp.content.read(4096)).decode('utf-8', 'replace'))}")
                body = await _read_at_most(resp, MAX_METADATA_BYTES, f"{url}/metadata")
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            raise ConnectionLost(f"{url}: {peer_text(str(exc) or type(exc).__name__)}") from None
        try:
            metadata = decode_peer(body)
        except ValueError as exc:
            raise RemoteEnvError(f"{url}/metadata is not JSON: {peer_text(str(exc))}") from None
        if not isinstance(metadata, dict):
            raise RemoteEnvError(f"{url}/metadata is not a JSON object: {peer_text(body[:80].decode('utf-8', 'replace'))}")
        return metadata

    async def _action_fields(self) -> ActionFields | None:
        """How a text fills the Action of the server this session is on, from its ``GET /schema``
        (remote/action_schema.py); None (the text goes in ``action_field`` as it is) when the
        server publishes no usable schema."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.connect_timeout_s)  # a server slow to say loses nothing but this
        try:
            async with client_session().get(f"{self.url}/schema", headers=self._headers, timeout=timeout) as resp:
                if resp.status != 200:
                    return None
                schemas = decode_peer(await _read_at_most(resp, MAX_METADATA_BYTES, f"{self.url}/schema"))
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, RemoteEnvError, ValueError) as exc:
            log.debug("no Action schema from %s/schema (%s): the text goes as it is", redact(self.url), exc)
            return None
        action = schemas.get("action") if isinstance(schemas, dict) else None
        return ActionFields(action, self.action_field) if isinstance(action, dict) else None

    def _unavailable(self, what: str, backoff: _Backoff, last: object) -> EnvUnavailable:
        return EnvUnavailable(
            f"could not {what} on {', '.join(self._urls)} within retry_budget_s="
            f"{self.retry_budget_s:g} s ({backoff.attempts} attempts); last error: {last}. Check that "
            "the env server is running and reachable (agilerl serve ENTRYPOINT --port PORT); a run "
            "waits this long (environment.reconnect_timeout_s) before it stops.",
            getattr(last, "code", None),
        )


class _Backoff:
    """Full-jitter exponential backoff within a budget of seconds: ``await wait()`` sleeps before
    the next attempt, or returns False when that attempt would start past the budget."""

    def __init__(self, budget_s: float) -> None:
        self.deadline = time.monotonic() + budget_s
        self.attempts = 0

    async def wait(self) -> bool:
        delay = random.uniform(0, min(2.0, 0.05 * 2**self.attempts))
        self.attempts += 1
        if time.monotonic() + delay > self.deadline:
            return False
        await asyncio.sleep(delay)
        return True


async def _read_at_most(resp: Any, limit: int, what: str) -> bytes:
    """A response body, refused (``RemoteEnvError``) past ``limit`` bytes without reading the rest."""
    try:
        return await read_capped(resp, limit, url=what, setting="MAX_METADATA_BYTES")
    except ReplyTooLarge as exc:
        raise RemoteEnvError(f"{what} is over the {limit}-byte bound: not read ({exc})") from None


def _http_base(url: str) -> str:
    """``ws://h:p/ws``, ``http://h:p/`` and ``h:p`` all name the server ``http://h:p``."""
    url = url.strip().rstrip("/")
    url = url.removesuffix("/ws")
    for ws_scheme, http_scheme in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws_scheme):
            return http_scheme + url[len(ws_scheme):]
    return url if "://" in url else "http://" + url
