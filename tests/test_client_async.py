"""One env-client interface, two implementations: the in-process and the remote client answer
the same sync and async calls the same way, and the collector drives either through them."""

from __future__ import annotations

import asyncio
import threading
from typing import Any, ClassVar

import pytest

from agilerl.concurrency import EnvCaller, WorkerThreads
from agilerl.envs.client import EnvClient, InProcessEnvClient
from agilerl.errors import EnvProtocolError
from agilerl.remote.client import RemoteEnvClient
from agilerl.remote.frames import decode, parse_reply, read_observation, step_frame
from agilerl.remote.hosting import resolve_env
from tests.test_remote_server import wait_until
from agilerl.rollout.collector import RolloutCollector
from agilerl.generation.policy import ScriptedPolicy


class EchoEnv:
    """Upper-cases the action; the episode ends after three steps."""

    max_turns = 5
    dataset_size = 20

    def __init__(self) -> None:
        self.turn = 0
        self.closes = 0

    def reset(self, seed=None, *, row_index=None, evaluation=None):
        self.turn = 0
        return f"seed {seed} row {row_index}", {"seed": seed}

    def step(self, action):
        self.turn += 1
        return action.upper(), 0.5, self.turn >= 3, False, {"turn": self.turn}

    def state(self):
        return {"turn": self.turn}

    def close(self):
        self.closes += 1


class AsyncEchoEnv(EchoEnv):
    async def reset(self, seed=None, *, row_index=None, evaluation=None):
        await asyncio.sleep(0)
        return EchoEnv.reset(self, seed, row_index=row_index)

    async def step(self, action):
        await asyncio.sleep(0)
        return EchoEnv.step(self, action)


async def episode(client: EnvClient) -> list[Any]:
    """The same calls through the async interface, whatever the client."""
    seen: list[Any] = [await client.areset(7, row_index=2)]
    for action in ("a", "b", "c"):
        seen.append(await client.astep(action))
    state = await client.astate()
    seen.append({k: state[k] for k in ("turn",)})
    await client.aclose()
    await client.aclose()
    return seen


EXPECTED = [
    ("seed 7 row 2", {"seed": 7}),
    ("A", 0.5, False, False, {"turn": 1}),
    ("B", 0.5, False, False, {"turn": 2}),
    ("C", 0.5, True, False, {"turn": 3}),
    {"turn": 3},
]


@pytest.mark.parametrize("env_cls", [EchoEnv, AsyncEchoEnv])
def test_in_process_and_remote_clients_play_the_same_episode_through_the_async_methods(env_cls: type) -> None:
    env = env_cls()
    assert asyncio.run(episode(InProcessEnvClient(env))) == EXPECTED
    assert env.closes == 1
    url, server = resolve_env(env_cls)
    with server:
        assert asyncio.run(episode(RemoteEnvClient(url))) == EXPECTED
        # the server closes the session's env after the client's close frame: wait for it
        wait_until(lambda: server.server.envs_closed == 1)
        assert server.server.envs_created == 1


def test_the_sync_methods_answer_like_the_async_ones() -> None:
    client = InProcessEnvClient(EchoEnv())
    assert [client.reset(7, row_index=2), *(client.step(a) for a in "abc"), client.state()] == EXPECTED


def test_a_sync_call_into_an_async_env_says_which_method_to_await() -> None:
    client = InProcessEnvClient(AsyncEchoEnv())
    with pytest.raises(EnvProtocolError, match=r"AsyncEchoEnv.reset\(\) is async def: await the client's areset\(\)"):
        client.reset(0)
    assert client.blocking is False and InProcessEnvClient(EchoEnv()).blocking is True


def test_a_blocked_env_call_does_not_block_the_event_loop() -> None:
    """Without a server's caller, every async call runs on a worker thread: the env below can only
    finish once the event loop, still running, sets ``release``."""
    release = threading.Event()

    class Blocking(EchoEnv):
        def step(self, action):
            if not release.wait(10):
                raise RuntimeError("the event loop was blocked by the env call")
            return EchoEnv.step(self, action)

    async def main() -> Any:
        client = InProcessEnvClient(Blocking())
        await client.areset(0)
        stepping = asyncio.ensure_future(client.astep("x"))
        await asyncio.sleep(0)  # the step starts
        release.set()  # only reachable while the env call is still blocked
        return await stepping

    assert asyncio.run(main()) == ("X", 0.5, False, False, {"turn": 1})


