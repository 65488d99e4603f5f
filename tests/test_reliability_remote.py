"""Issue 34 (round 3): what a foreign or broken server says is held to the protocol's rules and
bounded; outages at the first /metadata and silent peers are ridden out; tokens and lone
surrogates are carried the same way on both sides. Real servers on 127.0.0.1: ours
(``resolve_env``) and small hand-written aiohttp ones that answer badly."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
from aiohttp import WSMsgType, web

from agilerl.envs.client import InProcessEnvClient
from agilerl.errors import EnvProtocolError, InvalidArgument, RemoteEnvError
from agilerl.remote.client import MAX_METADATA_BYTES, RemoteEnvClient
from agilerl.remote.hosting import resolve_env
from agilerl.rollout.collector import RolloutCollector
from agilerl.generation.policy import ScriptedPolicy
from agilerl.ports import free_port
from tests.loopback import LoopbackServer

WsReply = Callable[[dict[str, Any], int], str | None]
"""``(frame, session number) -> raw text`` sent back (None: send nothing, hold the socket;
``FREEZE``: read nothing more either, pings included, as a peer whose host froze)."""

FREEZE = "<freeze>"


@pytest.fixture
def foreign() -> Iterator[Callable[..., str]]:
    """A hand-written OpenEnv-style server: ``ws(frame, session) -> raw reply text`` answers
    ``/ws``; ``routes`` adds HTTP handlers (``/metadata``). Returns its ``http://`` URL."""
    started: list[LoopbackServer] = []

    def start(ws: WsReply | None = None, routes: dict[str, Callable[[web.Request], Awaitable[Any]]] | None = None) -> str:
        sessions = iter(range(1_000_000))

        async def ws_handler(request: web.Request) -> web.WebSocketResponse:
            sock = web.WebSocketResponse()
            await sock.prepare(request)
            number = next(sessions)
            async for msg in sock:
                if msg.type is not WSMsgType.TEXT:
                    break
                frame = json.loads(msg.data)
                if frame["type"] == "close":
                    break
                raw = ws(frame, number) if ws is not None else None
                if raw is FREEZE:
                    await asyncio.Event().wait()  # the socket stays open; nothing is read or sent
                if raw is not None:
                    await sock.send_str(raw)
            return sock

        app = web.Application()
        app.router.add_get("/ws", ws_handler)
        for path, handler in (routes or {}).items():
            app.router.add_get(path, handler)
        started.append(LoopbackServer(app, "foreign-server"))
        return started[-1].url

    yield start
    for server in started:
        server.stop()


def observation(data: dict[str, Any]) -> str:
    return json.dumps({"type": "observation", "data": data})


# -- replies held to the protocol's rules ------------------------------------------------------


@pytest.mark.parametrize(
    ("step_data", "field", "said"),
    [
        ('{"observation": {"text": "t"}, "reward": NaN, "done": false}', "data.reward", "must be finite, got nan"),
        ('{"observation": {"text": "t"}, "reward": Infinity, "done": false}', "data.reward", "must be finite, got inf"),
        ('{"observation": {"text": "t"}, "reward": "nan", "done": false}', "data.reward", "must be a number"),
        ('{"observation": {"text": "t"}, "reward": 1' + "0" * 400 + ', "done": false}', "data.reward", "must be finite"),
        ('{"observation": {"text": "t"}, "reward": true, "done": false}', "data.reward", "must be a number"),
        ('{"observation": {"text": "t"}, "reward": 1, "done": "false"}', "data.done", "must be a JSON boolean, got 'false'"),
        ('{"observation": {"text": "t", "truncated": "no"}, "reward": 1, "done": false}', "data.observation.truncated", "must be a JSON boolean, got 'no'"),
        ('{"observation": {"text": "t", "reward": "1"}, "done": false}', "data.observation.reward", "must be a number"),
    ],
    ids=["nan", "infinity", "nan-string", "int-past-any-float", "bool", "done-string", "truncated-string", "nested-reward-string"],
)
def test_a_foreign_reply_that_breaks_the_protocol_is_refused_naming_server_and_field(
    foreign: Any, step_data: str, field: str, said: str
) -> None:
    def ws(frame: dict[str, Any], session: int) -> str:
        if frame["type"] == "reset":
            return observation({"observation": {"text": "start"}, "reward": None, "done": False})
        return '{"type": "observation", "data": ' + step_data + "}"

    url = foreign(ws)
    with RemoteEnvClient(url) as client:
        client.reset()
        with pytest.raises(EnvProtocolError) as caught:
            client.step("x")
        assert url in str(caught.value) and f"{field} {said}" in str(caught.value)
        # the session is still in step with the server: the next episode plays
        assert client.reset()[0] == "start"


