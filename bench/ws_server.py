"""WebSocket env servers under load: ours vs openenv-core's vs a bare aiohttp echo (the ceiling).

The same trivial synchronous env is served by ``agilerl serve`` (``agilerl``: its calls run on
each session's thread; the event loop is uvloop where installed, ``agilerl-asyncio`` forces
asyncio's own) and by openenv-core's ``create_app`` under uvicorn (run from ``.venv-openenv``, see
tests/test_remote_openenv.py): ``openenv-core`` on asyncio's loop, which is what its default
install runs (openenv-core does not install uvloop), and ``openenv-uvloop`` on uvloop, shown
when that venv has it (``.venv-openenv/bin/pip install uvloop``). ``agilerl-async`` serves the
same env written with ``async def`` methods (awaited on the server's event loop); the echo
server (``aiohttp-echo``, aiohttp's default: asyncio's loop, the ceiling the ratios use) answers
every frame with a canned observation and runs no env at all; ``echo-uvloop`` is the same on
uvloop, shown when installed. Each server runs in its
own process pinned to CPU 0; one load client, pinned to CPU 1, holds N sessions that step as
fast as they can. The load client speaks raw WebSocket frames over asyncio sockets, so it costs far
less per step than any server and the servers, not the client, set the pace. When allowed (root),
all processes run at nice -10 so other jobs on the machine disturb the latencies less. Prints steps/s and p99 latency per server (medians over interleaved rounds)
and the ratios against openenv-core and the echo ceiling.

The MCP case (``--cases mcp``) serves an MCP env shaped like OpenEnv's echo env (an
``MCPEnvironment`` with an ``echo_message`` tool; every step is a ``call_tool``) by ``agilerl
serve`` and by openenv-core (``openenv-mcp``; ``openenv-mcp-uv`` on uvloop), all from ``.venv-openenv``, and measures the same env stepped in
process (``await env.step_async(...)`` inside one held ``mcp_session()`` per env, N envs on one
event loop pinned to the server CPU): the env's own rate, with no server at all.

``cpu us`` is the server process's CPU time (every thread, from /proc) per step served, over the
whole load including its warm-up: unlike steps/s it barely moves with other load on the machine,
so ``x base (cpu)``, the baseline's CPU per step over each server's, is the ratio to read on a busy
host (on a quiet one the server's core is saturated and the two ratios meet). ``--before DIR`` adds
``agilerl-before``: the sync env served by the ``agilerl`` package found in DIR (another checkout,
e.g. ``git worktree add /tmp/old <commit>``), interleaved with the others, for before/after in one run.

    python bench/ws_server.py [--seconds 3] [--rounds 3] [--sessions 1,16,64,256] [--cases sync,mcp]
                              [--before DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import IO

ROOT = Path(__file__).resolve().parent.parent
OPENENV_PYTHON = ROOT / ".venv-openenv" / "bin" / "python"
_CPUS = sorted(os.sched_getaffinity(0))
# The servers share one CPU and the load client gets another (the first two this process may use:
# a container's CPU ids need not start at 0). With a single CPU nothing is pinned.
SERVER_CPU, CLIENT_CPU = (_CPUS[0], _CPUS[1]) if len(_CPUS) > 1 else (None, None)
STEP_FRAME = json.dumps({"type": "step", "data": {"message": "ping"}})
MCP_STEP_FRAME = json.dumps({"type": "step", "data": {
    "type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "ping"}}})
RESET_FRAME = json.dumps({"type": "reset", "data": {"seed": 0}})


class TrivialEnv:
    """Echoes the action; never ends."""

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        return "start", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return action, 1.0, False, False, {}


class AsyncTrivialEnv:
    """``TrivialEnv`` with ``async def`` methods."""

    async def reset(self, seed: int | None = None) -> tuple[str, dict]:
        return "start", {}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return action, 1.0, False, False, {}


OPENENV_SERVER = '''
import sys, uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

class TextAction(Action):
    message: str

class TextObservation(Observation):
    text: str = ""

class TrivialEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True
    def reset(self, seed=None, episode_id=None, **kwargs):
        return TextObservation(text="start")
    def step(self, action, timeout_s=None, **kwargs):
        return TextObservation(text=action.message, reward=1.0, done=False)
    @property
    def state(self):
        return State()

app = create_app(TrivialEnv, TextAction, TextObservation, max_concurrent_envs=int(sys.argv[2]))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", loop=sys.argv[3])
'''


MCP_ENV = '''
from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Observation, State


class EchoMcpEnv(MCPEnvironment):
    """OpenEnv's echo env, reduced: one echo_message tool."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("echo")

        @mcp.tool
        def echo_message(message: str) -> str:
            """Echo the message back."""
            return message

        super().__init__(mcp)
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(step_count=0)
        return Observation(done=False, reward=0.0)

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=False, metadata={"error": "unknown action"})

    @property
    def state(self):
        return self._state
