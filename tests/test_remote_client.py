"""The remote client: observation reading, foreign reply shapes, MCP steps, retries, replicas."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from agilerl.remote.client import RemoteEnvClient
from agilerl.concurrency import shared_loop
from agilerl.remote.observations import default_text, make_observation_reader, text_from_field
from agilerl.remote.hosting import resolve_env
from agilerl.errors import AgileRLError, ObservationError, RemoteEnvError
from agilerl.ports import free_port
from tests.health import start_server
from tests.loopback import LoopbackServer
from tests.test_remote_server import (
    assert_all_closed_once,
    fresh_env_class,
    wait_for_health,
)

Reply = Callable[[dict[str, Any]], dict[str, Any]]


@pytest.fixture
def foreign_server() -> Iterator[Callable[[Reply], tuple[str, list[dict[str, Any]]]]]:
    """A hand-written OpenEnv-style server: ``reply(frame) -> data`` shapes each observation."""
    servers: list[LoopbackServer] = []

    def start(reply: Reply) -> tuple[str, list[dict[str, Any]]]:
        received: list[dict[str, Any]] = []

        async def ws_handler(request: web.Request) -> web.WebSocketResponse:
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            async for msg in ws:
                if msg.type is not WSMsgType.TEXT:
                    break
                frame = json.loads(msg.data)
                received.append(frame)
                if frame["type"] == "close":
                    break
                await ws.send_str(json.dumps({"type": "observation", "data": reply(frame)}))
            return ws

        app = web.Application()
        app.router.add_get("/ws", ws_handler)
        servers.append(LoopbackServer(app, "foreign-server"))
        return servers[-1].url.replace("http://", "ws://") + "/ws", received

    yield start
    for server in servers:
        server.stop()


@pytest.mark.parametrize(
    "data",
    [
        {"observation": {"text": "hi", "metadata": {"k": 1}}, "reward": 2, "done": False},
        {"observation": {"text": "hi"}, "metadata": {"k": 1}, "reward": 2, "done": False},
    ],
    ids=["metadata-nested", "metadata-top-level"],
)
def test_metadata_is_read_wherever_it_sits(foreign_server: Any, data: dict[str, Any]) -> None:
    url, _ = foreign_server(lambda frame: data)
    with RemoteEnvClient(url) as client:
        assert client.reset() == ("hi", {"k": 1})
        assert client.step("x") == ("hi", 2.0, False, False, {"k": 1})


def test_absent_metadata_reward_and_truncation(foreign_server: Any) -> None:
    url, _ = foreign_server(lambda frame: {"observation": {"stdout": "42\n"}, "done": True})
    with RemoteEnvClient(url) as client:
        assert client.step.__self__ is client
        client.reset()
        assert client.step("print(42)") == ("42\n", 0.0, True, False, {})


def test_truncated_rides_in_the_observation(foreign_server: Any) -> None:
    url, _ = foreign_server(lambda frame: {"observation": {"text": "t", "truncated": True}, "done": True})
    with RemoteEnvClient(url) as client:
        client.reset()
        assert client.step("x")[2:4] == (False, True)


def test_action_field_names_the_step_field(foreign_server: Any) -> None:
    url, received = foreign_server(lambda frame: {"observation": {"text": "ok"}})
    with RemoteEnvClient(url, action_field="code") as client:
        client.reset(seed=3, row_index=2)
        client.step("print(1)")
    assert received[0] == {"type": "reset", "data": {"seed": 3, "row_index": 2}}
    assert received[1] == {"type": "step", "data": {"code": "print(1)"}}
    assert received[2] == {"type": "close"}


def test_mcp_tool_steps_call_the_tool_and_read_its_text(foreign_server: Any) -> None:
    def reply(frame: dict[str, Any]) -> dict[str, Any]:
        if frame["type"] == "reset":
            return {"observation": {}, "done": False}
        code = frame["data"]["arguments"]["code"]
        result = {"content": [{"type": "text", "text": f"ran {code}"}], "is_error": False}
        return {"observation": {"tool_name": "run", "result": result}, "reward": 1.0, "done": False}

    url, received = foreign_server(reply)
    with RemoteEnvClient(url, mcp_tool="run", action_field="code") as client:
        assert client.reset() == ("", {})  # an empty observation reads as ""
        assert client.step("1+1")[0] == "ran 1+1"
    assert received[1]["data"] == {"type": "call_tool", "tool_name": "run", "arguments": {"code": "1+1"}}


def test_observation_field_and_processors(foreign_server: Any, tmp_path: Any) -> None:
    observation = {"board": {"rows": ["x..", ".o."]}, "legal": [1, 2], "turn": "x"}
    url, _ = foreign_server(lambda frame: {"observation": observation})
    (tmp_path / "procs.py").write_text("def board(obs):\n    return '\\n'.join(obs['board']['rows'])\n")
    readers = {
        "board.rows.1": {"observation_field": "board.rows.1"},
        "x..\n.o.": {"observation_processor": "procs.py:board", "base_dir": tmp_path},
        '{"board":{"rows":["x..",".o."]},"legal":[1,2],"turn":"x"}': {"observation_processor": "json"},
    }
    for expected, options in readers.items():
        with RemoteEnvClient(url, **options) as client:
            text = client.reset()[0]
            assert text == (".o." if expected == "board.rows.1" else expected)
    with RemoteEnvClient(url) as client:  # no field is obviously the text: all of them, compactly
        assert client.reset()[0] == 'board: {"rows":["x..",".o."]}\nlegal: [1,2]\nturn: x'


def test_default_rules_and_their_errors() -> None:
    assert default_text({"prompt": "p", "text": "t"}) == "t"
    assert default_text({"echoed_message": "e", "length": 1}) == "e"
    assert default_text({"metadata": {"a": 1}, "done": False}) == ""
    assert default_text({"tool_name": "t", "result": None, "error": {"message": "bad args"}}) == "Error: bad args"
    assert default_text({"a": "1", "b": "2", "c": None}) == "a: 1\nb: 2"  # never one field hiding the rest
    with pytest.raises(ObservationError, match="no 'c' in the observation"):
        text_from_field({"a": {"b": 1}}, "a.c")
    assert text_from_field({"a": {"b": [1, {"c": 2}]}}, "a.b") == '[1,{"c":2}]'


def test_code_output_processor_reads_an_execution_result() -> None:
    read = make_observation_reader(observation_processor="code_output")
    assert read({"stdout": "4\n", "stderr": "", "exit_code": 0, "metadata": {}}) == "stdout:\n4\nexit code: 0"
    failed = {"stdout": "", "stderr": "Traceback ...\nNameError: x\n", "exit_code": 1}
    assert read(failed) == "stderr:\nTraceback ...\nNameError: x\nexit code: 1"
    assert read({"stdout": None}) == "(no output)"


def test_bad_processors_are_reported(foreign_server: Any) -> None:
    url, _ = foreign_server(lambda frame: {"observation": {"text": "t"}})
    with pytest.raises(AgileRLError, match="no processor"):
        RemoteEnvClient(url, observation_processor="no-such-processor")
    with RemoteEnvClient(url, observation_processor=lambda obs: 3) as client:  # type: ignore[arg-type, return-value]
        with pytest.raises(ObservationError, match="returned int; it must return str"):
            client.reset()


def test_connection_errors_at_reset_are_retried_until_the_server_is_up() -> None:
    env_cls = fresh_env_class()
    pool = ThreadPoolExecutor(1)
    with _hanging_up_listener() as (port, attempts):  # the port answers, but no server is up yet
        client = RemoteEnvClient(f"http://127.0.0.1:{port}", retry_budget_s=20)
        pending = pool.submit(client.reset, 4)
        deadline = time.monotonic() + 10
        while len(attempts) < 2:  # failed once, and tried again
            assert time.monotonic() < deadline and not pending.done(), pending
            time.sleep(0.01)
    assert not pending.done()
    _, server = resolve_env(env_cls, port=port)
    with server:
        assert pending.result(timeout=20)[0] == "start 4"
        client.close()
        assert_all_closed_once(server, env_cls, built=1)
    pool.shutdown()


@contextmanager
def _hanging_up_listener() -> Iterator[tuple[int, list[float]]]:
    """A port that accepts connections and closes them at once, noting each; freed on exit."""
    attempts: list[float] = []
    done = threading.Event()
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.02)

    def hang_up() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            attempts.append(time.monotonic())
            conn.close()

    thread = threading.Thread(target=hang_up, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], attempts
    finally:
        done.set()
        thread.join(5)
        listener.close()


def test_unreachable_server_fails_with_a_clear_error() -> None:
    port = free_port()  # nothing listens there
    with pytest.raises(RemoteEnvError, match=r"could not start an episode .* within retry_budget_s=0.3"):
        RemoteEnvClient(f"127.0.0.1:{port}", retry_budget_s=0.3).reset()
    # /metadata rides out an outage within the same budget (issue 34.7), then names the URL
    with pytest.raises(RemoteEnvError, match=rf"GET /metadata on http://127.0.0.1:{port} within retry_budget_s=0.3.*Check that the env server"):
        RemoteEnvClient(f"127.0.0.1:{port}", retry_budget_s=0.3).describe()


def test_replicas_spread_sessions_and_skip_full_or_dead_ones() -> None:
    env_a, env_b = fresh_env_class(), fresh_env_class()
    url_a, server_a = resolve_env(env_a, max_concurrent_envs=2)
    url_b, server_b = resolve_env(env_b, max_concurrent_envs=2)
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with server_a, server_b:
        clients = [RemoteEnvClient([dead, url_a, url_b], retry_budget_s=10) for _ in range(4)]
        for client in clients:
            client.reset()
        assert (server_a.active_sessions, server_b.active_sessions) == (2, 2)
        assert {c.url for c in clients} == {url_a, url_b}
        with pytest.raises(RemoteEnvError, match="CAPACITY_REACHED"):
            RemoteEnvClient([url_a, url_b], retry_budget_s=0.3).reset()
        metadata = clients[0].server_metadata()
        assert metadata["max_concurrent_envs"] == 4 and len(metadata["replicas"]) == 2
        for client in clients:
            client.close()
        assert_all_closed_once(server_a, env_a, built=2)
        assert_all_closed_once(server_b, env_b, built=2)


def client_threads() -> set[str]:
    """The threads not the in-process server's (its env workers and its one thread per session)."""
    server_side = ("agilerl-env", "agilerl-session")
    return {t.name for t in threading.enumerate() if not t.name.startswith(server_side)}


