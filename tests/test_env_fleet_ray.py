"""Env fleets on Ray, and what every fleet shares: the start rate limiter with its retries, and
``replicas: auto``. The Ray tests share one local cluster (``ray.init(num_cpus=2)``) per module."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agilerl.errors import InvalidArgument, ManifestError, MissingExtra, ReplicaStartError
from agilerl.fleet.autoscale import Autoscaler, sessions_needed
from agilerl.fleet.limits import StartLimiter, start_with_retry
from agilerl.fleet.provider import ReplicaSpec
from agilerl.fleet.ray_provider import NAMESPACE, RayProvider
from agilerl.manifest.settings import TrainingSettings
from agilerl.manifest.spec import parse_manifest
from agilerl.remote.client import RemoteEnvClient


class FakeClock:
    """Time that moves only when something sleeps: waits are counted, never waited."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


# -- the start limiter --------------------------------------------------------------------------


def test_the_limiter_lets_a_burst_through_then_one_start_per_interval():
    clock = FakeClock()
    limiter = StartLimiter(2.0, burst=2, clock=clock, sleep=clock.sleep)
    started = clock.now
    for _ in range(6):
        assert limiter.acquire()
    assert clock.now - started == pytest.approx(2.0)  # 2 at once, then 4 at 0.5 s apart
    clock.now += 10  # a long quiet spell refills the bucket only up to the burst
    before = clock.now
    for _ in range(3):
        limiter.acquire()
    assert clock.now - before == pytest.approx(0.5)


def test_the_limiter_refuses_a_token_it_cannot_give_within_the_timeout():
    clock = FakeClock()
    limiter = StartLimiter(0.5, clock=clock, sleep=clock.sleep)
    assert limiter.acquire(timeout_s=0)
    assert not limiter.acquire(timeout_s=1.0)  # the next is 2 s away
    assert clock.slept == []
    assert limiter.acquire(timeout_s=2.0)


@pytest.mark.parametrize("rate", [0, -1, math.inf, math.nan])
def test_a_rate_that_is_no_rate_is_refused_naming_the_field(rate):
    with pytest.raises(InvalidArgument, match="max_starts_per_s"):
        StartLimiter(rate)


class FlakyStart:
    """Raises the given errors in turn, then returns "replica"."""

    def __init__(self, *errors: ReplicaStartError) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "replica"


def test_a_failure_that_can_succeed_is_retried_with_growing_backoff_each_try_through_the_limiter():
    clock, backoff = FakeClock(), FakeClock()
    limiter = StartLimiter(1.0, clock=clock, sleep=clock.sleep)
    start = FlakyStart(*(ReplicaStartError("node lost", retryable=True) for _ in range(3)))
    assert start_with_retry(start, limiter, what="replica 0", first_delay_s=1, sleep=backoff.sleep) == "replica"
    assert start.calls == 4
    assert [0.5 <= d / 2**i <= 1.0 for i, d in enumerate(backoff.slept)] == [True] * 3  # 1, 2, 4 s, jittered
    assert clock.slept != []  # the retries took tokens: they never outrun the rate


def test_a_failure_that_cannot_succeed_is_not_retried():
    backoff = FakeClock()
    start = FlakyStart(ReplicaStartError("No module named 'foo'", retryable=False))
    with pytest.raises(ReplicaStartError, match="foo"):
        start_with_retry(start, None, what="replica 0", sleep=backoff.sleep)
    assert start.calls == 1 and backoff.slept == []


def test_retries_are_bounded_and_the_error_says_how_many_tries_were_made():
    backoff = FakeClock()
    start = FlakyStart(*(ReplicaStartError("timed out", retryable=True) for _ in range(10)))
    with pytest.raises(ReplicaStartError, match=r"replica 3 did not start in 4 tries; the last: timed out") as exc:
        start_with_retry(start, None, what="replica 3", attempts=4, max_delay_s=3, sleep=backoff.sleep)
    assert start.calls == 4 and exc.value.retryable
    assert len(backoff.slept) == 3 and max(backoff.slept) <= 3