class WhereEnv(EchoEnv):
    """Records the name of the thread each step ran on."""

    threads: ClassVar[list[str]] = []

    def step(self, action):
        WhereEnv.threads.append(threading.current_thread().name)
        return EchoEnv.step(self, action)


def test_a_caller_runs_sync_env_calls_on_worker_threads_never_on_the_loop() -> None:
    threads = WorkerThreads("test")
    WhereEnv.threads = []

    async def play() -> None:
        client = InProcessEnvClient(WhereEnv(), caller=EnvCaller(threads))
        await client.areset(0)
        await client.astep("x")
        await client.astep("y")

    asyncio.run(play())
    assert len(WhereEnv.threads) == 2 and all(name.startswith("test-") for name in WhereEnv.threads)
    threads.shutdown()


class CustomClient(EnvClient):
    """A third-party client implementing only the sync methods gets the async ones for free."""

    def __init__(self) -> None:
        self.env = EchoEnv()

    def reset(self, seed=None, *, row_index=None, evaluation=None):
        return self.env.reset(seed, row_index=row_index)

    def step(self, action):
        return self.env.step(action)

    def state(self):
        return self.env.state()

    def close(self):
        self.env.close()


def test_a_client_with_only_sync_methods_gets_async_ones() -> None:
    assert asyncio.run(episode(CustomClient())) == EXPECTED


@pytest.mark.parametrize("threaded", [True, False])
def test_the_collector_gets_the_same_batch_on_its_fast_path_and_through_the_async_methods(
    threaded: bool, chatml_tokenizer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(RolloutCollector, "threads_for_blocking_envs", threaded)
    WhereEnv.threads = []
    with RolloutCollector(WhereEnv, chatml_tokenizer, batch_size=2, group_size=2, seed=0) as collector:
        batch = collector.collect(ScriptedPolicy(chatml_tokenizer, reply="go"))
    assert [t.rewards for t in batch.trajectories] == [[0.5, 0.5, 0.5]] * 4
    assert all(t.error is None and t.terminated for t in batch.trajectories)
    assert [chatml_tokenizer.decode(t.token_ids).count("GO") for t in batch.trajectories] == [3] * 4
    # the fast path steps on the collector's own threads (agilerl-env-N); the async path through
    # the in-process client's caller, on the process-wide worker threads (agilerl-env-calls-N)
    assert len(WhereEnv.threads) == 12
    assert {name.rsplit("-", 1)[0] for name in WhereEnv.threads} == {"agilerl-env" if threaded else "agilerl-env-calls"}


def test_the_collector_drives_remote_clients_through_the_async_methods(chatml_tokenizer: Any) -> None:
    url, server = resolve_env(EchoEnv)
    with server, RolloutCollector(lambda: RemoteEnvClient(url), chatml_tokenizer, batch_size=2, group_size=2) as c:
        batch = c.collect(ScriptedPolicy(chatml_tokenizer, reply="go"))
    assert [t.rewards for t in batch.trajectories] == [[0.5, 0.5, 0.5]] * 4


def test_client_frames_are_built_and_read_in_one_place() -> None:
    assert decode(step_frame("hi")) == {"type": "step", "data": {"message": "hi"}}
    assert decode(step_frame("hi", "text", mcp_tool="say")) == {
        "type": "step",
        "data": {"type": "call_tool", "tool_name": "say", "arguments": {"text": "hi"}},
    }
    assert parse_reply(b"not json").type is None
    assert parse_reply(b'{"type":"error","data":{"code":"X","message":"m"}}').error == ("X", "m")
    beside = read_observation({"observation": {"text": "t"}, "metadata": {"a": 1}, "reward": 1, "done": True})
    inside = read_observation({"observation": {"text": "t", "metadata": {"a": 1}, "truncated": True}, "done": True})
    assert beside == ({"text": "t"}, 1.0, True, False, {"a": 1})
    assert inside[1:] == (0.0, False, True, {"a": 1})
    with pytest.raises(EnvProtocolError, match="data must be an object, got None"):
        read_observation(None)


def test_a_server_s_float_reward_past_the_bound_is_refused_as_a_local_env_s_is() -> None:
    """A finite float past +-1e15 (protocol.MAX_ABS_REWARD) from a foreign server broke the rule
    the in-process check holds; the reply's fast path let it through (an int was refused)."""
    for reward in (1e300, -1e16, float("inf"), float("nan")):
        with pytest.raises(EnvProtocolError, match=r"data\.reward must"):
            read_observation({"observation": {"text": "t"}, "reward": reward, "done": False})
    assert read_observation({"observation": {"text": "t"}, "reward": -1e15, "done": False}).reward == -1e15