'''

OPENENV_MCP_SERVER = '''
import sys, uvicorn
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from mcp_echo_env import EchoMcpEnv

app = create_app(EchoMcpEnv, CallToolAction, CallToolObservation, max_concurrent_envs=int(sys.argv[2]))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning", loop=sys.argv[3])
'''

IN_PROCESS_MCP = '''
import asyncio, sys, time
from openenv.core.env_server.mcp_types import CallToolAction
from mcp_echo_env import EchoMcpEnv

sessions, seconds, warmup = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
action = CallToolAction(tool_name="echo_message", arguments={"message": "ping"})

async def one(env, measure_from, stop_at):
    steps = 0
    async with env.mcp_session():
        env.reset()
        while (now := time.perf_counter()) < stop_at:
            await env.step_async(action)
            steps += now >= measure_from
    return steps

async def main():
    envs = [EchoMcpEnv() for _ in range(sessions)]
    start = time.perf_counter()
    steps = await asyncio.gather(*(one(e, start + warmup, start + warmup + seconds) for e in envs))
    print(sum(steps) / seconds)

asyncio.run(main())
'''


def echo_server(port: int, step_latency_s: float = 0.0, loop: str = "asyncio") -> None:
    """A bare aiohttp WebSocket server answering each frame with a fixed observation frame (a
    step frame after ``step_latency_s``: bench/collector.py's floor for a slow env)."""
    from aiohttp import WSMsgType, web

    reply = json.dumps({"type": "observation", "data": {
        "observation": {"text": "ping", "truncated": False, "metadata": {}}, "reward": 1.0, "done": False,
    }}, separators=(",", ":"))

    async def ws_handler(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(compress=False)
        await ws.prepare(request)
        async for msg in ws:
            if msg.type is WSMsgType.TEXT:
                if step_latency_s and json.loads(msg.data)["type"] == "step":
                    await asyncio.sleep(step_latency_s)
                await ws.send_str(reply)
        return ws

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "healthy"})

    from agilerl.concurrency import new_event_loop

    app = web.Application()
    app.router.add_get("/ws", ws_handler)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None, loop=new_event_loop(loop))


def _free_port() -> int:
    # imported here, as every agilerl import in this file: `agilerl serve` loads this file's envs,
    # and agilerl-before's older checkout may have no agilerl.ports
    from agilerl.ports import free_port

    return free_port()


def _raise_priority() -> list[str]:
    """Other jobs on a shared machine preempt the pinned processes and dominate p99: when allowed
    (root), every server and the load client run at the same raised priority."""
    try:
        os.nice(-10)
    except OSError:
        return []
    return ["nice", "-n", "-10"]


_PRIORITY: list[str] = []
_BEFORE: list[str] = []  # --before: the checkout agilerl-before imports agilerl from


def _pin() -> list[str]:
    pinned = SERVER_CPU is not None and shutil.which("taskset")
    return (["taskset", "-c", str(SERVER_CPU)] if pinned else []) + _PRIORITY


def _command(name: str, port: int, max_sessions: int, mcp_dir: Path) -> list[str]:
    serve = ["-m", "agilerl", "serve", "--port", str(port), "--max-concurrent-envs", str(max_sessions)]
    commands = {
        "agilerl": [sys.executable, *serve, f"{__file__}:TrivialEnv"],
        "agilerl-before": [sys.executable, *serve, f"{__file__}:TrivialEnv"],
        "agilerl-asyncio": [sys.executable, *serve, "--loop", "asyncio", f"{__file__}:TrivialEnv"],
        "agilerl-async": [sys.executable, *serve, f"{__file__}:AsyncTrivialEnv"],
        "openenv-core": [str(OPENENV_PYTHON), "-c", OPENENV_SERVER, str(port), str(max_sessions), "asyncio"],
        "openenv-uvloop": [str(OPENENV_PYTHON), "-c", OPENENV_SERVER, str(port), str(max_sessions), "uvloop"],
        "aiohttp-echo": [sys.executable, __file__, "--echo-server", str(port)],
        "echo-uvloop": [sys.executable, __file__, "--echo-server", str(port), "--echo-loop", "uvloop"],
        # the MCP env needs openenv-core, so both of its servers run from its venv
        "agilerl-mcp": [str(OPENENV_PYTHON), *serve, str(mcp_dir / "mcp_echo_env.py:EchoMcpEnv")],
        "openenv-mcp": [str(OPENENV_PYTHON), "-c", OPENENV_MCP_SERVER, str(port), str(max_sessions), "asyncio"],
        "openenv-mcp-uv": [str(OPENENV_PYTHON), "-c", OPENENV_MCP_SERVER, str(port), str(max_sessions), "uvloop"],
    }
    return commands[name]


PORT_TAKEN = ("another process is using that port", "address already in use")  # agilerl serve's, uvicorn's and aiohttp's words
PORT_TRIES = 3


def _start(names: tuple[str, ...], max_sessions: int, mcp_dir: Path) -> dict[str, tuple[subprocess.Popen, str]]:
    """Start every server at once (the openenv venv's imports take seconds), then wait for each.
    A port is free when picked, but another process may take it while the server imports: a server
    that exits for that reason starts again on another port (up to ``PORT_TRIES`` times)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(mcp_dir), os.environ.get("PYTHONPATH")]))}

    def launch(name: str) -> tuple[subprocess.Popen, str, IO[bytes]]:
        port = _free_port()
        log = tempfile.TemporaryFile()  # a pipe could fill up and stall the server
        own = {**env, "PYTHONPATH": os.pathsep.join([*_BEFORE, env["PYTHONPATH"]])} if name == "agilerl-before" else env
        proc = subprocess.Popen(_pin() + _command(name, port, max_sessions, mcp_dir), stdout=subprocess.DEVNULL,
                                stderr=log, env=own, cwd=mcp_dir)
        return proc, f"http://127.0.0.1:{port}", log

    started = {name: launch(name) for name in names}
    deadline = time.monotonic() + 120
    for name in names:
        tries = 1
        while True:
            proc, url, log = started[name]
            if proc.poll() is not None:
                log.seek(0)
                error = log.read().decode()[-2000:]
                if tries < PORT_TRIES and any(words in error.lower() for words in PORT_TAKEN):
                    started[name], tries = launch(name), tries + 1
                    continue
                raise RuntimeError(f"{name} server exited: {error}")
            try:
                urllib.request.urlopen(url + "/health", timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline:
                    proc.kill()
                    raise RuntimeError(f"{name} server did not come up on {url}") from None
                time.sleep(0.2)
    return {name: (proc, url) for name, (proc, url, _) in started.items()}


def _openenv_venv_has_agilerl() -> None:
    """The MCP case serves with this project from the openenv venv: install it there (editable,
    light dependencies only, as tests/test_openenv_native.py does) when it is missing."""
    probe = [str(OPENENV_PYTHON), "-c", "import agilerl, aiohttp, pluggy, importlib_metadata"]
    if subprocess.run(probe, capture_output=True, cwd="/", check=False).returncode == 0:
        return
    pip = [str(OPENENV_PYTHON), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "pluggy", "importlib-metadata", "aiohttp", "uv"], check=True)
    subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)


def _client_frame(text: str) -> bytes:
    """A masked client text frame; one fixed mask key, so every step sends the same bytes."""
    payload, mask = text.encode(), b"\x01\x02\x03\x04"
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
    n = len(payload)
    header = bytes([0x81, 0x80 | n]) if n < 126 else bytes([0x81, 0xFE]) + n.to_bytes(2, "big")
    return header + mask + masked


class _RawSession(asyncio.Protocol):
    """A minimal WebSocket client, so the load client costs far less per step than any server."""

    def __init__(self, host: str) -> None:
        self.host = host
        self.buffer = b""
        self.upgraded = False
        self.waiter: asyncio.Future[bytes] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.upgraded:
            head, sep, rest = self.buffer.partition(b"\r\n\r\n")
            if not sep:
                return
            if b" 101 " not in head.split(b"\r\n", 1)[0]:
                self._resolve(RuntimeError(head.decode(errors="replace")))
                return
            self.upgraded, self.buffer = True, rest
            self._resolve(b"")
        while len(self.buffer) >= 2:
            size, start = self.buffer[1] & 0x7F, 2
            if size == 126:
                size, start = int.from_bytes(self.buffer[2:4], "big"), 4
            elif size == 127:
                size, start = int.from_bytes(self.buffer[2:10], "big"), 10
            if len(self.buffer) < start + size:
                return
            opcode, payload = self.buffer[0] & 0x0F, self.buffer[start:start + size]
            self.buffer = self.buffer[start + size:]
            if opcode == 0x1:
                self._resolve(payload)
            elif opcode == 0x8:
                self._resolve(RuntimeError(f"server closed the session: {payload!r}"))

    def _resolve(self, value: bytes | Exception) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(value) if isinstance(value, Exception) else waiter.set_result(value)

    def request(self, data: bytes) -> asyncio.Future[bytes]:
        self.waiter = asyncio.get_running_loop().create_future()
        assert self.transport is not None
        self.transport.write(data)
        return self.waiter


async def _open(host: str, port: int) -> _RawSession:
    loop = asyncio.get_running_loop()
    _, session = await loop.create_connection(lambda: _RawSession(host), host, port)
    handshake = (
        f"GET /ws HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    await session.request(handshake.encode())
    return session


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used; NaN without /proc."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _load(
    url: str, sessions: int, seconds: float, warmup: float, step_frame: str = STEP_FRAME, pid: int | None = None
) -> tuple[float, float, float, float]:
    """N sessions stepping back to back; returns (steps/s, p50 ms, p99 ms) after the warm-up, and
    the CPU time process ``pid`` (the server) spent per step, in us, over every step sent."""
    host, port = url.removeprefix("http://").split(":")
    step, reset, close = (_client_frame(f) for f in (step_frame, RESET_FRAME, '{"type":"close"}'))
    conns = [await _open(host, int(port)) for _ in range(sessions)]
    for conn in conns:
        await conn.request(reset)
    cpu_before = math.nan if pid is None else _cpu_s(pid)
    sent = [0]  # every step, the warm-up's too: the CPU time spans them all
    latencies: list[float] = []
    start = time.perf_counter()
    measure_from, stop_at = start + warmup, start + warmup + seconds

    async def run(conn: _RawSession) -> int:
        steps, perf = 0, time.perf_counter
        while True:
            t0 = perf()
            if t0 >= stop_at and steps:  # one measured step at least, however slow the host
                return steps
            reply = await conn.request(step)
            sent[0] += 1
            if b'"observation"' not in reply[:24]:
                raise RuntimeError(f"not an observation: {reply[:200]!r}")
            if t0 >= measure_from:
                latencies.append(perf() - t0)
                steps += 1

    total = sum(await asyncio.gather(*(run(conn) for conn in conns)))
    measured_s = time.perf_counter() - measure_from
    cpu_us = math.nan if pid is None else (_cpu_s(pid) - cpu_before) / sent[0] * 1e6
    for conn in conns:
        assert conn.transport is not None
        conn.transport.write(close)
        conn.transport.close()
    latencies.sort()
    pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3
    return total / measured_s, pick(0.5), pick(0.99), cpu_us


CASES = {  # case: (its servers, the baseline the ratios are against, the step frame)
    "sync": (("openenv-core", "openenv-uvloop", "agilerl", "agilerl-asyncio", "agilerl-async", "aiohttp-echo",
              "echo-uvloop"),
             "openenv-core", STEP_FRAME),
    "mcp": (("openenv-mcp", "openenv-mcp-uv", "agilerl-mcp"), "openenv-mcp", MCP_STEP_FRAME),
}
UVLOOP_ROWS = ("openenv-uvloop", "openenv-mcp-uv")  # shown only where the openenv venv has uvloop


def _openenv_has_uvloop() -> bool:
    probe = [str(OPENENV_PYTHON), "-c", "import uvloop"]
    return subprocess.run(probe, capture_output=True, cwd="/", check=False).returncode == 0


def _in_process_mcp(sessions: int, seconds: float, warmup: float, mcp_dir: Path) -> float:
    """The MCP env's own steps/s: N envs on one event loop, pinned like a server, no server."""
    cmd = _pin() + [str(OPENENV_PYTHON), "-c", IN_PROCESS_MCP, str(sessions), str(seconds), str(warmup)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=mcp_dir, check=True,
                          env={**os.environ, "PYTHONPATH": str(mcp_dir)})
    return float(done.stdout.strip().splitlines()[-1])


def _run_case(case: str, levels: list[int], args: argparse.Namespace, mcp_dir: Path) -> None:
    servers, baseline, frame = CASES[case]
    if not _openenv_has_uvloop():
        servers = tuple(name for name in servers if name not in UVLOOP_ROWS)
    if importlib.util.find_spec("uvloop") is None:
        servers = tuple(name for name in servers if name != "echo-uvloop")
    if _BEFORE and case == "sync":
        at = servers.index("agilerl") + 1
        servers = (*servers[:at], "agilerl-before", *servers[at:])
    if case == "mcp":
        _openenv_venv_has_agilerl()
    started = _start(servers, max(levels) + 8, mcp_dir)
    runs: dict[str, dict[int, list[tuple[float, ...]]]] = {name: {n: [] for n in levels} for name in servers}
    in_process: dict[int, list[float]] = {n: [] for n in levels}
    try:  # interleaved rounds, median kept: other load on the machine hits all servers alike
        for n in levels:
            for _ in range(args.rounds):
                for name in servers:
                    proc, url = started[name]
                    runs[name][n].append(asyncio.run(_load(url, n, args.seconds, args.warmup, frame, proc.pid)))
                if case == "mcp":
                    in_process[n].append(_in_process_mcp(n, args.seconds, args.warmup, mcp_dir))
    finally:
        for proc, _ in started.values():
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
    results = {
        name: {n: tuple(statistics.median(r[i] for r in rounds) for i in range(4)) for n, rounds in by_level.items()}
        for name, by_level in runs.items()
    }
    ceiling = "aiohttp-echo" if case == "sync" else "in-process"
    print(f"\n{case} case: ratios against {baseline} and {ceiling}, medians of {args.rounds} rounds")
    print(f"{'sessions':>8} {'server':>15} {'steps/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'x ' + baseline:>14} {'base p99 / p99':>15} {'of ' + ceiling:>16} {'cpu us':>7} {'x base (cpu)':>13}")
    for n in levels:
        base_rate, _, base_p99, base_cpu = results[baseline][n]
        top = results["aiohttp-echo"][n][0] if case == "sync" else statistics.median(in_process[n])
        for name in servers:
            rate, p50, p99, cpu = results[name][n]
            print(f"{n:>8} {name:>15} {rate:>9.0f} {p50:>7.2f} {p99:>7.2f} "
                  f"{rate / base_rate:>14.2f} {base_p99 / p99:>15.2f} {rate / top:>15.0%} {cpu:>7.1f} {base_cpu / cpu:>13.2f}")
        if case == "mcp":
            print(f"{n:>8} {'in-process':>15} {top:>9.0f} {'':>7} {'':>7} {top / base_rate:>14.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--warmup", type=float, default=0.5)
    parser.add_argument("--sessions", default="1,16,64,256")
    parser.add_argument("--cases", default="sync,mcp", help="sync (text envs), mcp (an OpenEnv MCP env).")
    parser.add_argument("--rounds", type=int, default=3, help="Runs per level; medians are shown.")
    parser.add_argument("--before", metavar="DIR", help="Add agilerl-before: the sync env served by the agilerl in DIR.")
    parser.add_argument("--echo-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--echo-step-latency-ms", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--echo-loop", default="asyncio", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.echo_server:
        echo_server(args.echo_server, args.echo_step_latency_ms / 1000, args.echo_loop)
        return
    if not OPENENV_PYTHON.exists():
        sys.exit(f"{OPENENV_PYTHON} is missing: create it with `python -m venv .venv-openenv && "
                 ".venv-openenv/bin/pip install openenv-core==0.3.0` (the interop tests do this).")
    if CLIENT_CPU is not None:
        os.sched_setaffinity(0, {CLIENT_CPU})
    _PRIORITY[:] = _raise_priority()
    if args.before:
        if not (Path(args.before) / "agilerl" / "__init__.py").is_file():
            sys.exit(f"--before {args.before}: no agilerl package there (give a checkout's root folder)")
        _BEFORE[:] = [str(Path(args.before).resolve())]
    levels = [int(n) for n in args.sessions.split(",")]
    with tempfile.TemporaryDirectory() as mcp_dir:
        (Path(mcp_dir) / "mcp_echo_env.py").write_text(MCP_ENV)
        for case in args.cases.split(","):
            _run_case(case, levels, args, Path(mcp_dir))


if __name__ == "__main__":
    main()
