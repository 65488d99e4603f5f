"""RolloutCollector against real env servers on 127.0.0.1 (``resolve_env``)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from agilerl.errors import CollectionError
from agilerl.rollout.collector import RolloutCollector
from agilerl.generation.policy import ScriptedPolicy
from agilerl.remote.client import RemoteEnvClient
from agilerl.remote.hosting import resolve_env


class GuessEnv:
    """Two turns; reward 1 when the guess names the seed's parity, from rows of a small table."""

    max_turns = 2
    dataset_size = 9

    def reset(self, seed=None, *, row_index=None, evaluation=None):
        self.seed, self.turn = seed, 0
        return f"seed {seed} row {row_index}", {"row": row_index}

    def step(self, action):
        self.turn += 1
        return "again", float(action.strip() == "even"), self.turn >= 2, False, {}


@pytest.fixture
def serve():
    servers = []

    def start(max_concurrent_envs=16):
        url, server = resolve_env(GuessEnv, max_concurrent_envs=max_concurrent_envs)
        servers.append(server)
        return url, server

    yield start
    for server in servers:
        server.stop()


def test_remote_sessions_collect_grouped_rollouts(serve, chatml_tokenizer):
    url, server = serve()
    with RolloutCollector(lambda: RemoteEnvClient(url), chatml_tokenizer, batch_size=3, group_size=2, max_turns=2, seed=0) as c:
        assert c.assigner.dataset_size == 9  # read from the server's /metadata
        batch = c.collect(ScriptedPolicy(chatml_tokenizer, reply="even"))
        assert server.active_sessions == 6
    assert [len(g) for g in batch.groups] == [2, 2, 2]
    for group in batch.groups:
        assert len({(t.seed, t.row_index) for t in group}) == 1
        assert all(t.error is None and t.num_turns == 2 and t.total_reward == 2.0 for t in group)
    assert batch.stats.env_time_s > 0 and not batch.stats.failures


def test_a_server_with_too_few_sessions_is_refused_before_the_first_batch(serve, chatml_tokenizer):
    url, _ = serve(max_concurrent_envs=6)
    with pytest.raises(CollectionError, match=r"admits 6 concurrent sessions but this run needs 7 .*>= 7"):
        RolloutCollector(lambda: RemoteEnvClient(url), chatml_tokenizer, batch_size=3, group_size=2, max_turns=2)


def test_a_replica_killed_mid_collection_has_its_episodes_replayed_on_the_other(serve, chatml_tokenizer):
    (url_a, server_a), (url_b, server_b) = serve(), serve()
    factory = lambda: RemoteEnvClient([url_a, url_b], request_timeout_s=5, retry_budget_s=10)  # noqa: E731

    class KillAfterFirstTurn(ScriptedPolicy):
        def generate(self, prompts, params):
            if self.calls == 1:
                server_a.stop()
            return super().generate(prompts, params)

    with RolloutCollector(factory, chatml_tokenizer, batch_size=2, group_size=2, max_turns=2, seed=0, env_timeout_s=10) as c:
        batch = c.collect(KillAfterFirstTurn(chatml_tokenizer, reply="even"))
        assert server_b.active_sessions == 4  # the replays moved to B
    assert len(batch.stats.failures) == 2  # the two sessions that were on server A (round robin)
    assert all(f.phase == "step" and f.retried for f in batch.stats.failures)
    assert all(t.error is None and t.num_turns == 2 and t.total_reward == 2.0 for t in batch.trajectories)


class SlowOnSeed0Env(GuessEnv):
    """Like GuessEnv, but the episode with the first task's seed hangs (awaiting, on the server)."""

    hang_seed: int | None = None
    release = threading.Event()
    hangs_started: list = []
    hangs_finished: list = []

    async def step(self, action):
        if self.seed == type(self).hang_seed:
            type(self).hangs_started.append(self.seed)
            for _ in range(1000):  # until the test releases it, 10 s at most
                if type(self).release.is_set():
                    break
                await asyncio.sleep(0.01)
            type(self).hangs_finished.append(self.seed)
        return super().step(action)


def test_a_remote_step_past_the_timeout_is_cancelled_and_reported(chatml_tokenizer):
    from agilerl.rollout.assigner import TaskAssigner

    SlowOnSeed0Env.hang_seed = TaskAssigner(9, seed=0).assign(1, 1)[0].seed  # batch item 0's seed
    url, server = resolve_env(SlowOnSeed0Env, max_concurrent_envs=8)
    try:
        factory = lambda: RemoteEnvClient(url)
        with RolloutCollector(factory, chatml_tokenizer, batch_size=2, group_size=2, max_turns=2, seed=0, env_timeout_s=0.5) as c:
            batch = c.collect(ScriptedPolicy(chatml_tokenizer, reply="even"))
            # collect() gave up on both hung steps (one per group member) before either returned
            assert SlowOnSeed0Env.hangs_started == [SlowOnSeed0Env.hang_seed] * 2
            assert SlowOnSeed0Env.hangs_finished == []
            # the cancelled sessions were hung up: the next batch gets fresh ones, no stale reply
            again = c.collect(ScriptedPolicy(chatml_tokenizer, reply="even"))
            assert not again.stats.failures and SlowOnSeed0Env.hangs_finished == []
    finally:
        SlowOnSeed0Env.release.set()
        server.stop()
    assert sorted((f.slot, f.phase) for f in batch.stats.failures) == [(0, "step"), (1, "step")]
    assert all("env_timeout_s=0.5" in batch.trajectories[i].error for i in (0, 1))
    assert all(t.error is None and t.num_turns == 2 for t in batch.trajectories[2:])


class HeldOutEnv(GuessEnv):
    """GuessEnv with a held-out split of three rows and a known best reward."""

    eval_dataset_size = 3
    max_reward = 2.0
    resets: list = []

    def reset(self, seed=None, *, row_index=None, evaluation=None):
        type(self).resets.append((row_index, evaluation))
        return super().reset(seed, row_index=row_index, evaluation=evaluation)


def test_remote_evaluation_plays_the_servers_held_out_split(chatml_tokenizer):
    """The held-out size and max_reward come from /metadata, as from a local env."""
    HeldOutEnv.resets = []
    url, server = resolve_env(HeldOutEnv)
    with server, RolloutCollector(lambda: RemoteEnvClient(url), chatml_tokenizer, batch_size=1, group_size=1) as c:
        assert c.max_turns == 2 and c.max_reward == 2.0
        result = c.evaluate(ScriptedPolicy(chatml_tokenizer, reply="even"))
    assert (result.episodes, result.mean_reward, result.accuracy) == (3, 2.0, 1.0)
    assert [r for r in HeldOutEnv.resets if r[1]] == [(0, True), (1, True), (2, True)]