def test_a_reply_of_the_wrong_type_is_not_read_as_an_observation(foreign: Any) -> None:
    def ws(frame: dict[str, Any], session: int) -> str:
        if frame["type"] == "reset":
            return observation({"observation": {"text": "start"}})
        return json.dumps({"type": "state", "data": {"reward": 1.0, "done": True}})

    url = foreign(ws)
    with RemoteEnvClient(url) as client:
        client.reset()
        with pytest.raises(EnvProtocolError, match=r"answered step with a 'state' frame where the OpenEnv protocol has 'observation'"):
            client.step("x")


def test_well_formed_foreign_replies_still_read_as_before(foreign: Any) -> None:
    """Ints are rewards, null rewards and absent flags are 0 / false (OpenEnv's reset sends a
    null reward), ``done`` may sit in the observation."""
    replies = iter([
        observation({"observation": {"text": "a"}, "reward": None}),
        observation({"observation": {"text": "b", "done": True}, "reward": 3}),
    ])
    url = foreign(lambda frame, session: next(replies))
    with RemoteEnvClient(url) as client:
        assert client.reset() == ("a", {})
        assert client.step("x") == ("b", 3.0, True, False, {})


def test_a_run_on_a_server_sending_nan_rewards_fails_those_episodes_never_logs_them(
    foreign: Any, chatml_tokenizer: Any
) -> None:
    """A NaN reward never reaches a trajectory: each episode that got one is lost with an error
    naming the field (a run then says why every episode failed, rather than training on null)."""

    def ws(frame: dict[str, Any], session: int) -> str:
        if frame["type"] == "reset":
            return observation({"observation": {"text": "go"}, "done": False})
        return '{"type": "observation", "data": {"observation": {"text": "t"}, "reward": NaN, "done": true}}'

    url = foreign(ws)
    with RolloutCollector(lambda: RemoteEnvClient(url), chatml_tokenizer, batch_size=1, group_size=2, max_turns=2, seed=0) as c:
        run = c._play(dict(enumerate(c.assigner.assign(1, 2))), ScriptedPolicy(chatml_tokenizer, reply="1"), c.sampling)
    assert all(t.error is not None and "data.reward must be finite" in t.error for t in run.trajectories.values())
    assert not any(f.retried for f in run.failures)  # a protocol error is the env's, as in process


# -- sizes bounded -----------------------------------------------------------------------------


def test_a_servers_error_text_is_bounded_and_its_control_bytes_escaped(foreign: Any) -> None:
    message = "\x1b[2J\x1b]0;owned\x07" + "boom " * 400_000  # 2 MB with terminal control sequences
    error = json.dumps({"type": "error", "data": {"code": "EXECUTION_ERROR", "message": message}})
    url = foreign(lambda frame, session: error if frame["type"] == "step" else observation({"observation": {"text": "a"}}))
    with RemoteEnvClient(url) as client:
        client.reset()
        with pytest.raises(RemoteEnvError) as caught:
            client.step("x")
    text = str(caught.value)
    assert caught.value.code == "EXECUTION_ERROR"
    assert len(text) < 3000 and "more characters)" in text
    assert "\x1b" not in text and "\x07" not in text and "\\x1b[2J" in text


