"""Fault injection, env side: a real ``agilerl serve`` SIGKILLed mid-run and restarted on the same
port, envs that raise in some episodes, and envs whose text cannot fit the model's context."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agilerl.errors import CollectionError, EnvUnavailable
from agilerl.remote.client import RemoteEnvClient
from agilerl.rollout.assigner import TaskAssigner
from agilerl.rollout.collector import RolloutCollector
from agilerl.generation.policy import ScriptedPolicy
from agilerl.train.batch import collate_trajectories
from tests.health import start_server
from tests.test_remote_server import wait_for_health


class ServeProcess:
    """``agilerl serve ENTRYPOINT`` on a loopback port, which can be SIGKILLed and started again on
    that port (the first start binds a free one itself: ``url`` is set then)."""

    def __init__(self, log: Path, entrypoint: str = "guess", env: dict[str, str] | None = None) -> None:
        self.entrypoint, self.env = entrypoint, env
        self.url = ""
        self.log = log
        self.proc: subprocess.Popen[Any] | None = None
        self.restarted = threading.Event()
        self._restart: threading.Thread | None = None

    def start(self) -> None:
        serve = [sys.executable, "-m", "agilerl", "serve", self.entrypoint]
        if not self.url:
            url_file = self.log.with_suffix(".url")
            self.proc, self.url = start_server([*serve, "--port", "0", "--port-file", str(url_file)], url_file, self.log, env=self.env)
            return
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*serve, "--port", self.url.rsplit(":", 1)[1]], stdout=out, stderr=subprocess.STDOUT, env=self.env
            )
        wait_for_health(self.url, self.proc, self.log)

    def kill_and_restart_after(self, delay_s: float) -> None:
        """SIGKILL the server now; start it again on the same port ``delay_s`` later."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

        def restart() -> None:
            threading.Event().wait(delay_s)  # the outage
            self.start()
            self.restarted.set()

        self._restart = threading.Thread(target=restart, daemon=True)
        self._restart.start()

    def stop(self) -> None:
        if self._restart is not None:  # a restart still in flight must not outlive the test
            self._restart.join(60)
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServeProcess]:
    server = ServeProcess(tmp_path / "serve.log")
    server.start()
    yield server
    server.stop()


class KillOnCall(ScriptedPolicy):
    """Replies "0" (never the target: every episode plays all its turns); at generate call
    ``kill_at`` the env server is SIGKILLed, and it comes back on its port a second later."""

    def __init__(self, tokenizer: Any, server: ServeProcess, kill_at: int) -> None:
        super().__init__(tokenizer, reply="0")
        self.server, self.kill_at = server, kill_at

    def generate(self, prompts, params):
        if self.calls + 1 == self.kill_at:
            self.server.kill_and_restart_after(1.0)
        return super().generate(prompts, params)


def test_a_server_killed_mid_episode_and_restarted_loses_no_rollout(served, chatml_tokenizer):
    factory = lambda: RemoteEnvClient(served.url, retry_budget_s=60)  # noqa: E731
    with RolloutCollector(factory, chatml_tokenizer, batch_size=2, group_size=2, max_turns=3, seed=0) as c:
        policy = KillOnCall(chatml_tokenizer, served, kill_at=2)  # mid-episode: after turn 1
        batch = c.collect(policy)
        assert served.restarted.is_set()
        after = c.collect(policy)  # and the run goes on against the restarted server
    stats = batch.stats
    assert stats.retries == 4 and stats.lost == 0 and stats.groups_dropped == 0
    assert {(f.phase, f.retried) for f in stats.failures} == {("step", True)}
    assert all("ended mid-episode" in f.error for f in stats.failures)
    tasks = TaskAssigner(None, seed=0).assign(2, 2)
    for traj, task in zip(batch.trajectories, tasks):  # replayed from reset on the same task
        assert traj.error is None and traj.num_turns == 3 and traj.seed == task.seed
    assert not after.stats.failures and all(t.error is None for t in after.trajectories)
    metrics = stats.metrics()
    assert metrics["rollout/retries"] == 4 and metrics["rollout/lost"] == 0


