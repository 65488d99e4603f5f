"""Env fleets with ``provider: local``: real ``agilerl serve`` replicas on loopback, balanced by
free capacity, replaced when killed (the run loses and doubles nothing), and gone after the run
however it ends."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from agilerl.assembly.env_factory import make_env_factory
from agilerl.fleet.fleet import Fleet, fleet_metrics
from agilerl.fleet.local import LocalProvider
from agilerl.errors import ReplicaStartError
from agilerl.fleet.provider import ReplicaSpec
from agilerl.generation.policy import ScriptedPolicy
from agilerl.manifest.spec import parse_env_spec
from agilerl.rollout.assigner import TaskAssigner
from agilerl.rollout.collector import RolloutCollector
from tests.signals import as_from_a_terminal

pytestmark = pytest.mark.timeout(300)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pids: list[int], bound_s: float = 15.0) -> list[int]:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


def _pids(fleet: Fleet) -> list[int]:
    return [int(p) for p in re.findall(r"pid (\d+)", fleet.describe())]


def _guess_fleet(replicas: int, max_concurrent_envs: int = 64, **options: Any) -> Fleet:
    spec = ReplicaSpec({"entrypoint": "guess", "env_config": {}}, os.getcwd(), max_concurrent_envs)
    return Fleet(spec, LocalProvider(spec), replicas, **options).start()


def test_sessions_go_to_the_replica_with_the_most_free_capacity():
    with _guess_fleet(2, max_concurrent_envs=3) as fleet:
        a, b = fleet.urls
        picks = [fleet.pick() for _ in range(4)]
        assert sorted(picks) == sorted([a, b, a, b])  # alternating while both have room
        fleet.released(a)
        fleet.released(a)
        assert fleet.pick() == a and fleet.pick() == a  # a has 2 free, b has 1
        assert fleet.metrics()["envs/sessions"] == 4.0
        fleet.released(b)
        fleet.released(b)
        assert fleet.pick() == b
        assert fleet.refused == 0


def test_a_dead_replica_is_replaced_and_its_url_leaves_the_rotation():
    with _guess_fleet(2, health_interval_s=0.2) as fleet:
        first, second = fleet.urls
        victim = _pids(fleet)[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while fleet.replaced < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fleet.replaced == 1
        assert second in fleet.urls and first not in fleet.urls and len(fleet.urls) == 2
        assert victim not in _pids(fleet)
        metrics = fleet_metrics()
        assert metrics["envs/replicas"] == 2.0 and metrics["envs/replaced"] == 1.0
        pids = _pids(fleet)
    assert _wait_gone(pids) == []
    assert fleet_metrics() == {}  # a closed fleet is no longer reported


def test_a_replica_that_cannot_start_names_its_error_and_is_not_retried(tmp_path):
    spec = ReplicaSpec({"entrypoint": "no_such_module_xyz:Env"}, str(tmp_path), 4)
    provider = LocalProvider(spec)
    try:
        with pytest.raises(ReplicaStartError, match="no_such_module_xyz") as exc:
            provider.start(spec, 0, 60)
        assert exc.value.retryable is False
    finally:
        provider.close()


class KillReplicaAt(ScriptedPolicy):
    """Replies "0" (episodes play every turn); at generate call ``at`` SIGKILLs the replica the
    most sessions are on."""

    def __init__(self, tokenizer: Any, fleet: Fleet, at: int) -> None:
        super().__init__(tokenizer, reply="0")
        self.fleet, self.at, self.killed = fleet, at, 0

    def generate(self, prompts, params):
        if self.calls + 1 == self.at:
            with self.fleet._lock:
                slot = max(self.fleet._slots, key=lambda s: s.sessions)
                self.killed = slot.sessions
                os.kill(slot.replica.handle.pid, signal.SIGKILL)
        return super().generate(prompts, params)


def test_killing_a_replica_mid_episode_loses_and_doubles_no_task(chatml_tokenizer):
    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "guess", "provider": "local", "replicas": 2})
    factory = make_env_factory(spec)
    fleet = factory.fleet
    fleet.health_interval_s = 0.3
    with RolloutCollector(factory, chatml_tokenizer, batch_size=2, group_size=2, max_turns=3, seed=0) as c:
        policy = KillReplicaAt(chatml_tokenizer, fleet, at=2)  # after turn 1 of every episode
        batch = c.collect(policy)
        after = c.collect(policy)
        assert policy.killed >= 1
        deadline = time.monotonic() + 60
        while fleet.replaced < 1 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert fleet.replaced == 1 and len(fleet.urls) == 2
        pids = _pids(fleet)
    stats = batch.stats
    assert stats.lost == 0 and stats.groups_dropped == 0
    assert stats.retries == policy.killed  # each session on the dead replica replayed once
    tasks = TaskAssigner(None, seed=0).assign(2, 2)
    assert [t.seed for t in batch.trajectories] == [task.seed for task in tasks]  # each task once, in place
    assert all(t.error is None and t.num_turns == 3 for t in batch.trajectories)
    assert not after.stats.failures
    assert _wait_gone(pids) == []  # the collector's close stopped the fleet


RUN = textwrap.dedent("""
    import os, signal, sys, time
    from agilerl.assembly.env_factory import make_env_factory
    from agilerl.manifest.spec import parse_env_spec

    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "guess", "provider": "local", "replicas": 2})
    factory = make_env_factory(spec)
    client = factory()
    client.reset(seed=0)
    print("pids", " ".join(__import__("re").findall(r"pid (\\d+)", factory.where)), flush=True)
    how = sys.argv[1]
    if how != "waits":
        sys.stdin.readline()  # the test has seen the replicas alive
    if how == "raises":
        raise RuntimeError("the run failed")
    if how == "waits":
        time.sleep(120)
