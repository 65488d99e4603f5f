"""The remote-env server: the protocol, its HTTP routes, and every way a session can end.

Each fault test asserts the two invariants: the session count returns to zero and every env
the factory built was closed exactly once.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar

import aiohttp
import pytest

from agilerl.remote.client import RemoteEnvClient
from agilerl.remote.hosting import resolve_env
from agilerl.errors import AgileRLError, RemoteEnvError, RemoteEnvTimeout
from tests.health import wait_healthy


class CountedEnv:
    """Counts steps; truncates at max_turns; records each close."""

    instances: ClassVar[list[CountedEnv]] = []

    def __init__(self, max_turns: int = 3, step_sleep_s: float = 0.0, fail_on: str | None = None) -> None:
        self.max_turns, self.step_sleep_s, self.fail_on = max_turns, step_sleep_s, fail_on
        self.turn = 0
        self.closes = 0
        self.reset_kwargs: dict[str, Any] = {}
        type(self).instances.append(self)

    def reset(self, seed: int | None = None, **kwargs: Any) -> tuple[str, dict[str, Any]]:
        self.turn, self.reset_kwargs = 0, {"seed": seed, **kwargs}
        return f"start {seed}", {"seed": seed}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action == self.fail_on:
            raise ValueError(f"cannot play {action!r}")
        if self.step_sleep_s:
            time.sleep(self.step_sleep_s)
        self.turn += 1
        return action.upper(), 0.5, action == "win", self.turn >= self.max_turns, {"turn": self.turn}

    def state(self) -> dict[str, Any]:
        return {"turn": self.turn}

    def close(self) -> None:
        self.closes += 1


def fresh_env_class() -> type[CountedEnv]:
    """A subclass with its own instance list, so tests never see each other's envs."""
    return type("CountedEnv", (CountedEnv,), {"instances": [], "__doc__": "A counting env."})


