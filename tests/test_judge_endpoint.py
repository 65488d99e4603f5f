"""LLM judges against a small OpenAI-compatible aiohttp server on 127.0.0.1 that can stall, fail
and record: the timeout and the retries, the cap on calls in flight, the cache, the failure
policy and the outage that ends a run, the group judge on one group, the judge/ counters, and
the API key nowhere but the Authorization header."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from agilerl.assembly.env_factory import make_env_factory
from agilerl.concurrency import LoopThread, run_in_threads, WorkerThreads
from agilerl.data.judge import JUDGE_STATS
from agilerl.data.judges import GroupJudge, LLMJudge, parse_score, parse_scores
from agilerl.data.rubric import Rubric
from agilerl.errors import EnvUnavailable, JudgeUnavailable, ManifestError, RubricError
from agilerl.manifest.spec import load_manifest
from agilerl.rollout.collector import RolloutCollector
from agilerl.generation.policy import ScriptedPolicy
from agilerl.train.metrics import judge_metrics
from agilerl.ports import free_port

KEY = "sk-sentinel-7f3a9c"  # must never be seen anywhere but the Authorization header
KEY_ENV = "AGILERL_TEST_JUDGE_KEY"


class JudgeStub:
    """A chat endpoint whose reply is ``reply(prompt)``; ``mode`` = ok | stall | fail | echo-401.
    Records every request's Authorization header, its prompt, and the most requests in flight."""

    def __init__(self) -> None:
        self.mode = "ok"
        self.fail_first = 0
        self.delay_s = 0.0
        self.reply = lambda prompt: "Score: 7"
        self.prompts: list[str] = []
        self.auth: list[str | None] = []
        self.in_flight = self.most_in_flight = 0
        self._loop = LoopThread("judge-stub")
        self.url = self._loop.run(self._start()) + "/v1"

    async def _start(self) -> str:
        from aiohttp import web

        self._released = asyncio.Event()  # ends the stalled requests when the stub closes
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    async def _chat(self, request):
        from aiohttp import web

        body = await request.json()
        prompt = body["messages"][-1]["content"]
        self.prompts.append(prompt)
        self.auth.append(request.headers.get("Authorization"))
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            if self.mode == "stall":
                await self._released.wait()
            await asyncio.sleep(self.delay_s)
            if self.fail_first > 0:
                self.fail_first -= 1
                return web.Response(status=503, text="busy")
            if self.mode == "fail":
                return web.Response(status=500, text="internal error")
            if self.mode == "echo-401":  # a careless server that echoes the credentials it refused
                return web.Response(status=401, text=f"bad key: {request.headers.get('Authorization')}")
            reply = {"choices": [{"message": {"role": "assistant", "content": self.reply(prompt)}}],
                     "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}
            return web.json_response(reply)
        finally:
            self.in_flight -= 1

    def close(self) -> None:
        async def release() -> None:
            self._released.set()

        self._loop.run(release())
        self._loop.run(self._runner.cleanup())
        self._loop.stop()


@pytest.fixture(scope="module")
def stub() -> Iterator[JudgeStub]:
    served = JudgeStub()
    yield served
    served.close()


@pytest.fixture(autouse=True)
def fresh(stub, monkeypatch):
    stub.mode, stub.fail_first, stub.delay_s = "ok", 0, 0.0
    stub.reply = lambda prompt: "Score: 7"
    stub.prompts.clear()
    stub.auth.clear()
    stub.most_in_flight = 0
    monkeypatch.setenv(KEY_ENV, KEY)
    JUDGE_STATS.take()


def judge(stub, **options) -> LLMJudge:
    return LLMJudge("Q: {question}\nA: {completion}\nScore 0-10:", base_url=stub.url, model="stub", **options)


def score(rubric, completion="4", question="2+2?", answer="4"):
    return Rubric.bind(rubric).score(completion, {"question": question, "answer": answer}, {}, "row 0")


def test_a_judgement_is_read_from_the_reply_and_counted(stub):
    assert score(judge(stub))[0] == pytest.approx(0.7)
    assert stub.prompts == ["Q: 2+2?\nA: 4\nScore 0-10:"]
    metrics = judge_metrics()
    assert metrics["judge/calls"] == 1 and metrics["judge/failures"] == 0 and metrics["judge/tokens"] == 12
    assert metrics["judge/latency_s"] > 0 and metrics["judge/cache_hits"] == 0


def test_labels_score_by_the_last_label_named():
    labels = {"correct": 1.0, "incorrect": 0.0, "partial": 0.5}
    assert parse_score("Not incorrect... it is correct", labels, (0, 1)) == 1.0
    assert parse_score("Partially right: PARTIAL", labels, (0, 1)) == 0.5
    assert parse_score("no idea", labels, (0, 1)) is None
    assert parse_score("8/10 then 12", None, (0, 10)) == 1.0  # the last number, clamped
    assert parse_scores("scores: [0.1, 1, 0.5]", 3, (0, 1)) == [0.1, 1.0, 0.5]
    assert parse_scores("[0.1, 1]", 3, (0, 1)) is None


def test_a_repeated_prompt_is_served_from_the_cache_and_shared_while_in_flight(stub):
    stub.delay_s = 0.3
    rubric = judge(stub)
    threads = WorkerThreads("judge-test", min_workers=4)
    try:
        results = run_in_threads(threads, [lambda: score(rubric)] * 4, 30, "score")
    finally:
        threads.shutdown()
    assert [r[0] for r in results] == [pytest.approx(0.7)] * 4
    assert score(rubric)[0] == pytest.approx(0.7)
    assert len(stub.prompts) == 1
    metrics = judge_metrics()
    assert metrics["judge/calls"] == 1 and metrics["judge/cache_hits"] == 4
    score(rubric, completion="5")  # another prompt: another call
    assert len(stub.prompts) == 2


def test_calls_in_flight_never_exceed_the_cap(stub):
    stub.delay_s = 0.5  # long enough for the six threads to be waiting at once on a busy host
    rubric = judge(stub, max_concurrency=2)
    threads = WorkerThreads("judge-test", min_workers=6)
    try:
        run_in_threads(threads, [lambda i=i: score(rubric, completion=str(i)) for i in range(6)], 30, "score")
    finally:
        threads.shutdown()
    assert len(stub.prompts) == 6 and stub.most_in_flight == 2


def test_a_stalled_call_times_out_and_is_retried_then_scored_by_the_failure_policy(stub):
    stub.mode = "stall"
    started = time.monotonic()
    assert score(judge(stub, timeout_s=0.3, retries=1, backoff_s=0.05, failure_score=0.25))[0] == 0.25
    assert time.monotonic() - started < 10
    assert len(stub.prompts) == 2  # the first attempt and one retry
    metrics = judge_metrics()
    assert metrics["judge/calls"] == 2 and metrics["judge/failures"] == 1


def test_a_busy_endpoint_is_retried_with_backoff_until_it_answers(stub):
    stub.fail_first = 2
    assert score(judge(stub, retries=2, backoff_s=0.01))[0] == pytest.approx(0.7)
    assert len(stub.prompts) == 3 and judge_metrics()["judge/failures"] == 0


def test_with_failure_score_null_the_episode_fails_instead(stub):
    stub.mode = "fail"
    with pytest.raises(RubricError, match="HTTP 500"):
        score(judge(stub, retries=0, failure_score=None))


def test_an_unparseable_reply_is_a_counted_failure(stub):
    stub.reply = lambda prompt: "I would rather not say."
    assert score(judge(stub, failure_score=0.0))[0] == 0.0
    assert judge_metrics()["judge/failures"] == 1


def test_a_judge_failing_every_call_for_give_up_after_s_ends_the_run_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    rubric = LLMJudge(base_url=url, model="m", retries=0, give_up_after_s=0.3)
    assert score(rubric, completion="a")[0] == 0.0  # one failure is one sample's
    time.sleep(0.4)
    with pytest.raises(JudgeUnavailable, match=rf"the judge at {url}/chat/completions failed every call for") as caught:
        score(rubric, completion="b")
    assert isinstance(caught.value, EnvUnavailable)  # what the collector stops the run on


def test_the_group_judge_ranks_one_group_in_one_call(stub, folder, chatml_tokenizer):
    scores = [0.1, 0.9, 0.5, 1.0]
    stub.reply = lambda prompt: f"Scores: {json.dumps(scores)}"
    manifest = load_manifest(write(folder, training={"group_size": 4}, rubrics=[{
        "name": "rank", "rubric": "llm_judge_group",
        "config": {"base_url": stub.url, "model": "stub", "group_size": 4},
    }]))
    factory = make_env_factory(manifest.environment, base_dir=manifest.base_dir)
    words = iter(["alpha", "beta", "gamma", "delta"])
    policy = ScriptedPolicy(chatml_tokenizer, reply=lambda prompt: next(words))
    with RolloutCollector(factory, chatml_tokenizer, batch_size=1, group_size=4, seed=0) as collector:
        batch = collector.collect(policy)
    assert len(stub.prompts) == 1 and judge_metrics()["judge/calls"] == 1
    prompt = stub.prompts[0]
    assert all(f"Response {i}:" in prompt for i in range(1, 5)) and "Response 5" not in prompt
    listed = sorted(("alpha", "beta", "gamma", "delta"), key=prompt.index)  # the order the judge saw
    for traj, word in zip(batch.trajectories, ("alpha", "beta", "gamma", "delta")):  # slot i replied words[i]
        assert traj.total_reward == scores[listed.index(word)]
        assert traj.info["reward_components"] == {"rank": scores[listed.index(word)]}


def test_a_group_judge_sized_unlike_the_runs_groups_is_refused_naming_both(folder):
    rubrics = [{"name": "rank", "rubric": "llm_judge_group", "config": {"base_url": "http://127.0.0.1:9/v1", "model": "m", "group_size": 4}}]
    with pytest.raises(ManifestError, match=r"rubrics\[0\] \(rank\): llm_judge_group's config.group_size 4 is not training.group_size 8.*group_size: 8"):
        load_manifest(write(folder, rubrics=rubrics))


def test_a_group_short_of_members_is_judged_after_gather_s(stub):
    stub.reply = lambda prompt: "[0.3, 0.8]"
    rubric = GroupJudge(base_url=stub.url, model="stub", group_size=4, gather_s=1.0)
    threads = WorkerThreads("judge-test", min_workers=2)
    try:
        results = run_in_threads(threads, [lambda c=c: score(rubric, completion=c) for c in ("x", "y")], 30, "score")
    finally:
        threads.shutdown()
    assert sorted(r[0] for r in results) == [0.3, 0.8] and len(stub.prompts) == 1


def test_the_api_key_is_sent_and_never_seen_in_errors_logs_metrics_or_transcripts(stub, folder, caplog, tmp_path):
    caplog.set_level(logging.DEBUG)
    manifest = load_manifest(write(folder, rubrics=[
        {"name": "judge", "rubric": "llm_judge", "config": {"base_url": stub.url, "model": "stub", "api_key_env": KEY_ENV, "retries": 0}},
    ]))
    assert KEY not in manifest.model_dump_json()
    env = make_env_factory(manifest.environment, base_dir=manifest.base_dir)()
    seen = [repr(env.data.rubric), repr(env.data.rubric.fn)]
    for mode in ("ok", "echo-401"):
        stub.mode = mode
        env.reset(row_index=0)
        seen.append(repr(env.step(f"answer {mode}")))
    stub.mode = "echo-401"
    with pytest.raises(RubricError) as caught:
        score(judge(stub, api_key_env=KEY_ENV, retries=0, failure_score=None))
    seen += [str(caught.value), repr(caught.value), json.dumps(judge_metrics()), caplog.text]
    assert stub.auth and all(a == f"Bearer {KEY}" for a in stub.auth)  # it was sent...
    assert "bad key: Bearer ***" in str(caught.value)  # ...the endpoint echoed it, and it was scrubbed
    stub.mode, stub.reply = "ok", lambda prompt: f"I cannot judge this, my key is {KEY}"  # a 200 echoing it
    try:
        with pytest.raises(RubricError) as unscored:
            score(judge(stub, api_key_env=KEY_ENV, retries=0, failure_score=None))
    finally:
        stub.reply = lambda prompt: "Score: 7"
    assert "holds no score" in str(unscored.value) and "my key is ***" in str(unscored.value)
    seen += [str(unscored.value), caplog.text]
    assert not [text for text in seen if KEY in text]


def test_a_missing_key_variable_is_named_without_a_value(stub, monkeypatch):
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(RubricError, match=f"api_key_env '{KEY_ENV}': that environment variable is not set"):
        judge(stub, api_key_env=KEY_ENV)


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"prompt": "{question} {reply}"}, r"unknown placeholder\(s\) \{reply\}"),
        ({"score_range": [5, 1]}, "score_range must be"),
        ({"max_concurrency": 0}, "max_concurrency >= 1"),
        ({"base_url": "localhost:8000"}, "must start with http"),
        ({"api_key": KEY}, "'api_key' would put the key in the manifest; .* api_key_env"),
    ],
)
def test_judge_settings_are_checked_when_built(options, words):
    with pytest.raises(RubricError, match=words):
        LLMJudge(**{"base_url": "http://127.0.0.1:1/v1", "model": "m", **options})