# -- replicas: auto -----------------------------------------------------------------------------


def test_sessions_needed_counts_every_lane_and_the_evaluation():
    sync = TrainingSettings(batch_size=4, group_size=2, evaluation_interval=0)
    assert sessions_needed(sync) == 8
    evaluated = TrainingSettings(batch_size=4, group_size=2, evaluation_interval=5, eval_episodes=3)
    assert sessions_needed(evaluated) == 11
    lanes = TrainingSettings(batch_size=4, group_size=2, evaluation_interval=0, rollout_mode="async", max_staleness=2)
    assert sessions_needed(lanes) == 24


def test_auto_starts_with_the_replicas_the_sessions_fill():
    scaler = Autoscaler(4)
    assert scaler.floor(10) == 3 and scaler.bound(10) == 6
    assert scaler.target(10, in_use=0, refused_recently=0, idle_since=[], now=0) == 3
    assert Autoscaler(64).floor(1) == 1 and Autoscaler(64).bound(1) == 2


def test_auto_grows_when_sessions_are_refused_for_capacity_up_to_its_bound():
    scaler = Autoscaler(4)  # 2 replicas, at most 4
    busy = [None, None]
    assert scaler.target(8, in_use=8, refused_recently=1, idle_since=busy, now=0) == 3
    assert scaler.target(8, in_use=8, refused_recently=5, idle_since=busy, now=1) == 4  # 5 refused: 2 more
    assert scaler.target(8, in_use=16, refused_recently=9, idle_since=[None] * 4, now=2) == 4  # the bound


def test_auto_shrinks_one_idle_replica_at_a_time_after_the_hysteresis_never_below_what_the_run_needs():
    scaler = Autoscaler(4, shrink_after_s=60)
    assert scaler.target(8, in_use=8, refused_recently=2, idle_since=[None, None], now=0) == 3
    grown = [None, None, 10.0]  # the new one went idle at t=10
    assert scaler.target(8, in_use=8, refused_recently=0, idle_since=grown, now=50) == 3  # idle < 60 s
    assert scaler.target(8, in_use=8, refused_recently=0, idle_since=grown, now=75) == 2
    scaler = Autoscaler(4, shrink_after_s=60)
    scaler.target(8, in_use=0, refused_recently=1, idle_since=[None, None], now=100)
    idle_long = [0.0, 0.0, 0.0]  # idle for ages, but the fleet grew 30 s ago: no flapping
    assert scaler.target(8, in_use=0, refused_recently=0, idle_since=idle_long, now=130) == 3
    assert scaler.target(8, in_use=0, refused_recently=0, idle_since=idle_long, now=161) == 2
    assert scaler.target(8, in_use=0, refused_recently=0, idle_since=[0.0, 0.0], now=500) == 2  # the floor
    assert scaler.target(4, in_use=0, refused_recently=0, idle_since=[0.0, 0.0], now=500) == 1  # less needed now


def test_auto_does_not_shrink_while_the_sessions_open_would_not_fit():
    scaler = Autoscaler(4, shrink_after_s=60)
    assert scaler.target(4, in_use=5, refused_recently=0, idle_since=[None, 0.0], now=500) == 2


def test_auto_bounds_are_checked():
    with pytest.raises(InvalidArgument, match="max_concurrent_envs"):
        Autoscaler(0, maximum=2)
    with pytest.raises(InvalidArgument, match="minimum <= maximum"):
        Autoscaler(4, minimum=3, maximum=2)


# -- the manifest -------------------------------------------------------------------------------


def _manifest(**environment: Any) -> Any:
    return parse_manifest({
        "environment": {"env_type": "rollout", "entrypoint": "guess", **environment},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"name": "grpo"},
    })