def test_a_huge_metadata_is_refused_after_reading_its_bound(foreign: Any) -> None:
    sent = [0]

    async def metadata(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})  # chunked: no length
        await resp.prepare(request)
        chunk = b" " * (1024 * 1024)
        try:
            for _ in range(256):  # 256 MB, written as the client reads
                await resp.write(chunk)
                sent[0] += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return resp

    url = foreign(routes={"/metadata": metadata})
    with pytest.raises(RemoteEnvError, match=rf"{url}/metadata is over the {MAX_METADATA_BYTES}-byte bound"):
        RemoteEnvClient(url, retry_budget_s=0).describe()
    assert sent[0] < 64 * 1024 * 1024  # the rest was never read


def test_a_dataset_size_of_10_to_the_12_is_a_clear_error_not_a_memory_error(
    foreign: Any, chatml_tokenizer: Any
) -> None:
    async def metadata(request: web.Request) -> web.Response:
        return web.json_response({"name": "huge", "dataset_size": 10**12, "max_turns": 2})

    url = foreign(routes={"/metadata": metadata})
    with pytest.raises(InvalidArgument, match=r"dataset_size 1000000000000 is more rows than a run deals out"):
        RolloutCollector(lambda: RemoteEnvClient(url), chatml_tokenizer, batch_size=1, group_size=2, seed=0)


# -- outages: the first /metadata, and peers that go silent -----------------------------------


class TwoTurns:
    """A remote env for the outage tests."""

    max_turns = 2

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.turn = 0
        return f"seed {seed}", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.turn += 1
        return "again", 1.0, self.turn >= 2, False, {}


def test_the_first_metadata_rides_out_a_blip_at_start(chatml_tokenizer: Any) -> None:
    """No server on the port for 1.5 s, then one: building a collector (whose first act is the
    first env's ``GET /metadata``) waits for it within retry_budget_s instead of failing at once
    (issue 34.7)."""
    port = free_port()
    servers: list[Any] = []

    def later() -> None:
        threading.Event().wait(1.5)
        servers.append(resolve_env(TwoTurns, port=port)[1])

    starter = threading.Thread(target=later, daemon=True)
    starter.start()
    try:
        def factory() -> RemoteEnvClient:
            return RemoteEnvClient(f"127.0.0.1:{port}", retry_budget_s=60)

        with RolloutCollector(factory, chatml_tokenizer, batch_size=1, group_size=2, seed=0) as c:
            assert c.max_turns == 2  # read from the server's /metadata
            batch = c.collect(ScriptedPolicy(chatml_tokenizer, reply="1"))
        assert all(t.error is None for t in batch.trajectories)
    finally:
        starter.join(30)
        for server in servers:
            server.stop()


def test_a_metadata_answering_503_while_its_server_starts_is_retried_but_a_404_means_none(foreign: Any) -> None:
    calls = [0]

    async def metadata(request: web.Request) -> web.Response:
        calls[0] += 1
        if calls[0] <= 2:  # a proxy in front of a server still starting
            return web.Response(status=503, text="upstream not ready")
        return web.json_response({"name": "late", "max_turns": 4})

    url = foreign(routes={"/metadata": metadata})
    assert RemoteEnvClient(url, retry_budget_s=30).describe().max_turns == 4 and calls[0] == 3
    assert RemoteEnvClient(foreign(), retry_budget_s=30).server_metadata() == {}  # no /metadata: nothing said


def test_a_server_that_answers_pings_but_not_the_step_costs_request_timeout_and_is_replayed(
    foreign: Any, chatml_tokenizer: Any
) -> None:
    """The first session's step is never answered, though its server is alive (aiohttp answers
    the heartbeat's pings): it times out after request_timeout_s, not the heartbeat, and the
    collector replays the episode on a new session."""

    def ws(frame: dict[str, Any], session: int) -> str | None:
        if frame["type"] == "reset":
            return observation({"observation": {"text": "go"}, "done": False})
        if session == 0:
            return None  # silence
        return observation({"observation": {"text": "t"}, "reward": 1.0, "done": True})

    url = foreign(ws)
    with RolloutCollector(
        lambda: RemoteEnvClient(url, request_timeout_s=1.5, heartbeat_s=0.5, retry_budget_s=10), chatml_tokenizer,
        batch_size=1, group_size=1, max_turns=2, seed=0,
    ) as c:
        batch = c.collect(ScriptedPolicy(chatml_tokenizer, reply="1"))
    [traj] = batch.trajectories
    assert traj.error is None and traj.total_reward == 1.0
    [failure] = batch.stats.failures
    assert failure.retried and "request_timeout_s=1.5" in failure.error


