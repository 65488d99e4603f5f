"""RolloutCollector against its ideal: 16 x 4 slots, 5 turns, an env that sleeps 20 ms a step.

The ideal is the env latency alone (5 x 20 ms) plus the measured generation time: everything
else (threads, tokenizing, bookkeeping) is overhead. A sequential loop over the same slots,
in the same run, is the baseline the concurrency must beat. Scripted policy: no model.

Two floors, also measured in the same run, show what this machine itself costs before any
collector code runs: the same env calls made straight on the collector's worker threads (no
harness, no tokenizer), and bare aiohttp WebSocket round trips to a server that only sleeps
(no env, no harness, no protocol models). Each collector line also gives its ratio to its floor.

    python bench/collector.py [--repeats 7] [--batch-size 16 --group-size 4] [--latency-ms 20]
                              [--fresh-observations] [--no-remote]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

from agilerl.train.tiny_model import build_tiny_tokenizer
from agilerl.rollout.collector import RolloutCollector
from agilerl.concurrency import run_in_threads
from agilerl.generation.policy import SamplingParams, ScriptedPolicy
from agilerl.rollout.harness import RolloutHarness
from agilerl.remote.client import RemoteEnvClient
from agilerl.concurrency import WorkerThreads
from agilerl.ports import free_port

TURNS = 5
LATENCY_S = float(os.environ.get("BENCH_LATENCY_MS", "20")) / 1000  # the server process reads it too
FRESH = os.environ.get("BENCH_FRESH_OBSERVATIONS") == "1"  # new text every turn, as most envs give


class SleepyEnv:
    """Answers after ``LATENCY_S``; ends after ``TURNS`` steps."""

    max_turns = TURNS

    episodes = itertools.count()

    def __init__(self) -> None:
        self.turn = 0
        self.episode = 0

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.turn = 0
        self.episode = next(self.episodes)  # every episode of every slot is a new game
        return f"Guess a number between 1 and 10 ({seed}).", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        time.sleep(LATENCY_S)
        self.turn += 1
        text = f"Too low! That was guess {self.turn} of game {self.episode}." if FRESH else "Too low!"
        return text, 0.0, self.turn >= TURNS, False, {}


def _report(name: str, wall_s: float, ideal_s: float, extra: str = "") -> None:
    print(f"{name:<36} wall {wall_s * 1000:8.1f} ms   ideal {ideal_s * 1000:6.1f} ms   "
          f"ratio to ideal: {wall_s / ideal_s:.2f}{extra}")


def bench_collector(
    name: str, factory: Any, tokenizer: Any, slots: tuple[int, int], repeats: int, floor_s: float
) -> float:
    """Median wall time of ``repeats`` batches; also reports the best batch (least disturbed)."""
    policy = ScriptedPolicy(tokenizer, "5")
    settings = {"batch_size": slots[0], "group_size": slots[1], "max_turns": TURNS, "seed": 0}
    with RolloutCollector(factory, tokenizer, **settings) as collector:
        collector.collect(policy)  # warm-up: threads, template caches, connections
        runs = sorted((collector.collect(policy).stats for _ in range(repeats)), key=lambda s: s.wall_time_s)
    best, median = runs[0], runs[len(runs) // 2]
    ratio = best.wall_time_s / (TURNS * LATENCY_S + best.generation_time_s)
    ideal = TURNS * LATENCY_S + median.generation_time_s
    over_floor = median.wall_time_s / (floor_s + median.generation_time_s)
    _report(name, median.wall_time_s, ideal, f"   (best batch: {ratio:.2f}; env phases "
            f"{median.env_time_s * 1000:.1f} ms; ratio to its floor: {over_floor:.2f})")
    return median.wall_time_s


def bench_threads_floor(slots: tuple[int, int], repeats: int) -> float:
    """The env calls of a batch alone, on the collector's own worker threads: the in-process floor."""
    envs = [SleepyEnv() for _ in range(slots[0] * slots[1])]
    threads = WorkerThreads("floor")

    def batch() -> float:
        start = time.perf_counter()
        run_in_threads(threads, [partial(env.reset, seed) for seed, env in enumerate(envs)], None, "reset")
        for _ in range(TURNS):
            run_in_threads(threads, [partial(env.step, "5") for env in envs], None, "step")
        return time.perf_counter() - start

    batch()  # warm-up: start the threads
    wall = statistics.median(batch() for _ in range(repeats))
    threads.shutdown()
    _report("floor: env calls alone, on threads", wall, TURNS * LATENCY_S)
    return wall