@pytest.mark.parametrize(
    ("environment", "field"),
    [
        ({"provider": "kubernetes"}, "environment.provider"),
        ({"provider": "ray", "replicas": 0}, "environment.replicas"),
        ({"provider": "ray", "replicas": "some"}, "environment.replicas"),
        ({"provider": "ray", "max_starts_per_s": 0}, "environment.max_starts_per_s"),
        ({"provider": "local", "address": "auto"}, "'address' names a Ray cluster"),
        ({"max_starts_per_s": 2}, "'max_starts_per_s' applies to provider 'local' or 'ray'"),
    ],
)
def test_a_bad_fleet_value_is_a_manifest_error_naming_the_field(environment, field):
    with pytest.raises(ManifestError, match=field):
        _manifest(**environment)


def test_a_ray_fleet_manifest_validates():
    env = _manifest(provider="ray", replicas="auto", address="ray://head:10001", max_starts_per_s=0.5).environment
    assert (env.placement, env.replicas, env.address, env.max_starts_per_s) == ("ray", "auto", "ray://head:10001", 0.5)


# -- Ray ------------------------------------------------------------------------------------------


def replica_servers() -> list[int]:
    """The pids of the ``agilerl serve`` processes Ray replicas started (their URL files live in
    an ``agilerl-replica-*`` folder)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if b"serve" in cmdline and b"agilerl-replica-" in cmdline:
                found.append(int(entry))
    return found


def replica_actors(ray: Any) -> list[str]:
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["namespace"] == NAMESPACE]


def wait_until(predicate: Any, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {what}")
        time.sleep(0.1)


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """One local Ray cluster for the module (2 CPUs); the SIGTERM handler ray.init sets is undone."""
    import ray

    before = signal.getsignal(signal.SIGTERM)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="ERROR")
    try:
        yield ray
    finally:
        ray.shutdown()
        signal.signal(signal.SIGTERM, before)


def _spec(tmp_path: Path, **environment: Any) -> ReplicaSpec:
    return ReplicaSpec({"env_type": "rollout", "entrypoint": "guess", "provider": "ray", **environment}, str(tmp_path), 4)


def test_without_the_ray_extra_the_error_names_it(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingExtra, match=r"provider: ray needs the 'ray' extra .*pip install 'agilerl-envlayer\[ray\]'"):
        RayProvider(_spec(tmp_path))


def test_a_ray_replica_serves_dies_with_its_actor_and_close_leaves_nothing(ray_cluster, tmp_path):
    spec = _spec(tmp_path)
    provider = RayProvider(spec)
    try:
        first, second = provider.start(spec, 0, 120), provider.start(spec, 1, 120)
        assert first.url.startswith("ws://127.0.0.1:") and first.url != second.url
        with RemoteEnvClient(first.url) as client:
            client.reset(seed=0)
            assert client.step("5")[0] in ("Too low!", "Too high!", "Correct!")
        assert len(replica_servers()) == 2 and len(replica_actors(ray_cluster)) == 2
        ray_cluster.kill(first.handle[1])  # the actor dies: its server goes with it
        wait_until(lambda: not provider.alive(first), "the killed replica reads as dead")
        wait_until(lambda: len(replica_servers()) == 1, "the dead actor's server exits")
        assert provider.alive(second)
    finally:
        provider.close()
    assert replica_servers() == [] and replica_actors(ray_cluster) == []
    provider.close()  # idempotent
    with pytest.raises(ReplicaStartError, match="closed") as exc:
        provider.start(spec, 2, 10)
    assert not exc.value.retryable


def test_a_replica_whose_env_cannot_be_built_is_not_retried_and_leaves_nothing(ray_cluster, tmp_path):
    spec = _spec(tmp_path, entrypoint="no_such_module_here:Env")
    provider = RayProvider(spec)
    try:
        with pytest.raises(ReplicaStartError, match="no_such_module_here") as exc:
            provider.start(spec, 0, 120)
        assert not exc.value.retryable
    finally:
        provider.close()
    assert replica_servers() == [] and replica_actors(ray_cluster) == []