def test_an_outage_past_the_bound_stops_the_run_naming_the_url(served, chatml_tokenizer):
    factory = lambda: RemoteEnvClient(served.url, retry_budget_s=0.5)  # noqa: E731
    with RolloutCollector(factory, chatml_tokenizer, batch_size=1, group_size=2, max_turns=3, seed=0) as c:
        served.stop()  # and it does not come back
        with pytest.raises(EnvUnavailable, match=rf"{served.url} within retry_budget_s=0.5 .*agilerl serve") as exc:
            c.collect(ScriptedPolicy(chatml_tokenizer, reply="0"))
    assert "reconnect_timeout_s" in str(exc.value)


STALLING_ENV = """
import os, time

class StallingEnv:
    max_turns = 2

    def reset(self, seed=None):
        self.turn = 0
        return "Say a number.", {}

    def step(self, action):
        self.turn += 1
        marker = os.environ["AGILERL_TEST_MARKER"]
        if not os.path.exists(marker):  # the first server: tell the test, and stall to be killed
            open(marker, "w").close()
            time.sleep(60)
        return "ok", 0.5, self.turn >= 2, False, {}
"""


def test_agilerl_train_rides_out_a_server_killed_mid_step(tmp_path, capsys):
    from agilerl.cli.main import main

    (tmp_path / "stalling.py").write_text(STALLING_ENV)
    marker = tmp_path / "killed-here"
    env = {**os.environ, "AGILERL_TEST_MARKER": str(marker), "PYTHONPATH": str(tmp_path)}
    server = ServeProcess(tmp_path / "serve.log", "stalling:StallingEnv", env)
    server.start()

    def kill_mid_step() -> None:
        for _ in range(1200):  # until the first step of the run is in flight, 120 s at most
            if marker.exists():
                server.kill_and_restart_after(1.0)
                return
            threading.Event().wait(0.1)

    killer = threading.Thread(target=kill_mid_step, daemon=True)
    killer.start()
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        f"environment:\n  env_type: rollout\n  env_url: {server.url}\n  max_turns: 2\n"
        "  reconnect_timeout_s: 60\n"
        "model:\n  name_or_path: tiny\nalgorithm:\n  name: grpo\n"
        "training:\n  batch_size: 2\n  group_size: 2\n  max_steps: 2\n  max_new_tokens: 2\n"
        f"  evaluation_interval: 0\n  output_dir: {tmp_path / 'run'}\n"
    )
    try:
        code = main(["train", str(manifest), "--no-progress"])
        killer.join(10)
    finally:
        server.stop()
    assert code == 0, capsys.readouterr().err[-3000:]
    assert server.restarted.is_set()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "rollout/retries" in r]
    assert len(steps) == 2 and sum(r["rollout/retries"] for r in steps) == 4  # the 4 sessions cut mid-step
    assert all(r["rollout/lost"] == 0 for r in steps)


class FlakyEnv:
    """Envs 1 and 4 (in build order) raise in their first episode, env 2 with ``SystemExit``;
    the replacements, built later, never do."""

    max_turns = 2
    built = 0
    lock = threading.Lock()

    def __init__(self) -> None:
        with FlakyEnv.lock:
            self.index, FlakyEnv.built = FlakyEnv.built, FlakyEnv.built + 1
        self.episodes = 0

    def reset(self, seed=None):
        self.episodes += 1
        return "say something", {}

    def step(self, action):
        if self.episodes == 1 and self.index == 2:
            raise SystemExit(3)  # a hostile env: contained like any other error
        if self.episodes == 1 and self.index in (1, 4):
            raise RuntimeError(f"env {self.index} broke")
        return "ok", 1.0, True, False, {}


def test_an_in_process_env_that_raises_in_some_episodes_never_ends_the_run(chatml_tokenizer):
    FlakyEnv.built = 0
    with RolloutCollector(FlakyEnv, chatml_tokenizer, batch_size=4, group_size=2, seed=0) as c:
        batch = c.collect(ScriptedPolicy(chatml_tokenizer))
        again = c.collect(ScriptedPolicy(chatml_tokenizer))
        result = c.evaluate(ScriptedPolicy(chatml_tokenizer), num_episodes=4)
    for b in (batch, again):
        assert all(t.error is None and t.total_reward == 1.0 for t in b.trajectories)
        assert b.stats.lost == 0 and b.stats.groups_dropped == 0
    assert sorted((f.slot, f.error, f.retried) for f in batch.stats.failures) == [
        (1, "RuntimeError: env 1 broke", True),
        (2, "SystemExit: 3", True),
        (4, "RuntimeError: env 4 broke", True),
    ]
    assert batch.stats.retries == 3 and not again.stats.failures
    assert result.episodes == 4 and result.failures == 0