def test_async_api_from_another_event_loop_and_sync_api_inside_the_loop_is_refused() -> None:
    env_cls = fresh_env_class()
    url, server = resolve_env(env_cls, {"max_turns": 100})

    async def many_sessions() -> list[str]:
        clients = [RemoteEnvClient(url) for _ in range(50)]
        await asyncio.gather(*(c.areset(seed=i) for i, c in enumerate(clients)))
        steps = await asyncio.gather(*(c.astep(f"s{i}") for i, c in enumerate(clients)))
        state = await clients[0].astate()
        await asyncio.gather(*(c.aclose() for c in clients))
        return [s[0] for s in steps] + [str(state["step_count"])]

    async def sync_inside_loop() -> None:
        RemoteEnvClient(url).reset()

    with server:
        threads_before = client_threads()
        assert asyncio.run(many_sessions()) == [f"S{i}" for i in range(50)] + ["1"]
        assert len(client_threads() - threads_before) <= 1  # the shared loop, not one per session
        with pytest.raises(AgileRLError, match="await the async method"):
            shared_loop().run(sync_inside_loop())
        assert_all_closed_once(server, env_cls, built=50)


def test_the_docs_example_runs(capsys: pytest.CaptureFixture[str]) -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "remote-envs.md").read_text()
    (example,) = re.findall(r"```python\n(.*?)```", doc, re.S)
    exec(compile(example, "docs/remote-envs.md", "exec"), {})
    assert capsys.readouterr().out.splitlines() == ["('Say something.', {})", "('HI', 1.0, True, False, {})"]