def test_the_judge_names_a_template_column_the_dataset_lacks(stub, folder):
    with pytest.raises(RubricError, match=r"uses \{answer\} but the dataset has no 'answer' column"):
        load_env(folder, columns={"answer": "target"}, rubrics=[
            {"name": "j", "rubric": "llm_judge", "config": {"base_url": stub.url, "model": "stub"}}])


# -- helpers --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("judged")
    pq.write_table(pa.table({"question": ["2+2?", "3+3?"], "answer": ["4", "6"]}), folder / "qa.parquet")
    return folder


def write(folder, name="m.yaml", training=None, **environment):
    env = {"env_type": "rollout", "dataset": "qa.parquet", "train_test_split": 0.5, **environment}
    path = folder / name
    path.write_text(yaml.safe_dump({"environment": env, **({"training": training} if training else {})}))
    return path


def load_env(folder, **environment):
    manifest = load_manifest(write(folder, **environment))
    return make_env_factory(manifest.environment, base_dir=manifest.base_dir)()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_training_run_logs_every_component_and_the_judge_counters_every_step(stub, folder, tmp_path, capsys):
    from agilerl.cli.main import main
    from agilerl.train.metrics import read_metrics

    path = folder / "train.yaml"
    path.write_text(yaml.safe_dump({
        "environment": {"env_type": "rollout", "dataset": "qa.parquet", "train_test_split": 0.5, "rubrics": [
            {"name": "exact", "rubric": "exact_match", "weight": 1.0},
            {"name": "judge", "rubric": "llm_judge", "weight": 0.5,
             "config": {"base_url": stub.url, "model": "stub", "api_key_env": KEY_ENV}},
        ]},
        "model": {"name_or_path": "tiny"},
        "algorithm": {"name": "grpo"},
        "training": {"batch_size": 1, "group_size": 2, "max_steps": 2, "max_new_tokens": 4, "seed": 0},
    }))
    code = main(["train", str(path), "--output-dir", str(tmp_path / "run"), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    rows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["step"] > 0]
    assert len(rows) == 2
    for row in rows:
        assert row["reward/judge"] == pytest.approx(0.7) and "reward/exact" in row
        assert row["train/reward"] == pytest.approx(row["reward/exact"] + 0.5 * row["reward/judge"])
        assert {"judge/calls", "judge/failures", "judge/cache_hits", "judge/latency_s", "judge/tokens"} <= set(row)
        # the step's 2 samples, and the evaluation (one held-out row) since the last row, if any
        assert row["judge/calls"] + row["judge/cache_hits"] in (2, 3) and row["judge/failures"] == 0
        assert row["judge/tokens"] == 12 * row["judge/calls"] and row["judge/latency_s"] > 0
    assert KEY not in (tmp_path / "run" / "metrics.jsonl").read_text()


def test_a_collection_stops_on_a_judge_outage_and_goes_on_through_one_failure(folder, chatml_tokenizer):
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    manifest = load_manifest(write(folder, "outage.yaml", rubrics=[
        {"name": "judge", "rubric": "llm_judge", "config": {"base_url": url, "model": "m", "retries": 0, "give_up_after_s": 0.3}},
    ]))
    factory = make_env_factory(manifest.environment, base_dir=manifest.base_dir)
    replies = iter(str(n) for n in range(100))  # distinct completions: one judgement each
    policy = ScriptedPolicy(chatml_tokenizer, reply=lambda prompt: next(replies))
    with RolloutCollector(factory, chatml_tokenizer, batch_size=1, group_size=2, seed=0) as collector:
        batch = collector.collect(policy)
        assert [t.total_reward for t in batch.trajectories] == [0.0, 0.0]  # failure_score, counted
        assert judge_metrics()["judge/failures"] == 2
        time.sleep(0.4)
        with pytest.raises(JudgeUnavailable, match=f"the judge at {url}/chat/completions failed every call"):
            collector.collect(policy)