def wait_until(predicate: Any, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        time.sleep(0.02)


def wait_for_health(url: str, proc: subprocess.Popen[Any], log: Path | None = None) -> None:
    """Return once a server process answers ``GET /health``; fail if it exits or stays silent
    for 60 s (with the tail of its ``log``)."""
    try:
        wait_healthy(url, 60, alive=lambda: proc.poll() is None, poll_s=0.1)
    except AssertionError as exc:
        tail = log.read_text()[-3000:] if log is not None else ""
        raise AssertionError(f"{exc}\n{tail}") from None


def assert_all_closed_once(server: Any, env_cls: type[CountedEnv], built: int | None = None) -> None:
    wait_until(lambda: server.active_sessions == 0)
    closes = [env.closes for env in env_cls.instances]
    assert closes == [1] * len(closes)
    if built is not None:
        assert len(closes) == built


async def raw_exchange(url: str, frames: list[str], path: str = "/ws", **ws_options: Any) -> tuple[list[Any], Any]:
    """Send frames one by one over a bare socket; return the replies and the close code
    (None when the server left the socket open)."""
    replies: list[Any] = []
    async with aiohttp.ClientSession() as http:
        async with http.ws_connect(url + path, **ws_options) as ws:
            for frame in frames:
                await ws.send_str(frame)
                msg = await ws.receive(timeout=10)
                replies.append(json.loads(msg.data) if msg.type is aiohttp.WSMsgType.TEXT else msg.type)
            if not ws.closed:
                try:
                    await ws.receive(timeout=0.5)
                except asyncio.TimeoutError:
                    pass
            return replies, ws.close_code


@pytest.fixture
def env_cls() -> type[CountedEnv]:
    return fresh_env_class()


def test_an_episode_over_the_wire(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls, {"max_turns": 2})
    with server:
        client = RemoteEnvClient(url)
        assert client.reset(seed=7) == ("start 7", {"seed": 7})
        assert client.step("go") == ("GO", 0.5, False, False, {"turn": 1})
        assert client.step("go") == ("GO", 0.5, False, True, {"turn": 2})  # truncated, not terminated
        state = client.state()
        assert state["step_count"] == 2 and state["turn"] == 2 and state["episode_id"]
        client.reset(seed=8)
        assert client.step("win")[2:4] == (True, False)
        client.close()
        client.close()  # idempotent
        assert_all_closed_once(server, env_cls, built=1)


def test_reset_passes_row_index_and_evaluation_through(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls)
    with server, RemoteEnvClient(url) as client:
        client.reset(seed=1, row_index=4, evaluation=True)
        assert env_cls.instances[0].reset_kwargs == {"seed": 1, "row_index": 4, "evaluation": True}
        client.reset(seed=2)  # plain envs get only the seed
        assert env_cls.instances[0].reset_kwargs == {"seed": 2}


def test_health_metadata_and_schema(env_cls: type[CountedEnv]) -> None:
    env_cls.dataset_size = 12  # type: ignore[attr-defined]
    url, server = resolve_env(env_cls, max_concurrent_envs=5)
    with server, RemoteEnvClient(url) as client:
        get = lambda path: json.loads(urllib.request.urlopen(url + path, timeout=5).read())
        assert get("/health") == {"status": "healthy"}
        client.reset()
        meta = get("/metadata")
        assert (meta["dataset_size"], meta["active_sessions"], meta["max_concurrent_envs"]) == (12, 1, 5)
        assert meta["description"] == "A counting env."
        assert client.server_metadata()["max_concurrent_envs"] == 5
        schema = get("/schema")
        assert schema["action"]["properties"]["message"]["type"] == "string"
        assert set(schema["observation"]["properties"]) == {"text", "images", "truncated", "metadata"}


class ToolQuizEnv:
    """A quiz with a calculator tool."""

    max_turns = 4
    max_reward = 2.0
    dataset_size = 30
    eval_dataset_size = 5
    system_prompt = "Answer with a number."
    tools = [{"type": "function", "function": {"name": "add", "description": "Add two numbers",
                                               "parameters": {"type": "object", "properties": {}}}}]

    def reset(self, seed=None, row_index=None, evaluation=None):
        return f"What is {row_index} + 1?", {}

    def step(self, action):
        return "Checked.", 1.0, True, False, {}


def test_metadata_describes_the_env_so_a_remote_harness_renders_like_a_local_one(chatml_tokenizer: Any) -> None:
    from agilerl.rollout.harness import RolloutHarness
    from agilerl.manifest.spec import parse_env_spec

    url, server = resolve_env(ToolQuizEnv)
    with server, RemoteEnvClient(url) as client:
        meta = client.server_metadata()
        assert meta["tools"] == ToolQuizEnv.tools and meta["system_prompt"] == "Answer with a number."
        info = client.describe()
        assert (info.max_turns, info.dataset_size, info.eval_dataset_size, info.max_reward) == (4, 30, 5, 2.0)
        remote = RolloutHarness(client, chatml_tokenizer, max_turns=4)
        local = RolloutHarness.local(ToolQuizEnv(), chatml_tokenizer)
        assert list(remote.reset(row_index=3)[0]) == list(local.reset(row_index=3)[0])
        assert "Add two numbers" in chatml_tokenizer.decode(remote.trajectory.token_ids)
        spec = parse_env_spec({"env_type": "rollout", "env_url": url})  # no max_turns: the server says
        with RolloutHarness.from_spec(spec, chatml_tokenizer) as harness:
            assert harness.max_turns == 4


class BareEnv:
    max_reward = "lots"  # not a number
    tools = [{"name": "clock", "default": object()}]  # not JSON

    @property
    def system_prompt(self) -> str:
        raise RuntimeError("a broken property")

    def reset(self, seed=None):
        return "go", {}

    def step(self, action):
        return "", 0.0, True, False, {}


def test_metadata_leaves_out_what_the_env_does_not_declare_usably(chatml_tokenizer: Any) -> None:
    from agilerl.rollout.harness import RolloutHarness
    from agilerl.manifest.spec import parse_env_spec

    url, server = resolve_env(BareEnv)
    with server, RemoteEnvClient(url) as client, pytest.warns(UserWarning) as ignored:
        meta = client.server_metadata()
        assert (meta["tools"], meta["max_reward"], meta["max_turns"], meta["system_prompt"]) == (None,) * 4
        assert client.reset()[0] == "go"  # the server is fine
        spec = parse_env_spec({"env_type": "rollout", "env_url": url})
        with pytest.raises(AgileRLError, match="BareEnv declares no usable max_turns"):
            RolloutHarness.from_spec(spec, chatml_tokenizer)
    assert {str(w.message).split(" must")[0] for w in ignored} == {"BareEnv: max_reward", "BareEnv: tools"}


def test_token_is_required_on_every_route_when_set(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls, token="s3cret")
    with server:
        for path in ("/health", "/metadata", "/schema", "/ws"):
            with pytest.raises(urllib.error.HTTPError) as exc:
                urllib.request.urlopen(url + path, timeout=5)
            assert exc.value.code == 401
        with pytest.raises(RemoteEnvError, match="token"):
            RemoteEnvClient(url, token="wrong", retry_budget_s=0.2).reset()
        with RemoteEnvClient(url, token="s3cret") as client:
            assert client.reset(seed=1)[0] == "start 1"


def test_bad_frames_get_error_frames_and_the_session_goes_on(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls)
    frames = [
        "{not json",
        '{"type": "dance"}',
        '{"data": {}}',
        '{"type": "step", "data": {"message": ["not", "text"]}}',
        '{"type": "step", "data": {"message": "before reset is fine for this env"}}',
        '{"type": "reset", "data": {"seed": 3}}',
        '{"type": "state"}',
        '{"type": "close"}',
    ]
    with server:
        replies, close_code = asyncio.run(raw_exchange(url, frames))
        codes = [r["data"].get("code") if isinstance(r, dict) else r for r in replies]
        assert codes[:4] == ["INVALID_JSON", "UNKNOWN_TYPE", "UNKNOWN_TYPE", "VALIDATION_ERROR"]
        assert replies[3]["data"]["message"].startswith("invalid message: data.message:")
        assert replies[4]["type"] == "observation"
        # a client that did not ask for info (no ?metadata=1) never sees it
        assert replies[5]["data"]["observation"] == {"text": "start 3", "truncated": False}
        assert replies[6]["type"] == "state"
        assert close_code == 1000
        assert_all_closed_once(server, env_cls, built=1)


def test_env_raising_in_step_answers_execution_error_and_keeps_the_session(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls, {"fail_on": "boom"})
    with server:
        client = RemoteEnvClient(url)
        client.reset()
        with pytest.raises(RemoteEnvError, match="cannot play 'boom'") as exc:
            client.step("boom")
        assert exc.value.code == "EXECUTION_ERROR"
        assert client.step("ok")[0] == "OK"  # same session, same env
        client.close()
        assert_all_closed_once(server, env_cls, built=1)


def test_factory_raising_answers_factory_error() -> None:
    def broken_factory() -> Any:
        raise RuntimeError("no GPU here")

    url, server = resolve_env(broken_factory)
    with server:
        with pytest.raises(RemoteEnvError, match="no GPU here") as exc:
            RemoteEnvClient(url).reset()
        assert exc.value.code == "FACTORY_ERROR"
        wait_until(lambda: server.active_sessions == 0)
        assert server.server.envs_created == server.server.envs_closed == 0


def test_many_clients_asking_a_fresh_server_for_metadata_build_one_env(env_cls: type[CountedEnv]) -> None:
    """A collector's clients all read /metadata at once; a heavy env must not be built per client."""

    class SlowToBuild(env_cls):  # type: ignore[valid-type, misc]
        def __init__(self) -> None:
            time.sleep(0.05)  # long enough for every request to arrive while the first build runs
            super().__init__()

    url, server = resolve_env(SlowToBuild)

    async def ask(times: int) -> list[dict[str, Any]]:
        async with aiohttp.ClientSession() as http:

            async def get() -> dict[str, Any]:
                async with http.get(url + "/metadata") as response:
                    return await response.json()

            return await asyncio.gather(*(get() for _ in range(times)))

    with server:
        answers = asyncio.run(ask(16))
        assert {a["max_turns"] for a in answers} == {3} and len(env_cls.instances) == 1
        asyncio.run(ask(4))  # described once: later requests build nothing
        assert len(env_cls.instances) == 1
    assert_all_closed_once(server, env_cls, built=1)


def test_a_failed_describe_is_retried_not_remembered() -> None:
    attempts = []

    def flaky_factory() -> Any:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("warming up")
        return fresh_env_class()()

    url, server = resolve_env(flaky_factory)
    with server:
        get = lambda: json.loads(urllib.request.urlopen(url + "/metadata", timeout=5).read())
        assert get()["factory_error"] == "RuntimeError: warming up"
        assert get()["max_turns"] == 3 and "factory_error" not in get()


def test_capacity_overflow_turns_away_only_the_extra_client(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls, {"max_turns": 100}, max_concurrent_envs=2)
    with server:
        first, second = RemoteEnvClient(url), RemoteEnvClient(url)
        first.reset(), second.reset()
        replies, close_code = asyncio.run(raw_exchange(url, ['{"type": "reset"}']))
        assert replies[0]["data"]["code"] == "CAPACITY_REACHED" and close_code == 1000
        with pytest.raises(RemoteEnvError, match="retry_budget_s") as exc:
            RemoteEnvClient(url, retry_budget_s=0.3).reset()
        assert exc.value.code == "CAPACITY_REACHED"
        assert first.step("a")[0] == "A" and second.step("b")[0] == "B"  # undisturbed
        first.close()
        late = RemoteEnvClient(url)  # a freed slot is usable again
        assert late.reset(seed=5)[0] == "start 5"
        second.close(), late.close()
        assert_all_closed_once(server, env_cls, built=3)


def test_capacity_reached_at_reset_is_retried_until_a_slot_frees(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls, max_concurrent_envs=1)
    with server:
        holder = RemoteEnvClient(url)
        holder.reset()
        waiter = RemoteEnvClient(url, retry_budget_s=10)
        with ThreadPoolExecutor(1) as pool:
            future = pool.submit(waiter.reset, 1)
            wait_until(lambda: server.server.sessions_turned_away >= 2, timeout=10)  # refused, retried
            assert not future.done()
            holder.close()
            assert future.result(timeout=10)[0] == "start 1"
        waiter.close()
        assert_all_closed_once(server, env_cls, built=2)


def test_idle_timeout_closes_the_socket_and_the_env(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls, session_timeout_s=0.3)
    with server:
        client = RemoteEnvClient(url)
        client.reset()
        wait_until(lambda: server.active_sessions == 0, timeout=5)
        with pytest.raises(RemoteEnvError, match="idle"):
            client.step("late")
        assert_all_closed_once(server, env_cls, built=1)
        assert client.reset(seed=2)[0] == "start 2"  # the next episode reconnects
        client.close()
        assert_all_closed_once(server, env_cls, built=2)


def test_server_stop_closes_open_sessions(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls)
    clients = [RemoteEnvClient(url) for _ in range(5)]
    for client in clients:
        client.reset()
    server.stop()
    assert_all_closed_once(server, env_cls, built=5)
    with pytest.raises(RemoteEnvError, match="ended"):
        clients[0].step("x")
    server.stop()  # idempotent


def test_an_env_still_being_built_when_stop_gives_up_is_closed_once_it_exists() -> None:
    env_cls = fresh_env_class()
    building = threading.Event()

    def slow_factory() -> CountedEnv:
        building.set()
        time.sleep(1.0)
        return env_cls()

    url, server = resolve_env(slow_factory)
    client = RemoteEnvClient(url, retry_budget_s=0, connect_timeout_s=5)
    connecting = threading.Thread(target=lambda: _quietly(client.reset), daemon=True)
    connecting.start()
    assert building.wait(10)
    server.stop(grace_s=0.1)  # gives up on the handler while the factory is still running
    wait_until(lambda: len(env_cls.instances) == 1 and env_cls.instances[0].closes == 1, timeout=10)
    time.sleep(0.2)  # a window for a second close, which must not come
    assert [env.closes for env in env_cls.instances] == [1]
    assert server.server.envs_created == server.server.envs_closed == 1
    connecting.join(10)


def _quietly(call: Any) -> None:
    try:
        call()
    except Exception:  # noqa: BLE001 - the server went away under it, as intended
        pass


def test_clients_that_vanish_mid_episode_free_their_sessions(env_cls: type[CountedEnv], tmp_path: Any) -> None:
    """500 clients in a child process reset and step, then the process dies without a close frame."""
    url, server = resolve_env(env_cls, {"max_turns": 100}, max_concurrent_envs=512)
    script = tmp_path / "vanish.py"
    script.write_text(textwrap.dedent(f"""
        import asyncio, os
        from agilerl.remote.client import RemoteEnvClient

        async def main():
            clients = [RemoteEnvClient({url!r}) for _ in range(500)]
            await asyncio.gather(*(c.areset(seed=i) for i, c in enumerate(clients)))
            replies = await asyncio.gather(*(c.astep("x") for c in clients))
            assert all(r[0] == "X" for r in replies)
            print("stepped", len(replies), flush=True)
            os._exit(0)

        asyncio.run(main())
    """))
    with server:
        done = subprocess.run([sys.executable, str(script)], check=False, capture_output=True, text=True, timeout=120)
        assert done.stdout.strip() == "stepped 500", done.stderr[-2000:]
        assert_all_closed_once(server, env_cls, built=500)


def test_request_timeout_on_a_slow_env_ends_the_episode(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls, {"step_sleep_s": 1.0})
    with server:
        client = RemoteEnvClient(url, request_timeout_s=0.2)
        client.reset()
        with pytest.raises(RemoteEnvTimeout, match="request_timeout_s=0.2"):
            client.step("slow")
        with pytest.raises(RemoteEnvError, match="reset"):
            client.step("again")  # the session is gone; only a new episode can start
        assert_all_closed_once(server, env_cls, built=1)


def test_a_slow_env_does_not_stall_other_sessions(env_cls: type[CountedEnv]) -> None:
    """16 sessions x 5 steps of a 50 ms env: once ``step`` proves slow it runs on worker threads,
    so steps of different sessions are in flight together instead of one after another."""
    lock = threading.Lock()
    in_flight, peak = [0], [0]

    class OverlapCountingEnv(env_cls):  # type: ignore[valid-type, misc]
        def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            with lock:
                in_flight[0] += 1
                peak[0] = max(peak[0], in_flight[0])
            try:
                return super().step(action)
            finally:
                with lock:
                    in_flight[0] -= 1

    url, server = resolve_env(OverlapCountingEnv, {"step_sleep_s": 0.05, "max_turns": 10})

    async def play(client: RemoteEnvClient) -> None:
        await client.areset()
        for _ in range(5):
            await client.astep("x")
        await client.aclose()

    async def play_all() -> None:
        await asyncio.gather(*(play(RemoteEnvClient(url)) for _ in range(16)))

    with server:
        asyncio.run(asyncio.wait_for(play_all(), 30))
        # Steps run inline on the event loop (or on too few threads) never overlap this much.
        assert peak[0] >= 8, f"at most {peak[0]} of 16 sessions' steps were in flight at once"
        assert_all_closed_once(server, env_cls, built=16)


def test_async_envs_are_awaited() -> None:
    class AsyncEnv:
        async def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
            await asyncio.sleep(0)
            return "async start", {}

        async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
            await asyncio.sleep(0.01)
            return action[::-1], 1.0, True, False, {}

    url, server = resolve_env(AsyncEnv)
    with server, RemoteEnvClient(url) as client:
        assert client.reset() == ("async start", {})
        assert client.step("abc") == ("cba", 1.0, True, False, {})


def test_heartbeat_closes_a_half_open_session(env_cls: type[CountedEnv]) -> None:
    """A peer that never answers pings (autoping off, never reading) is dropped."""
    url, server = resolve_env(env_cls, heartbeat_s=0.2)

    async def silent_peer() -> bool:
        async with aiohttp.ClientSession() as http:
            ws = await http.ws_connect(url + "/ws", autoping=False)
            await ws.send_str('{"type": "reset"}')
            for _ in range(150):  # the peer stays connected while the server gives up on it
                await asyncio.sleep(0.02)
                if server.active_sessions == 0 and env_cls.instances:
                    break
            dropped = server.active_sessions == 0
            await ws.close()
            return dropped

    with server:
        assert asyncio.run(silent_peer())
        assert_all_closed_once(server, env_cls, built=1)


def test_heartbeat_keeps_an_idle_client_alive(env_cls: type[CountedEnv]) -> None:
    """A client idle between steps (the model generating) answers pings and keeps its session."""
    url, server = resolve_env(env_cls, {"max_turns": 10}, heartbeat_s=0.2)
    with server, RemoteEnvClient(url) as client:
        client.reset()
        time.sleep(1.5)  # several heartbeat rounds with no request in flight
        assert server.active_sessions == 1
        assert client.step("still here")[0] == "STILL HERE"


def test_oversized_messages_end_the_session(env_cls: type[CountedEnv]) -> None:
    url, server = resolve_env(env_cls, max_message_bytes=1024)
    with server:
        big = json.dumps({"type": "step", "data": {"message": "x" * 4096}})
        replies, close_code = asyncio.run(raw_exchange(url, [big]))
        assert replies == [aiohttp.WSMsgType.CLOSE] and close_code == 1009
        assert_all_closed_once(server, env_cls, built=1)


@pytest.mark.parametrize("loop", ["asyncio", pytest.param("uvloop", marks=pytest.mark.skipif(
    importlib.util.find_spec("uvloop") is None, reason="uvloop is not installed on this platform"))])
def test_agilerl_serve_cli(tmp_path: Any, loop: str) -> None:
    env_file = tmp_path / "envs.py"
    env_file.write_text(textwrap.dedent("""
        class Shout:
            def __init__(self, suffix="!"):
                self.suffix = suffix
            def reset(self, seed=None):
                return "say something", {}
            def step(self, action):
                return action.upper() + self.suffix, 1.0, True, False, {}
            def close(self):
                print("env closed", flush=True)
    """))
    proc = subprocess.Popen(
        [sys.executable, "-m", "agilerl", "serve", f"{env_file}:Shout", "--port", "0",
         "--env-config", '{"suffix": "?"}', "--max-concurrent-envs", "3", "--header-timeout", "0.5",
         "--max-message-bytes", "2048", "--loop", loop],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        # the env built at start-up to check --env-config closes first
        assert proc.stdout.readline().strip() == "env closed"
        line = proc.stdout.readline()
        url = line.split(" at ")[1].split()[0]
        assert f"; {loop} loop)" in line
        with RemoteEnvClient(url) as client:
            client.reset()
            assert client.step("hi")[0] == "HI?"
            assert client.server_metadata()["max_concurrent_envs"] == 3
            client.reset()
            with pytest.raises(RemoteEnvError, match="1009"):  # over --max-message-bytes: the session ends
                client.step("x" * 4096)
        # --header-timeout: a connection that sends nothing is told 408 after 0.5 s, not the default 10 s
        host, port = url.split("//")[1].split(":")
        with socket.create_connection((host, int(port)), timeout=5) as silent:
            started = time.monotonic()
            assert silent.recv(64).startswith(b"HTTP/1.1 408")
            assert time.monotonic() - started < 5
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert out.splitlines() == ["env closed", "stopped"]