def test_a_vanished_peer_is_found_by_the_heartbeat_not_request_timeout_and_replayed(
    foreign: Any, chatml_tokenizer: Any
) -> None:
    """The first session's peer stops mid-step with its socket open (no reply, no pong): the
    client's heartbeat finds it in about 1.5 x heartbeat_s, far inside request_timeout_s (300 s),
    and the episode is replayed on a new session."""

    def ws(frame: dict[str, Any], session: int) -> str | None:
        if frame["type"] == "reset":
            return observation({"observation": {"text": "go"}, "done": False})
        if session == 0:
            return FREEZE
        return observation({"observation": {"text": "t"}, "reward": 1.0, "done": True})

    url = foreign(ws)
    with RolloutCollector(
        lambda: RemoteEnvClient(url, heartbeat_s=0.5, retry_budget_s=10), chatml_tokenizer,
        batch_size=1, group_size=1, max_turns=2, seed=0,
    ) as c:
        assert c.env_timeout_s is None or c.env_timeout_s >= 60  # only the heartbeat can end it soon
        t0 = time.monotonic()
        batch = c.collect(ScriptedPolicy(chatml_tokenizer, reply="1"))
        took = time.monotonic() - t0
    [traj] = batch.trajectories
    assert traj.error is None and traj.total_reward == 1.0
    [failure] = batch.stats.failures
    assert failure.retried and "answered no heartbeat ping (heartbeat_s=0.5" in failure.error
    assert took < 15, took  # 0.75 s to find it, plus a replay; request_timeout_s is 300


class SlowStep:
    """A step three times as long as the client's heartbeat."""

    max_turns = 1

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return "go", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        time.sleep(3.0)
        return "done", 1.0, True, False, {}


def test_a_step_longer_than_the_heartbeat_on_our_server_is_not_cut() -> None:
    """Our server answers pings while an env call runs, so only a peer that is gone misses them."""
    url, server = resolve_env(SlowStep)
    with server, RemoteEnvClient(url, heartbeat_s=1.0) as client:
        client.reset()
        assert client.step("x") == ("done", 1.0, True, False, {})
        client.reset()  # the same session goes on
        assert client.state()["step_count"] == 0


def test_heartbeat_s_is_a_remote_env_setting_and_bounded() -> None:
    from agilerl.assembly.env_factory import make_env_factory
    from agilerl.errors import ConfigError
    from agilerl.manifest.spec import parse_env_spec
    from agilerl.remote.connection import DEFAULT_CLIENT_HEARTBEAT_S

    remote = {"env_type": "rollout", "env_url": "127.0.0.1:1"}
    assert parse_env_spec(remote).heartbeat_s == DEFAULT_CLIENT_HEARTBEAT_S
    assert make_env_factory(parse_env_spec({**remote, "heartbeat_s": 7}))().heartbeat_s == 7
    assert make_env_factory(parse_env_spec({**remote, "heartbeat_s": 0}))().heartbeat_s is None  # off
    for bad, said in ((-1, "Input should be greater than or equal to 0"), ("soon", "Input should be a valid number"),
                      (float("inf"), "inf is not a finite number"), (7200, "Input should be less than or equal to 3600")):
        with pytest.raises(ConfigError, match=f"environment.heartbeat_s: {said}"):
            parse_env_spec({**remote, "heartbeat_s": bad})
    with pytest.raises(ConfigError, match="'heartbeat_s' applies to a remote env"):
        parse_env_spec({"env_type": "rollout", "entrypoint": "x:y", "heartbeat_s": 5})
    with pytest.raises(InvalidArgument, match="heartbeat_s must be a finite number"):
        RemoteEnvClient("127.0.0.1:1", heartbeat_s=-1)


