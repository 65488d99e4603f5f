"""What serving an env outside the trainer costs and gains, each figure against its baseline in
the same run.

    python bench/env_fleet.py                       # all three
    python bench/env_fleet.py --steps 3 --seconds 2 # a smoke run

1. **Start of an isolated env** (``isolation: venv``): cold (an empty ``$AGILERL_CACHE_DIR``: the
   venv resolved, built and served; uv's own download cache stays warm, as on any machine that
   built one before) against warm (the venv found: no resolve, no network), to the first reset.
2. **A training step** on the guess env (GRPO, the tiny model, batch x group rollouts), the env
   served from its venv by one local replica against the env in process. Goal: <= 1.15x.
3. **Env steps per second** over 1 and 2 local replicas (``provider: local``) of an env whose
   step burns ``--burn-ms`` of CPU, driven by ``--sessions`` concurrent sessions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()


class BurnEnv:
    """A text env whose every step burns ``burn_ms`` of CPU (an env doing real work)."""

    max_turns = 1_000_000

    def __init__(self, burn_ms: float = 5.0) -> None:
        self.burn_s = burn_ms / 1000

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return "go", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        end = time.thread_time() + self.burn_s
        while time.thread_time() < end:
            pass
        return "ok", 0.0, False, False, {}


def start_times(packages: list[str]) -> tuple[float, float]:
    """Seconds from nothing to a first reset of an isolated guess env: cold, then warm."""
    from agilerl.assembly.env_factory import make_env_factory
    from agilerl.manifest.spec import parse_env_spec

    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "guess", "isolation": "venv",
                           **({"env_packages": {"uv": packages}} if packages else {})})
    times = []
    for _ in range(2):
        started = time.perf_counter()
        factory = make_env_factory(spec)
        client = factory()
        client.reset(seed=0)
        times.append(time.perf_counter() - started)
        client.close()
        factory.close()
    return times[0], times[1]


def step_seconds(environment: dict[str, Any], steps: int, batch: int, group: int, out: Path) -> float:
    """Median ``time/step_s`` of a GRPO run on ``environment`` (its first step left out)."""
    from agilerl.assembly.from_manifest import train_from_manifest
    from agilerl.manifest.spec import Manifest

    manifest = Manifest.model_validate({
        "environment": environment,
        "model": {"name_or_path": "tiny"},
        "algorithm": {"name": "grpo"},
        "training": {"batch_size": batch, "group_size": group, "max_steps": steps + 1, "max_new_tokens": 4,
                     "evaluation_interval": 0, "checkpoint_interval": 0, "output_dir": str(out), "seed": 0},
    })
    train_from_manifest(manifest, show_progress=False)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    times = [r["time/step_s"] for r in rows if "time/step_s" in r][1:]
    return statistics.median(times)


def steps_per_s(replicas: int, sessions: int, seconds: float, burn_ms: float) -> float:
    """Env steps per second through ``sessions`` concurrent sessions over ``replicas`` replicas."""
    from agilerl.assembly.env_factory import make_env_factory
    from agilerl.concurrency import shared_loop
    from agilerl.manifest.spec import parse_env_spec

    spec = parse_env_spec({"env_type": "rollout", "entrypoint": f"{HERE.name}:BurnEnv",
                           "env_config": {"burn_ms": burn_ms}, "provider": "local", "replicas": replicas})
    factory = make_env_factory(spec, base_dir=HERE.parent)
    clients = [factory() for _ in range(sessions)]

    async def drive(client: Any, until: float, counts: list[int]) -> None:
        await client.areset(seed=0)
        while time.perf_counter() < until:
            await client.astep("x")
            counts.append(1)

    async def run(duration: float) -> int:
        counts: list[int] = []
        until = time.perf_counter() + duration
        await asyncio.gather(*(drive(c, until, counts) for c in clients))
        return len(counts)

    try:
        loop = shared_loop()
        loop.run(run(min(1.0, seconds / 2)))  # warm-up: sessions open, servers warm
        started = time.perf_counter()
        done = loop.run(run(seconds))
        return done / (time.perf_counter() - started)
    finally:
        for client in clients:
            client.close()
        factory.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parts", default="start,step,replicas", help="Which parts (comma-separated).")
    parser.add_argument("--package", action="append", default=[], help="An env package for the start part (repeatable).")
    parser.add_argument("--steps", type=int, default=10, help="Training steps timed per side (after one warm-up).")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--sessions", type=int, default=8, help="Concurrent sessions of the replicas part.")
    parser.add_argument("--seconds", type=float, default=10.0, help="Seconds each replica count is driven.")
    parser.add_argument("--burn-ms", type=float, default=5.0, help="CPU each env step burns, ms.")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    print(f"cpus: {os.cpu_count()}, load average: {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="agilerl-bench-fleet-") as tmp:
        os.environ["AGILERL_CACHE_DIR"] = str(Path(tmp) / "cache")  # cold: an empty cache
        if "start" in parts:
            cold, warm = start_times(args.package)
            print(f"start of an isolated env: cold {cold:.2f} s, warm {warm:.2f} s: warm is {cold / warm:.2f}x faster")
        if "step" in parts:
            base = {"env_type": "rollout", "entrypoint": "guess", "max_turns": 3}
            here = step_seconds(base, args.steps, args.batch_size, args.group_size, Path(tmp) / "in-process")
            venv = step_seconds({**base, "isolation": "venv"}, args.steps, args.batch_size, args.group_size,
                                Path(tmp) / "venv")
            print(f"training step, guess env: in process {here:.3f} s, isolation venv {venv:.3f} s: "
                  f"{venv / here:.2f}x (goal <= 1.15x)")
        if "replicas" in parts:
            one = steps_per_s(1, args.sessions, args.seconds, args.burn_ms)
            two = steps_per_s(2, args.sessions, args.seconds, args.burn_ms)
            print(f"env steps/s, {args.burn_ms:g} ms of CPU a step, {args.sessions} sessions: 1 replica {one:.0f}, "
                  f"2 replicas {two:.0f}: {two / one:.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
