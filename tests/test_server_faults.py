"""Fault injection against a real env server on 127.0.0.1: clients that stop reading, env calls
that hang, half-sent requests. Each fault must cost the server nothing beyond its own session.

Every wait is bounded; the bounds are generous (a loaded CI host), far below what the faults used
to cost (a slot held forever, /health blocked for the whole env call, a 5 s late timeout).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest

from agilerl.errors import RemoteEnvTimeout
from agilerl.remote.client import RemoteEnvClient
from agilerl.remote.hosting import RunningServer, resolve_env


class HangableEnv:
    """Echoes the action; ``hang`` blocks the call until the test releases it."""

    release: ClassVar[threading.Event] = threading.Event()
    hanging: ClassVar[threading.Event] = threading.Event()  # set once a ``hang`` call has started
    closed: ClassVar[list[int]] = []

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return "start", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == "hang":
            HangableEnv.hanging.set()
            HangableEnv.release.wait(30)
        return action, 0.0, False, False, {}

    def close(self) -> None:
        HangableEnv.closed.append(id(self))


class AsyncHangableEnv(HangableEnv):
    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:  # type: ignore[override]
        if action == "hang":
            HangableEnv.hanging.set()
        while action == "hang" and not HangableEnv.release.is_set():
            await asyncio.sleep(0.01)
        return action, 0.0, False, False, {}


@pytest.fixture(autouse=True)
def _fresh_env_state() -> Iterator[None]:
    HangableEnv.release, HangableEnv.hanging = threading.Event(), threading.Event()
    HangableEnv.closed = []
    yield
    HangableEnv.release.set()  # no env call outlives its test


def until(condition: Any, limit_s: float, what: str) -> None:
    """Wait (bounded) for ``condition()``."""
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {limit_s} s"
        time.sleep(0.05)


def in_thread(fn: Any, limit_s: float, what: str) -> Any:
    """``fn()`` on a thread, waited for at most ``limit_s`` (a call that hangs fails the test)."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(_outcome(fn)), daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"{what}: not within {limit_s} s"
    ok, value = out[0]
    if not ok:
        raise value
    return value


def _outcome(fn: Any) -> tuple[bool, Any]:
    try:
        return True, fn()
    except BaseException as exc:
        return False, exc


def health(url: str, limit_s: float) -> dict[str, Any]:
    return json.loads(urllib.request.urlopen(url + "/health", timeout=limit_s).read())


def ws_frame(text: str) -> bytes:
    """A masked client text frame."""
    payload, mask = text.encode(), b"\x01\x02\x03\x04"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    n = len(payload)
    if n < 126:
        header = bytes([0x81, 0x80 | n])
    elif n < 65536:
        header = bytes([0x81, 0xFE]) + n.to_bytes(2, "big")
    else:
        header = bytes([0x81, 0xFF]) + n.to_bytes(8, "big")
    return header + mask + masked