async def _bare_round_trips(url: str, sessions: int, repeats: int) -> float:
    import aiohttp
    from ws_server import (  # bench/: the script's directory (agilerl serve
        RESET_FRAME,
        STEP_FRAME,
    )
    # loads this file by path, without it on sys.path, so not at the top)

    async with aiohttp.ClientSession() as http:
        sockets = [await http.ws_connect(f"{url}/ws", compress=0, autoping=False) for _ in range(sessions)]

        async def round_trip(ws: Any, frame: str) -> None:
            await ws.send_str(frame)
            json.loads((await ws.receive()).data)

        async def batch() -> float:
            start = time.perf_counter()
            await asyncio.gather(*(round_trip(ws, RESET_FRAME) for ws in sockets))
            for _ in range(TURNS):
                await asyncio.gather(*(round_trip(ws, STEP_FRAME) for ws in sockets))
            return time.perf_counter() - start

        await batch()  # warm-up
        walls = [await batch() for _ in range(repeats)]
        for ws in sockets:
            await ws.close()
    return statistics.median(walls)


def bench_websocket_floor(sessions: int, repeats: int) -> float:
    """A batch's round trips over bare aiohttp WebSockets, one per session: the remote floor."""
    with env_server(sessions, bare=True) as url:
        wall = asyncio.run(_bare_round_trips(url, sessions, repeats))
    _report("floor: bare WebSocket round trips", wall, TURNS * LATENCY_S)
    return wall


def bench_sequential(tokenizer: Any, slots: tuple[int, int]) -> float:
    """The same episodes played one after another, one harness per slot."""
    policy = ScriptedPolicy(tokenizer, "5")
    count = slots[0] * slots[1]
    harnesses = [RolloutHarness.local(SleepyEnv(), tokenizer) for _ in range(count)]
    params = SamplingParams(stop_token_ids=(harnesses[0].renderer.end_of_turn_id,))
    start = time.perf_counter()
    generation_s = 0.0
    for seed, harness in enumerate(harnesses):
        prompt, _ = harness.reset(seed)
        while not harness.done:
            t0 = time.perf_counter()
            completion = policy.generate([prompt], params)[0]
            generation_s += time.perf_counter() - t0
            prompt, *_ = harness.step(completion.token_ids)
    wall = time.perf_counter() - start
    _report(f"sequential loop ({count} slots)", wall, count * TURNS * LATENCY_S + generation_s)
    return wall


@contextmanager
def env_server(sessions: int, *, bare: bool = False) -> Iterator[str]:
    """``agilerl serve`` of ``SleepyEnv`` in its own process (as a real env server runs), or
    with ``bare`` bench/ws_server.py's echo server, sleeping as long before each step's answer."""
    port = free_port()  # outside the ephemeral range: nothing takes it while the server imports
    if bare:
        command = [sys.executable, str(Path(__file__).resolve().with_name("ws_server.py")), "--echo-server",
                   str(port), "--echo-step-latency-ms", str(LATENCY_S * 1000)]
    else:
        command = [sys.executable, "-m", "agilerl", "serve", f"{Path(__file__).resolve()}:SleepyEnv",
                   "--port", str(port), "--max-concurrent-envs", str(sessions)]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{url}/health", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or process.poll() is not None:
                    raise RuntimeError("the env server did not start") from None
                time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--no-remote", action="store_true", help="skip the remote-server setting")
    parser.add_argument("--latency-ms", type=float, help="env latency (default 20; or $BENCH_LATENCY_MS)")
    parser.add_argument("--fresh-observations", action="store_true",
                        help="a new observation text every turn (default: the same 'Too low!')")
    args = parser.parse_args()
    if args.fresh_observations:
        global FRESH
        FRESH = True
        os.environ["BENCH_FRESH_OBSERVATIONS"] = "1"
    if args.latency_ms is not None:
        global LATENCY_S
        LATENCY_S = args.latency_ms / 1000
        os.environ["BENCH_LATENCY_MS"] = str(args.latency_ms)
    slots = (args.batch_size, args.group_size)
    tokenizer = build_tiny_tokenizer("chatml")
    print(f"{slots[0]} x {slots[1]} slots, {TURNS} turns, env latency {LATENCY_S * 1000:.0f} ms, "
          f"{'fresh' if FRESH else 'repeated'} observations, median of {args.repeats}")
    threads_floor = bench_threads_floor(slots, args.repeats)
    in_process = bench_collector(
        "collector, in-process envs", SleepyEnv, tokenizer, slots, args.repeats, threads_floor
    )
    remote = None
    if not args.no_remote:
        websocket_floor = bench_websocket_floor(slots[0] * slots[1], args.repeats)
        with env_server(slots[0] * slots[1] + 1) as url:
            remote = bench_collector(
                "collector, remote envs (WebSocket)", lambda: RemoteEnvClient(url), tokenizer, slots,
                args.repeats, websocket_floor,
            )
    sequential = bench_sequential(tokenizer, slots)
    print(f"in-process collector vs sequential loop: {sequential / in_process:.1f}x faster")
    if remote is not None:
        print(f"remote collector vs sequential loop: {sequential / remote:.1f}x faster")


if __name__ == "__main__":
    main()