class AsyncExitingEnv:
    """An ``async def step`` that raises ``SystemExit`` in the first episode played."""

    max_turns = 2
    steps = 0

    def reset(self, seed=None):
        return "hi", {}

    async def step(self, action):
        AsyncExitingEnv.steps += 1
        if AsyncExitingEnv.steps == 1:
            raise SystemExit(3)  # asyncio would re-raise it out of the shared loop
        return "ok", 1.0, True, False, {}


def test_an_async_env_raising_system_exit_is_one_replayed_episode(chatml_tokenizer):
    AsyncExitingEnv.steps = 0
    with RolloutCollector(AsyncExitingEnv, chatml_tokenizer, batch_size=1, group_size=2, seed=0, env_timeout_s=30) as c:
        batch = c.collect(ScriptedPolicy(chatml_tokenizer))
        again = c.collect(ScriptedPolicy(chatml_tokenizer))  # the shared loop still runs
    assert [(f.error, f.retried) for f in batch.stats.failures] == [("SystemExit: 3", True)]
    assert all(t.error is None for t in batch.trajectories + again.trajectories)


class FourValueStep:
    """Breaks the protocol: step returns 4 values."""

    max_turns = 2

    def reset(self, seed=None):
        return "go", {}

    def step(self, action):
        return "obs", 1.0, True, {}


