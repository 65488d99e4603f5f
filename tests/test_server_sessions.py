"""The env server's sessions for text envs: one thread per session, OpenEnv's HTTP routes and
``mcp`` frame, the auth edge, a port in use, and envs freed once closed (issues 19, 20)."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, ClassVar

import pytest

from agilerl.remote.hosting import resolve_env
from tests.test_remote_server import assert_all_closed_once, fresh_env_class, raw_exchange, wait_until


class DiaryEnv:
    """Keeps its words in an sqlite connection made in ``__init__``: usable only on that thread."""

    closed: ClassVar[list[str]] = []

    def __init__(self) -> None:
        self.db = sqlite3.connect(":memory:")
        self.db.execute("create table words (word text)")

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.db.execute("delete from words")
        return "write", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.db.execute("insert into words values (?)", (action,))
        said = " ".join(w for (w,) in self.db.execute("select word from words"))
        return said, 1.0, False, False, {"thread": threading.current_thread().name}

    def close(self) -> None:
        self.db.close()  # raises ProgrammingError on any other thread
        type(self).closed.append(threading.current_thread().name)


def test_a_thread_bound_env_runs_every_call_of_a_session_on_one_thread() -> None:
    DiaryEnv.closed = []
    url, server = resolve_env(DiaryEnv)
    frames = ['{"type": "reset"}', *(json.dumps({"type": "step", "data": {"message": w}}) for w in "abc")]

    async def sessions() -> list[Any]:
        return await asyncio.gather(*(raw_exchange(url, frames, path="/ws?metadata=1") for _ in range(3)))

    with server:
        for replies, _ in asyncio.run(sessions()):
            steps = [r["data"]["observation"] for r in replies[1:]]
            assert [s["text"] for s in steps] == ["a", "a b", "a b c"]  # no sqlite thread error
            assert len({s["metadata"]["thread"] for s in steps}) == 1
        wait_until(lambda: len(DiaryEnv.closed) == 3)
    assert server.server.envs_created == server.server.envs_closed == 3


def _http(url: str, body: Any = None, method: str | None = None) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.load(reply)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def test_http_routes_and_the_mcp_frame_answer_as_openenv_does() -> None:
    env_cls = fresh_env_class()
    url, server = resolve_env(env_cls)
    with server:
        assert _http(url + "/reset", {"seed": 3}) == (
            200, {"observation": {"text": "start 3", "truncated": False}, "reward": 0.0, "done": False}
        )
        assert _http(url + "/step", {"action": {"message": "hi"}}) == (
            200, {"observation": {"text": "HI", "truncated": False}, "reward": 0.5, "done": False}
        )
        status, bad = _http(url + "/step", {"action": {"message": ["no"]}})
        assert status == 422 and bad["detail"][0]["loc"][-2:] == ["data", "message"]
        assert _http(url + "/step", {"nothing": 1})[0] == 422
        status, state = _http(url + "/state")
        assert status == 200 and state["step_count"] == 0
        status, listed = _http(url + "/mcp", {"jsonrpc": "2.0", "method": "tools/list", "id": 4})
        assert (status, listed["id"], listed["error"]["code"]) == (200, 4, -32603)  # no MCP in a text env
        assert _http(url + "/mcp", b"{nope")[1]["error"]["code"] == -32700
        replies, _ = asyncio.run(raw_exchange(url, [
            json.dumps({"type": "mcp", "data": {"jsonrpc": "2.0", "method": "tools/list", "id": 1}}),
            json.dumps({"type": "mcp", "data": {"method": "tools/list"}}),
        ]))
        assert replies[0]["type"] == "mcp" and replies[0]["data"]["error"]["code"] == -32603
        assert replies[1]["data"]["error"]["code"] == -32600  # not JSON-RPC 2.0
        # every HTTP call built a fresh env and closed it (the describe build included)
        assert_all_closed_once(server, env_cls)
        assert server.server.envs_created == server.server.envs_closed


BAD_CREDENTIALS = [
    "Bearer t\u00f6ken".encode(),  # UTF-8, not ASCII
    b"Bearer \xff\xfe\x80",  # not UTF-8 at all
    b"Bearer",
    b"Basic c2VjcmV0",
    b"Bearer secret extra",
    b"bearer secret",
    b"Bearer " + b"s" * 20000,
    b"",
]


@pytest.mark.parametrize("credential", BAD_CREDENTIALS, ids=range(len(BAD_CREDENTIALS)))
def test_any_malformed_credential_gets_401_and_no_traceback(credential: bytes, caplog: pytest.LogCaptureFixture) -> None:
    url, server = resolve_env(fresh_env_class(), token="secret")
    host, port = url.split("//")[1].split(":")
    with server, caplog.at_level(logging.WARNING):
        for path in (b"/health", b"/ws", b"/reset"):
            with socket.create_connection((host, int(port)), timeout=10) as conn:
                conn.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: " + credential + b"\r\n"
                             b"Connection: close\r\n\r\n")
                head = conn.recv(64)
            # past aiohttp's 8190-byte header cap the request itself is refused (400), else 401
            assert head.startswith(b"HTTP/1.0 400" if len(credential) > 8190 else b"HTTP/1.1 401"), head
    assert [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info] == []


def test_a_port_in_use_exits_2_and_names_the_fix() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "agilerl", "serve", "guess", "--port", str(port)],
                              capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "another process is using that port; pick another with --port" in done.stderr
    assert "Traceback" not in done.stderr


class KeptEnv:
    """Each instance is tracked by a weak reference; its steps allocate a little."""

    alive: ClassVar[list[weakref.ref[KeptEnv]]] = []

    def __init__(self) -> None:
        self.blobs: list[bytearray] = []
        type(self).alive.append(weakref.ref(self))

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return "go", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.blobs.append(bytearray(1024))
        return action, 0.0, False, False, {}


def test_a_closed_sessions_env_is_freed() -> None:
    KeptEnv.alive = []
    url, server = resolve_env(KeptEnv)
    frames = ['{"type": "reset"}', '{"type": "step", "data": {"message": "x"}}']
    with server:
        for _ in range(3):
            asyncio.run(raw_exchange(url, frames))
        wait_until(lambda: server.server.envs_closed == server.server.envs_created == 3)

        def all_gone() -> bool:
            gc.collect()
            return all(ref() is None for ref in KeptEnv.alive)

        wait_until(all_gone, 10)  # not held by an idle worker thread, a session, a reply or a future


LEAKY = textwrap.dedent('''
    class Leaky:
        """Keeps 10 MB per step until it is closed."""

        def __init__(self):
            self.blobs = []

        def reset(self, seed=None):
            return "go", {}

        def step(self, action):
            self.blobs.append(bytearray(10 * 1024 * 1024))
            return "ok", 0.0, False, False, {}
''')


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads RSS from /proc")
def test_memory_stays_flat_over_many_leaky_sessions(tmp_path: Path) -> None:
    (tmp_path / "leaky.py").write_text(LEAKY)
    proc = subprocess.Popen([sys.executable, "-m", "agilerl", "serve", f"{tmp_path / 'leaky.py'}:Leaky", "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = next(line for line in proc.stdout if line.startswith("serving ")).split(" at ")[1].split()[0]
        frames = ['{"type": "reset"}', *['{"type": "step", "data": {"message": "x"}}'] * 3]

        async def batch() -> None:  # 8 sessions at once, 30 MB each while open
            await asyncio.gather(*(raw_exchange(url, frames) for _ in range(8)))

        asyncio.run(batch())
        after_one = _rss_mb(proc.pid)
        for _ in range(5):
            asyncio.run(batch())
        # 5 more batches would hold 1.2 GB more if closed envs were kept; freed, it is reused
        deadline = time.monotonic() + 10
        while _rss_mb(proc.pid) > after_one + 80 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _rss_mb(proc.pid) <= after_one + 80, (after_one, _rss_mb(proc.pid))
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_validation_error_keeps_its_per_field_errors() -> None:
    """OpenEnv's server says only "Invalid message" beside the per-field ``errors``: a client's
    error message keeps them (issue 19.11)."""
    from agilerl.remote.frames import parse_reply

    raw = json.dumps({"type": "error", "data": {"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": [
        {"type": "missing", "loc": ["word"], "msg": "Field required"},
        {"type": "int_parsing", "loc": ["count"], "msg": "Input should be a valid integer"},
    ]}})
    assert parse_reply(raw).error == (
        "VALIDATION_ERROR", "Invalid message (word: Field required; count: Input should be a valid integer)"
    )
    ours = {"message": "invalid message: data.message: Input should be a valid string", "code": "VALIDATION_ERROR",
            "errors": [{"loc": ["step", "data", "message"], "msg": "Input should be a valid string"}]}
    assert parse_reply(json.dumps({"type": "error", "data": ours})).error == ("VALIDATION_ERROR", ours["message"])