def stop_reading_client(server: RunningServer) -> socket.socket:
    """A WebSocket session that resets, then sends 60 kB steps and never reads a reply."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", server.server.port))
    sock.sendall(
        b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    head = b""
    while b"\r\n\r\n" not in head:
        head += sock.recv(1)
    sock.sendall(ws_frame(json.dumps({"type": "reset", "data": {}})))
    big = ws_frame(json.dumps({"type": "step", "data": {"message": "x" * 60_000}}))
    sock.settimeout(0.5)

    def pump() -> None:
        try:
            while True:
                sock.sendall(big)
        except OSError:
            pass  # the buffers are full, or the server hung up

    pumping = threading.Thread(target=pump, daemon=True)
    pumping.start()
    until(lambda: not pumping.is_alive(), 15, "the buffers fill both ways")  # the server is stuck sending
    return sock


# -- 1. a client that stops reading -----------------------------------------------------------


@pytest.mark.parametrize(
    "limits",
    [{"session_timeout_s": 1.0}, {"heartbeat_s": 0.5}, {"send_timeout_s": 1.0, "heartbeat_s": None}],
    ids=["idle-timeout", "heartbeat", "send-timeout"],
)
def test_a_client_that_stops_reading_frees_its_slot_and_its_env_is_closed(limits: dict[str, Any]) -> None:
    url, server = resolve_env(HangableEnv, max_concurrent_envs=1, close_timeout_s=0.5, **limits)
    with server:
        stuck = stop_reading_client(server)
        until(lambda: len(HangableEnv.closed) == 1, 15, "the stuck session's env is closed")
        with RemoteEnvClient(url, retry_budget_s=10) as client:  # the one slot is free again
            assert client.reset() == ("start", {})
        stuck.close()
    assert server.server.envs_closed == server.server.envs_created == 2


def test_stop_finishes_within_grace_with_a_client_that_stops_reading() -> None:
    _, server = resolve_env(HangableEnv, max_concurrent_envs=1, close_timeout_s=0.5)
    stuck = stop_reading_client(server)
    in_thread(lambda: server.stop(grace_s=1.0), 10, "stop() with a client that stopped reading")
    assert len(HangableEnv.closed) == 1
    stuck.close()


# -- 2. an env call that hangs ------------------------------------------------------------------


@pytest.mark.parametrize("env_cls", [HangableEnv, AsyncHangableEnv], ids=["sync", "async"])
def test_a_hung_env_call_delays_neither_health_nor_other_sessions_nor_stop(env_cls: type) -> None:
    url, server = resolve_env(env_cls, max_concurrent_envs=4)
    stuck, other = RemoteEnvClient(url), RemoteEnvClient(url)
    stuck.reset()
    for _ in range(20):  # fast calls first: no fast path may keep the next one on the event loop
        stuck.step("x")
    hung = threading.Thread(target=lambda: _outcome(lambda: stuck.step("hang")), daemon=True)
    hung.start()
    assert HangableEnv.hanging.wait(5), "the env call did not start"
    assert server.server.active_sessions == 1
    assert in_thread(lambda: health(url, 2), 2, "/health while an env call hangs") == {"status": "healthy"}
    assert in_thread(other.reset, 2, "another session's reset")[0] == "start"
    assert in_thread(lambda: other.step("y"), 2, "another session's step")[0] == "y"
    # No grace is spent waiting for the hung call: its session is closed, its reply can go nowhere.
    in_thread(lambda: server.stop(grace_s=60), 10, "stop() while an env call hangs")
    assert len(HangableEnv.closed) == 2  # the hung env too, once, though its call never returned
    HangableEnv.release.set()
    hung.join(5)


# -- 3. request_timeout_s ----------------------------------------------------------------------


def test_request_timeout_raises_at_its_bound_against_a_hung_env() -> None:
    url, server = resolve_env(HangableEnv)
    with server:
        client = RemoteEnvClient(url, request_timeout_s=0.3)
        client.reset()
        with pytest.raises(RemoteEnvTimeout, match="request_timeout_s=0.3"):
            in_thread(lambda: client.step("hang"), 0.3 + 1.0, "request_timeout_s=0.3")
        HangableEnv.release.set()
        assert client.reset() == ("start", {})  # the next episode starts on a fresh session
        client.close()


# -- 7. half-sent HTTP requests and too many connections ---------------------------------------


def test_half_sent_requests_time_out_and_connections_past_the_cap_are_refused() -> None:
    url, server = resolve_env(HangableEnv, header_timeout_s=0.5, max_connections=8)
    with server:
        socks = []
        for _ in range(12):
            sock = socket.create_connection(("127.0.0.1", server.server.port))
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # the head never ends
            socks.append(sock)
        answers = [_read_until_closed(sock, 5) for sock in socks]
        assert sum(a.startswith(b"HTTP/1.1 503 ") for a in answers) == 4, answers
        assert sum(a.startswith(b"HTTP/1.1 408 ") for a in answers) == 8, answers
        assert server.server.guard.open == set()
        assert health(url, 2) == {"status": "healthy"}  # served as before
        for sock in socks:
            sock.close()


def _read_until_closed(sock: socket.socket, limit_s: float) -> bytes:
    """Everything the server sends until it closes the connection, within ``limit_s``."""
    sock.settimeout(limit_s)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


@pytest.mark.parametrize("loop", ["asyncio", pytest.param("uvloop", marks=pytest.mark.skipif(
    importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed on this platform"))])
def test_the_connection_guard_steps_out_of_the_way_once_the_request_head_is_in(
    loop: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past the head deadline, frames go straight to aiohttp's protocol on either loop (uvloop's
    transports look ``data_received`` up once: the guard must hand itself over again)."""
    from agilerl.concurrency import LOOP_ENV_VAR
    from agilerl.remote import guard

    watched = 0
    original = guard._Guarded.data_received

    def counting(self: Any, data: bytes) -> None:
        nonlocal watched
        watched += 1
        original(self, data)

    monkeypatch.setattr(guard._Guarded, "data_received", counting)
    monkeypatch.setenv(LOOP_ENV_VAR, loop)
    url, server = resolve_env(HangableEnv)
    with server, RemoteEnvClient(url) as client:
        client.reset()
        for i in range(50):
            assert client.step(f"a{i}")[0] == f"a{i}"
    assert 1 <= watched <= 3, watched  # the upgrade request's bytes, not the 51 frames after it