# -- tokens ------------------------------------------------------------------------------------


def test_a_wrong_or_missing_token_is_named_as_such_not_as_a_server_that_is_down() -> None:
    url, server = resolve_env(TwoTurns, token="right-token")
    with server:
        for client_token, said in (("wrong", "refused the token this client sent"), (None, "requires a token")):
            client = RemoteEnvClient(url, token=client_token, retry_budget_s=30)
            for call in (client.describe, client.reset):
                with pytest.raises(RemoteEnvError) as caught:
                    call()
                message = str(caught.value)
                assert said in message and "AGILERL_ENV_TOKEN" in message and "--token" in message
                assert "running" not in message


def test_a_token_with_a_trailing_newline_works_on_both_sides(monkeypatch: pytest.MonkeyPatch) -> None:
    """``$(cat token.txt)``-style values: the server's and the client's tokens are stripped
    alike, so a server started with ``tok\\n`` admits a client sending ``tok``."""
    url, server = resolve_env(TwoTurns, token="tok\n")
    with server:
        for token in ("tok", "tok\n"):
            with RemoteEnvClient(url, token=token) as client:
                assert client.reset()[0] == "seed None"
        monkeypatch.setenv("AGILERL_ENV_TOKEN", "tok\r\n")
        with RemoteEnvClient(url) as client:
            assert client.reset()[0] == "seed None"


@pytest.mark.parametrize("token", ["to\nk", "tok en", "   "])
def test_a_token_no_header_can_carry_is_refused_naming_where_it_came_from(
    token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(InvalidArgument, match="token="):
        RemoteEnvClient("127.0.0.1:1", token=token)
    monkeypatch.setenv("AGILERL_ENV_TOKEN", token)
    with pytest.raises(InvalidArgument, match=r"\$AGILERL_ENV_TOKEN"):
        RemoteEnvClient("127.0.0.1:1")
    with pytest.raises(InvalidArgument, match="token="):
        resolve_env(TwoTurns, token=token)


# -- lone surrogates ---------------------------------------------------------------------------


class Surrogates:
    """An env whose text (and, when asked, info) holds a lone surrogate."""

    max_turns = 5

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return "start \ud800", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info = {"note": "\udfff"} if action == "info" else {}
        return f"got {action} \udc80", 1.0, False, False, info


def test_lone_surrogates_are_carried_escaped_in_process() -> None:
    client = InProcessEnvClient(Surrogates())
    assert client.reset()[0] == "start \\ud800"
    assert client.step("x")[0] == "got x \\udc80"


def test_lone_surrogates_are_carried_escaped_when_served_and_the_session_goes_on() -> None:
    """The text arrives as in process; an ``info`` JSON cannot carry is that step's
    ``EXECUTION_ERROR``, and the session goes on (it used to close, and the client saw
    ConnectionError)."""
    url, server = resolve_env(Surrogates)
    with server, RemoteEnvClient(url) as client:
        assert client.reset()[0] == "start \\ud800"
        assert client.step("x")[0] == "got x \\udc80"
        with pytest.raises(RemoteEnvError) as caught:
            client.step("info")
        assert caught.value.code == "EXECUTION_ERROR" and "cannot be sent as JSON" in str(caught.value)
        assert client.step("y")[0] == "got y \\udc80"  # same session
        assert server.server.envs_created == 1


def test_a_foreign_servers_escaped_surrogate_is_read_not_refused(foreign: Any) -> None:
    """Python's json writes a lone surrogate as the escape ``\\ud800``, which pydantic-core's
    parser refuses: the client reads it, as the same escaped text."""
    async def metadata(request: web.Request) -> web.Response:
        return web.json_response({"name": "odd \ud800", "max_turns": 3})  # json.dumps: the escape

    url = foreign(
        lambda frame, session: json.dumps({"type": "observation", "data": {"observation": {"text": "a\ud800"}}}),
        routes={"/metadata": metadata},
    )
    with RemoteEnvClient(url) as client:
        assert client.reset()[0] == "a\\ud800"
        assert client.describe().max_turns == 3