def test_agilerl_train_names_why_every_episode_failed(tmp_path, capsys):
    from agilerl.cli.main import main

    (tmp_path / "four.py").write_text(
        "class FourValueStep:\n    max_turns = 2\n\n    def reset(self, seed=None):\n"
        "        return 'go', {}\n\n    def step(self, action):\n        return 'obs', 1.0, True, {}\n"
    )
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "environment:\n  env_type: rollout\n  entrypoint: four.py:FourValueStep\n"
        "model:\n  name_or_path: tiny\ntraining:\n  batch_size: 1\n  group_size: 2\n  max_steps: 1\n"
        f"  max_new_tokens: 2\n  eval_episodes: 2\n  output_dir: {tmp_path / 'run'}\n"
    )
    assert main(["train", str(manifest), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "every one of the 2 evaluation episodes failed; the first, episode 0" in err
    assert "EnvProtocolError" in err and "agilerl env check" in err


def test_when_every_rollout_fails_the_error_carries_the_cause_and_the_check_command(chatml_tokenizer):
    with RolloutCollector(FourValueStep, chatml_tokenizer, batch_size=2, group_size=2, seed=0) as c:
        with pytest.raises(CollectionError, match=r"all 4 rollouts failed; the first, slot 0, in step: EnvProtocolError: .*agilerl env check"):
            c.collect(ScriptedPolicy(chatml_tokenizer))
        with pytest.raises(CollectionError, match=r"every one of the 2 evaluation episodes failed; the first, episode 0, slot \d+, in step: EnvProtocolError: .*4.*agilerl env check"):
            c.evaluate(ScriptedPolicy(chatml_tokenizer), num_episodes=2)


class HugeText:
    """Its opening prompt (or, with ``at_step``, its first observation) is ``size`` characters."""

    max_turns = 3
    size = 0
    at_step = False

    def reset(self, seed=None):
        return ("x " * (self.size // 2) if not self.at_step else "start"), {}

    def step(self, action):
        return ("y " * (self.size // 2) if self.at_step else "fine"), 0.5, False, False, {}


@pytest.mark.parametrize("size", [200_000, 5_000_000])
def test_an_opening_prompt_too_long_for_the_context_ends_before_any_model_work(size, chatml_tokenizer):
    class Env(HugeText):
        pass

    Env.size = size

    class NeverCalled(ScriptedPolicy):
        max_model_len = 2048

        def generate(self, prompts, params):
            raise AssertionError("the policy must not see a prompt that cannot fit")

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with RolloutCollector(Env, chatml_tokenizer, batch_size=1, group_size=2, seed=0) as c:
        with pytest.raises(CollectionError, match=rf"all 2 rollouts failed; the first, slot 0, in context: the env's opening prompt is {size:,} characters, more than max_model_len=2048"):
            c.collect(NeverCalled(chatml_tokenizer))
    grown_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mb < 200  # the text itself, a few times at most: never its tokens


class RemoteHuge(HugeText):
    size = 5_000_000


def test_a_remote_env_returning_5_mb_is_bounded_the_same_way(chatml_tokenizer):
    from agilerl.remote.hosting import resolve_env

    class Bounded(ScriptedPolicy):
        max_model_len = 2048

        def generate(self, prompts, params):
            raise AssertionError("the policy must not see a prompt that cannot fit")

    url, server = resolve_env(RemoteHuge, max_concurrent_envs=4)
    with server, RolloutCollector(lambda: RemoteEnvClient(url), chatml_tokenizer, batch_size=1, group_size=2, seed=0) as c:
        with pytest.raises(CollectionError, match=r"in context: the env's opening prompt is 5,000,000 characters"):
            c.collect(Bounded(chatml_tokenizer))


def test_an_observation_too_long_ends_the_episode_after_the_last_action_untokenized(chatml_tokenizer):
    class Env(HugeText):
        at_step = True
        size = 5_000_000

    class Bounded(ScriptedPolicy):
        max_model_len = 256

    with RolloutCollector(Env, chatml_tokenizer, batch_size=2, group_size=2, seed=0) as c:
        batch = c.collect(Bounded(chatml_tokenizer, reply="hi"))
    for traj in batch.trajectories:
        assert traj.error is None and traj.truncated and traj.info["truncated_by"] == "max_model_len"
        assert traj.num_turns == 1 and traj.rewards == [0.5] and traj.action_mask[-1]
        assert len(traj.token_ids) < 256
    assert batch.stats.context_truncated == 4 and batch.stats.metrics()["rollout/context_truncated"] == 4
    collate_trajectories(batch.trajectories, 0)


def test_a_prompt_that_fills_the_context_is_lost_not_trained_on(chatml_tokenizer):
    """Short enough to tokenize, too long to leave room for one generated token."""

    class Env(HugeText):
        size = 400  # ~200 tokens of "x "

    class Small(ScriptedPolicy):
        max_model_len = 64

    with RolloutCollector(Env, chatml_tokenizer, batch_size=1, group_size=2, seed=0) as c:
        with pytest.raises(CollectionError, match=r"in context: the opening prompt is [\d,]+ tokens: max_model_len=64 leaves no room"):
            c.collect(Small(chatml_tokenizer))


def test_a_remote_frame_over_the_clients_bound_is_refused(served):
    with pytest.raises(EnvUnavailable, match="max_message_bytes"):
        RemoteEnvClient(served.url, max_message_bytes=64, retry_budget_s=0.3).reset()


def test_the_manifests_reconnect_bound_reaches_the_remote_clients():
    from agilerl.assembly.env_factory import make_env_factory
    from agilerl.manifest.spec import parse_env_spec

    spec = parse_env_spec({"env_type": "rollout", "env_url": "127.0.0.1:1", "reconnect_timeout_s": 7})
    assert make_env_factory(spec)().retry_budget_s == 7
    default = parse_env_spec({"env_type": "rollout", "env_url": "127.0.0.1:1"})
    assert make_env_factory(default)().retry_budget_s == 120


def test_the_length_check_never_refuses_text_that_would_fit(chatml_tokenizer):
    import random

    from agilerl.rollout.context import ContextBudget

    rng = random.Random(0)
    alphabet = "abc xyz 0123 \n\t" + "".join(chr(c) for c in (0xE9, 0x4E2D, 0x1F600, 0x0301))
    for limit in (4, 16, 64):
        budget = ContextBudget.for_tokenizer(chatml_tokenizer, limit)
        for _ in range(200):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 4 * limit * budget.chars_per_token)))
            if budget.cannot_fit(len(text), 0):
                assert len(chatml_tokenizer.encode(text, add_special_tokens=False)) > limit
