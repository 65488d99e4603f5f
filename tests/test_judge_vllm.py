"""The LLM judges against a real OpenAI-compatible endpoint: the tiny model under ``vllm serve`` in
``.venv-vllm`` (one server for the module), asked through vLLM's structured outputs so that a
random tiny model still answers in the judge's format."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agilerl.concurrency import WorkerThreads, run_in_threads
from agilerl.data.judge import JUDGE_STATS
from agilerl.data.judges import GroupJudge, LLMJudge
from agilerl.data.rubric import Rubric
from agilerl.train.metrics import judge_metrics
from tests.test_eval_openai import model_dir  # noqa: F401 - the tiny model's folder
from tests.vllm_serve import VLLMServe

KEY = "sk-vllm-judge-5b1e"
KEY_ENV = "AGILERL_TEST_VLLM_JUDGE_KEY"
PROMPT = "Question: {question}\nReference: {answer}\nResponse: {completion}\nGrade 0, 5 or 10:"


@pytest.fixture(scope="module")
def judge_url(vllm_venv, model_dir, tmp_path_factory) -> Iterator[str]:  # noqa: F811
    from tests.test_vllm import vllm_env

    log = tmp_path_factory.mktemp("judge") / "vllm.log"
    serve = VLLMServe(vllm_venv, model_dir[0], log, "--served-model-name", "tiny", "--max-model-len", "512",
                      "--api-key", KEY, env=vllm_env())
    try:
        yield serve.wait_healthy() + "/v1"
    finally:
        serve.stop()


@pytest.fixture(autouse=True)
def key(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    JUDGE_STATS.take()


def score_all(rubric, completions: list[str]) -> list[tuple[float, dict[str, float]]]:
    bound = Rubric.bind(rubric)
    threads = WorkerThreads("judge-vllm", min_workers=len(completions))
    try:
        calls = [lambda c=c: bound.score(c, {"question": "2+2?", "answer": "4"}, {}, "row 0") for c in completions]
        return run_in_threads(threads, calls, 300, "judge")
    finally:
        threads.shutdown()


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the first use builds .venv-vllm
def test_the_judge_scores_through_vllm_serve_and_repeats_come_from_the_cache(judge_url):
    judge = LLMJudge(
        PROMPT, base_url=judge_url, model="tiny", api_key_env=KEY_ENV, max_tokens=3, max_concurrency=4,
        extra_body={"structured_outputs": {"choice": ["0", "5", "10"]}}, failure_score=None,
    )
    completions = [f"It is {n}." for n in range(6)]
    first = score_all(judge, completions)
    assert all(not isinstance(r, BaseException) for r in first), first
    assert all(reward in (0.0, 0.5, 1.0) for reward, _ in first)
    metrics = judge_metrics()
    assert metrics["judge/calls"] == 6 and metrics["judge/failures"] == 0 and metrics["judge/cache_hits"] == 0
    assert metrics["judge/tokens"] > 6 * 20 and metrics["judge/latency_s"] > 0
    again = score_all(judge, completions)
    assert [r[0] for r in again] == [r[0] for r in first]
    metrics = judge_metrics()
    assert metrics["judge/calls"] == 0 and metrics["judge/cache_hits"] == 6


@pytest.mark.slow
def test_the_group_judge_ranks_one_group_through_vllm_serve(judge_url):
    judge = GroupJudge(
        base_url=judge_url, model="tiny", api_key_env=KEY_ENV, group_size=4, max_tokens=24, failure_score=None,
        extra_body={"structured_outputs": {"regex": r"\[(0|1)(, (0|1)){3}\]"}},
    )
    results = score_all(judge, ["Four.", "It is 4.", "5", "2+2 is 4"])
    assert all(not isinstance(r, BaseException) for r in results), results
    assert all(reward in (0.0, 1.0) for reward, _ in results)
    metrics = judge_metrics()
    assert metrics["judge/calls"] == 1 and metrics["judge/failures"] == 0


@pytest.mark.slow
def test_a_refused_key_is_a_counted_failure_that_never_shows_the_key(judge_url, monkeypatch):
    monkeypatch.setenv(KEY_ENV, "sk-wrong-one-e9d2")
    judge = LLMJudge(PROMPT, base_url=judge_url, model="tiny", api_key_env=KEY_ENV, retries=0, failure_score=None)
    (result,) = score_all(judge, ["4"])
    assert isinstance(result, Exception) and "HTTP 401" in str(result)
    assert "sk-wrong-one-e9d2" not in str(result) and KEY not in str(result)
    assert judge_metrics()["judge/failures"] == 1