def test_a_harness_built_from_a_url_plays_the_remote_env(chatml_tokenizer: Any) -> None:
    from agilerl.rollout.harness import RolloutHarness

    env_cls = fresh_env_class()
    url, server = resolve_env(env_cls)
    with server:
        harness = RolloutHarness(url, chatml_tokenizer, max_turns=2)
        assert isinstance(harness.client, RemoteEnvClient)
        harness.reset(seed=4)
        _, reward, terminated, truncated, info = harness.step("go")
        assert (reward, terminated, truncated, info["turn"]) == (0.5, False, False, 1)
        assert "start 4" in chatml_tokenizer.decode(harness.trajectory.token_ids)
        assert "GO" in chatml_tokenizer.decode(harness.trajectory.token_ids)
        harness.close()
        assert_all_closed_once(server, env_cls, built=2)  # one to describe itself, one for the session


def test_a_crashed_server_ends_the_episode_and_the_next_reset_reconnects(tmp_path: Any) -> None:
    """kill -9 of the server process mid-episode: the step fails clearly; once a server is back on
    the same address, the same client's next reset starts a new session."""
    import signal
    import subprocess
    import sys

    serve = [sys.executable, "-m", "agilerl", "serve", "tests.test_remote_server:CountedEnv"]
    root = Path(__file__).resolve().parent.parent  # where `tests.` imports
    url_file = tmp_path / "serve.url"
    first, url = start_server([*serve, "--port", "0", "--port-file", str(url_file)], url_file, tmp_path / "serve.log", cwd=root)

    def start() -> subprocess.Popen[bytes]:  # again, on the same address
        proc = subprocess.Popen([*serve, "--port", url.rsplit(":", 1)[1]], cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_health(url, proc)
        return proc

    client = RemoteEnvClient(url, retry_budget_s=30)
    try:
        assert client.reset(seed=1)[0] == "start 1"
        assert client.step("go")[0] == "GO"
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        with pytest.raises(RemoteEnvError, match=r"ended mid-episode .*the next reset\(\) reconnects"):
            client.step("go")
        second = start()
        try:
            assert client.reset(seed=2)[0] == "start 2"
            assert client.step("go") == ("GO", 0.5, False, False, {"turn": 1})  # a fresh env
        finally:
            client.close()
            second.terminate()
            second.wait(20)
    finally:
        if first.poll() is None:
            first.kill()