""")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["succeeds", "raises", "ctrl-c", "sigterm", "sigkill"])
def test_no_replica_outlives_the_run(tmp_path, how):
    script = tmp_path / "run.py"
    script.write_text(RUN)
    process = subprocess.Popen(
        [sys.executable, str(script), "waits" if how in ("ctrl-c", "sigterm", "sigkill") else how],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.getcwd(),
        preexec_fn=as_from_a_terminal,  # a suite started as a background job would leave SIGINT ignored
    )
    try:
        line = process.stdout.readline()
        assert line.startswith("pids "), process.stderr.read()[-2000:]
        pids = [int(p) for p in line.split()[1:]]
        assert len(pids) == 2 and all(_alive(p) for p in pids)
        signals = {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}
        if how in signals:
            process.send_signal(signals[how])
        else:  # the run goes on (to its end, or its error) only once its replicas were seen alive
            process.stdin.write("go\n")
            process.stdin.flush()
        process.wait(60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if how == "raises":
        assert process.returncode != 0
    # SIGTERM and SIGKILL leave no time for cleanup: the replicas notice their parent is gone
    assert _wait_gone(pids, bound_s=10) == []


@pytest.mark.slow
def test_agilerl_train_on_local_replicas_logs_the_fleet_every_step(tmp_path, capsys):
    from agilerl.cli.main import main

    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "environment:\n  env_type: rollout\n  entrypoint: guess\n  provider: local\n  replicas: 2\n  max_turns: 2\n"
        "model:\n  name_or_path: tiny\nalgorithm:\n  name: grpo\n"
        "training:\n  batch_size: 2\n  group_size: 2\n  max_steps: 2\n  max_new_tokens: 2\n"
        f"  evaluation_interval: 0\n  output_dir: {tmp_path / 'run'}\n"
    )
    assert main(["train", str(manifest), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"env: 2 local replicas: ws://127\.0\.0\.1:\d+ \(pid \d+ in the trainer's interpreter\)", err)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "envs/replicas" in r]
    assert len(steps) == 2
    assert all(r["envs/replicas"] == 2 and r["envs/replaced"] == 0 and r["envs/start_s"] > 0 for r in steps)
    assert fleet_metrics() == {}  # the run's end stopped it
