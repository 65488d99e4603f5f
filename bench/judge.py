"""LLM-judge throughput with the concurrency cap against sequential calls, and the overhead a
rubric adds per sample; each ratio against a baseline measured in the same run.

Throughput: ``--samples`` distinct completions judged by ``llm_judge`` (a fresh judge per
setting, so no cache hit), once one call at a time (the judge a hand-written reward function
makes: a loop of blocking requests) and once from one thread per sample as the collector calls
it, at most ``--cap`` in flight. The endpoint is a loopback aiohttp server answering after
``--latency-ms`` (a hosted judge's round trip), or any OpenAI-compatible one (``--base-url``,
``--model``; e.g. ``vllm serve``, where concurrency also lets the server batch).

Overhead: microseconds per sample of ``Rubric.score`` around a rule (``exact_match``) against
calling the function, and of a three-entry ``CompositeRubric`` with a gate against the three
functions called and weighed by hand.

    python bench/judge.py [--samples 64] [--cap 16] [--latency-ms 50] [--base-url URL --model NAME]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Callable

from agilerl.concurrency import LoopThread, WorkerThreads, run_in_threads
from agilerl.data.composite import CompositeRubric, RubricEntry, RubricGate
from agilerl.data.judge import JUDGE_STATS
from agilerl.data.judges import LLMJudge
from agilerl.data.rubric import Rubric

PROMPT = "Question: {question}\nReference: {answer}\nResponse: {completion}\nGrade 0 to 10, the number only:"


class Endpoint:
    """A chat endpoint answering "7" after ``latency_s``, on its own loop thread."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.loop = LoopThread("bench-judge-endpoint")
        self.url = self.loop.run(self._start())

    async def _start(self) -> str:
        from aiohttp import web

        async def chat(request: web.Request) -> web.Response:
            await request.read()
            await asyncio.sleep(self.latency_s)
            return web.json_response({"choices": [{"message": {"content": "7"}}], "usage": {"total_tokens": 40}})

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()  # bound here: no port picked for later
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"

    def close(self) -> None:
        self.loop.run(self.runner.cleanup())
        self.loop.stop()


def judged(url: str, model: str, cap: int, samples: int, tag: str, *, at_once: bool, extra: dict | None = None) -> float:
    """Seconds to judge ``samples`` distinct completions (one thread per sample when ``at_once``)."""
    rubric = Rubric.bind(LLMJudge(
        PROMPT, base_url=url, model=model, max_concurrency=cap, max_tokens=4, retries=0, extra_body=extra, timeout_s=300,
    ))
    calls = [
        (lambda i=i: rubric.score(f"{tag} answer {i}", {"question": "2+2?", "answer": "4"}, {}, f"sample {i}"))
        for i in range(samples)
    ]
    JUDGE_STATS.take()
    t0 = time.perf_counter()
    if at_once:
        threads = WorkerThreads("bench-judge", min_workers=samples)
        try:
            results = run_in_threads(threads, calls, 600, "judge")
        finally:
            threads.shutdown()
    else:
        results = [call() for call in calls]
    elapsed = time.perf_counter() - t0
    failures = [r for r in results if isinstance(r, BaseException)]
    stats = JUDGE_STATS.take()
    if failures or stats["calls"] != samples or stats["failures"]:
        raise SystemExit(f"judge run failed: {failures[:1]} {stats}")
    return elapsed


def per_call_us(fn: Callable[[], object], repeats: int) -> float:
    """Median over 5 rounds of the mean microseconds per call."""
    rounds = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        rounds.append((time.perf_counter() - t0) / repeats * 1e6)
    return statistics.median(rounds)


def exact(completion: str, answer: str) -> float:
    return float(completion.strip() == answer)


def short(completion: str) -> float:
    return float(len(completion) < 40)


def polite(completion: str) -> dict[str, float]:
    return {"please": float("please" in completion), "thanks": float("thank" in completion)}


def overhead(repeats: int) -> None:
    row, info = {"question": "2+2?", "answer": "4"}, {}
    bare = per_call_us(lambda: exact("4", "4"), repeats)
    bound = Rubric.bind(exact)
    wrapped = per_call_us(lambda: bound.score("4", row, info, "row 0"), repeats)

    def by_hand() -> float:
        right, brief, manners = exact("4", "4"), short("4"), polite("4")
        return right + (0.2 * brief + 0.1 * sum(manners.values()) if right >= 1.0 else 0.0)

    composite = Rubric.bind(CompositeRubric(
        [RubricEntry("correct", Rubric.bind(exact)), RubricEntry("short", Rubric.bind(short), 0.2),
         RubricEntry("polite", Rubric.bind(polite), 0.1)],
        [RubricGate("correct", 1.0, ("short", "polite"))],
    ))
    assert composite.score("4", row, info, "row 0")[0] == by_hand()
    hand = per_call_us(by_hand, repeats)
    composed = per_call_us(lambda: composite.score("4", row, info, "row 0"), repeats)
    print(f"rule rubric: function {bare:.2f} us, Rubric.score {wrapped:.2f} us: +{wrapped - bare:.2f} us a sample ({wrapped / bare:.1f}x)")
    print(f"composite of 3 with a gate: by hand {hand:.2f} us, CompositeRubric {composed:.2f} us: "
          f"+{composed - hand:.2f} us a sample ({composed / hand:.1f}x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--cap", type=int, default=16)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint instead of the loopback one")
    parser.add_argument("--model", default="judge")
    parser.add_argument("--extra-body", type=json.loads, help="JSON merged into each request, e.g. "
                        '\'{"structured_outputs": {"choice": ["0", "5", "10"]}}\' for a random tiny model on vllm serve')
    parser.add_argument("--repeats", type=int, default=20000, help="calls per round of the overhead timing")
    args = parser.parse_args()

    endpoint = None if args.base_url else Endpoint(args.latency_ms / 1000)
    url = args.base_url or endpoint.url  # type: ignore[union-attr]
    where = args.base_url or f"loopback endpoint, {args.latency_ms:g} ms a call"
    try:
        judged(url, args.model, args.cap, 2, "warm-up", at_once=True, extra=args.extra_body)
        sequential = judged(url, args.model, 1, args.samples, "seq", at_once=False, extra=args.extra_body)
        capped = judged(url, args.model, args.cap, args.samples, "cap", at_once=True, extra=args.extra_body)
    finally:
        if endpoint is not None:
            endpoint.close()
    print(f"judge ({where}), {args.samples} distinct samples:")
    print(f"sequential calls: {sequential:.3f} s ({args.samples / sequential:.1f} judgements/s)")
    print(f"at most {args.cap} in flight: {capped:.3f} s ({args.samples / capped:.1f} judgements/s)")
    print(f"capped vs sequential: {sequential / capped:.2f}x the throughput")
    overhead(args.repeats)


if __name__ == "__main__":
    main()
