"""Agent programs as envs: a real OpenAI-client program against the served tiny model. Its
completions are exactly the trained tokens, its samples split where it rewrites its history, and
a crashing, hanging or failing program costs only its own episode."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
import warnings
from pathlib import Path

import pytest

from agilerl.agents import AgentCollector, AgentEndpoint, CommandAgent, FunctionAgent
from agilerl.agents.metrics import agent_metrics
from agilerl.agents.programs import reward_of
from agilerl.chat import ChatRenderer
from agilerl.data.rubric import Rubric
from agilerl.errors import AgileRLWarning, CollectionError
from agilerl.generation.policy import Generation, SamplingParams, ScriptedPolicy, TransformersPolicy
from agilerl.generation.versioned import VersionedPolicy

# An agent as people write them: the OpenAI client in a loop. It answers, checks itself (the
# history extended: one sample), compacts (a rewritten history: a new sample, streamed) and goes
# on; what it was given is logged for the test, its reward is its last stdout line.
COMPACTING_AGENT = """
import json, os, sys
from openai import OpenAI

client = OpenAI()
task = json.loads(os.environ["AGILERL_TASK"])
system = {"role": "system", "content": "Answer briefly."}
messages = [system, {"role": "user", "content": f"What is {task['seed'] % 10} plus one?"}]
first = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6)
messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Check it."}]
second = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, logprobs=True, temperature=0.5)
summary = [system, {"role": "user", "content": "Summary: " + (second.choices[0].message.content or "")}]
third = "".join(
    chunk.choices[0].delta.content or ""
    for chunk in client.chat.completions.create(model="tiny", messages=summary, max_tokens=6, stream=True)
    if chunk.choices
)
summary += [{"role": "assistant", "content": third}, {"role": "user", "content": "Go on."}]
fourth = client.chat.completions.create(model="tiny", messages=summary, max_tokens=6)
log = {
    "contents": [first.choices[0].message.content, second.choices[0].message.content, third,
                 fourth.choices[0].message.content],
    "tokens": [t.token for t in second.choices[0].logprobs.content],
}
(__import__("pathlib").Path(os.environ["AGENT_LOG"]) / (os.environ["AGILERL_EPISODE"] + ".json")).write_text(json.dumps(log))
print("some chatter")
print(json.dumps({"reward": len(log["contents"][3]) % 2, "components": {"length": len(log["contents"][3])}}))
"""

# A program without the OpenAI client: one call with urllib, then what its task's row says.
ROW_AGENT = """
import json, os, subprocess, sys, time, urllib.request

task = json.loads(os.environ["AGILERL_TASK"])
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).encode()
request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, headers={
    "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
urllib.request.urlopen(request, timeout=60).read()
if task["mode"] == "crash":
    print("boom-crash", file=sys.stderr)
    sys.exit(3)
if task["mode"] == "hang":
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["AGENT_LOG"] + "/child.pid", "w") as f:
        f.write(str(child.pid))
    time.sleep(600)
if task["mode"] == "silent":
    sys.exit(0)
print(json.dumps({"reward": 1.0}))
"""


def _program(tmp_path: Path, code: str, name: str = "agent.py") -> list[str]:
    path = tmp_path / name
    path.write_text(textwrap.dedent(code))
    return [sys.executable, str(path)]


def _spans(sample) -> list[list[int]]:
    """The runs of trained (generated) token ids, in order."""
    spans: list[list[int]] = []
    previous = False
    for token, trained in zip(sample.token_ids, sample.action_mask):
        if trained and not previous:
            spans.append([])
        if trained:
            spans[-1].append(token)
        previous = trained
    return spans


def _ended(pid: int) -> bool:
    """Whether ``pid`` has died (gone, or a zombie nobody reaps); a killed process on a busy host
    may take a moment to get there."""
    status = Path(f"/proc/{pid}/status")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if "zombie" in status.read_text():
                return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture()
def agent_log(tmp_path, monkeypatch):
    folder = tmp_path / "log"
    folder.mkdir()
    monkeypatch.setenv("AGENT_LOG", str(folder))
    return folder


def test_an_openai_client_program_trains_on_exactly_its_completions_split_where_it_compacts(
    tiny_model, chatml_tokenizer, tmp_path, agent_log
):
    agent = CommandAgent(_program(tmp_path, COMPACTING_AGENT))
    with AgentCollector(
        agent, chatml_tokenizer, batch_size=2, group_size=2, seed=0, sampling=SamplingParams(max_new_tokens=8)
    ) as collector, pytest.warns(match="temperature"):
        batch = collector.collect(TransformersPolicy(tiny_model, chatml_tokenizer))
    renderer = ChatRenderer(chatml_tokenizer)
    for episode in batch.trajectories:
        assert episode.error is None
        log = json.loads((agent_log / f"{episode.episode}.json").read_text())  # AGILERL_EPISODE
        # one sample per history: the answer and its check, then the compacted conversation
        assert len(episode.samples) == 2 and episode.prior_samples[0].episode == episode.episode
        spans = [span for sample in episode.samples for span in _spans(sample)]
        assert [renderer.decode(span) for span in spans] == log["contents"]  # streamed one included
        # the very ids: the second call's tokens as its logprobs named them
        assert chatml_tokenizer.convert_ids_to_tokens(spans[1]) == log["tokens"]
        assert [max(s.turn_ids) for s in episode.samples] == [1, 3]
        assert episode.rewards == [0.0, 0.0, 0.0, float(len(log["contents"][3]) % 2)]
        assert episode.info["reward_components"] == {"length": float(len(log["contents"][3]))}
        assert episode.versions is None  # a plain policy reports none
    metrics = agent_metrics(batch.trajectories)
    assert metrics["agent/calls"] == 16 and metrics["agent/samples_per_episode"] == 2
    assert metrics["agent/failures"] == 0 and metrics["agent/call_s"] > 0


def _post(url: str, body: dict, key: str) -> tuple[int, dict]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}") if exc.code != 413 else {}


def test_each_episode_has_its_own_key_and_any_other_gets_401(chatml_tokenizer):
    import openai

    endpoint = AgentEndpoint(chatml_tokenizer, model_name="tiny")
    try:
        episode = endpoint.open_episode("e1", VersionedPolicy(ScriptedPolicy(chatml_tokenizer, "42")), SamplingParams())
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=episode.key)
        assert [m.id for m in client.models.list()] == ["tiny"]
        reply = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert reply.choices[0].message.content == "42" and reply.choices[0].finish_reason == "stop"
        for key in ("wrong", ""):
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=endpoint.base_url, api_key=key or "x").chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": "hi"}]
                )
        endpoint.close_episode(episode)  # its episode has ended: the key with it
        with pytest.raises(openai.AuthenticationError):
            client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}])
        assert episode.calls == 1
    finally:
        endpoint.close()


def test_tool_calls_come_back_as_openai_tool_calls_and_results_go_through_the_template(chatml_tokenizer):
    import openai

    def reply(prompt) -> str:
        text = chatml_tokenizer.decode(list(prompt))
        if "<|im_start|>tool" in text:
            return "it is 3"
        return '<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>'

    tools = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
    endpoint = AgentEndpoint(chatml_tokenizer, tool_parser="hermes")
    try:
        stops = SamplingParams(stop_token_ids=(endpoint.renderer.end_of_turn_id,))
        episode = endpoint.open_episode("e1", VersionedPolicy(ScriptedPolicy(chatml_tokenizer, reply)), stops)
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=episode.key)
        messages = [{"role": "user", "content": "1 + 2?"}]
        first = client.chat.completions.create(model="m", messages=messages, tools=tools)
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls"
        assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 1, "b": 2}
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": "3"}]
        second = client.chat.completions.create(model="m", messages=messages, tools=tools)
        assert second.choices[0].message.content == "it is 3"
        (sample,) = episode.trajectories()  # the tool result extended the conversation
        first_end = sample.action_mask.index(False, sample.action_mask.index(True))
        second_start = sample.action_mask.index(True, first_end)
        assert chatml_tokenizer.decode(sample.token_ids[first_end:second_start]) == (
            "\n<|im_start|>tool\n3<|im_end|>\n<|im_start|>assistant\n"  # the model's own <|im_end|> kept
        )
        # a call the parser cannot read comes back as the text the model wrote (as vLLM answers
        # it), never as a call with made-up arguments; a call to an unknown tool is the program's
        for written, calls in (('<tool_call>\n{"name": "add", "arguments": {"a": 1\n</tool_call>', None),
                               ('<tool_call>\n{"name": "add", "arguments": "a=1"}\n</tool_call>', None),
                               ('<tool_call>\n{"name": "sub", "arguments": {"a": 1}}\n</tool_call>', "sub")):
            broken = endpoint.open_episode(written, VersionedPolicy(ScriptedPolicy(chatml_tokenizer, written)), stops)
            answer = openai.OpenAI(base_url=endpoint.base_url, api_key=broken.key).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "1 + 2?"}], tools=tools).choices[0]
            if calls is None:
                assert answer.message.tool_calls is None and answer.message.content == written
                assert answer.finish_reason == "stop"
            else:
                assert [c.function.name for c in answer.message.tool_calls] == [calls]
        # malformed tools are the request's 400, before generating (after, the error stopped the run)
        status, body = _post(endpoint.base_url + "/chat/completions",
                             {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, broken.key)
        assert status == 400 and "invalid tools: tools[0].function must be an object" in body["error"]["message"]
        assert endpoint.generation_error is None
    finally:
        endpoint.close()


class _HeldPolicy:
    """Generates only once the test lets it: a call can be held in flight."""

    def __init__(self, tokenizer) -> None:
        self.inner = ScriptedPolicy(tokenizer, "ok")
        self.entered = threading.Event()
        self.release = threading.Event()

    def generate(self, prompts, params) -> list[Generation]:
        self.entered.set()
        assert self.release.wait(60)
        return self.inner.generate(prompts, params)


def test_the_endpoint_bounds_request_size_and_calls_per_episode(chatml_tokenizer):
    endpoint = AgentEndpoint(chatml_tokenizer, max_request_bytes=2048, max_concurrent_calls=1)
    held = _HeldPolicy(chatml_tokenizer)
    try:
        episode = endpoint.open_episode("e1", VersionedPolicy(held), SamplingParams())
        url = endpoint.base_url + "/chat/completions"
        big = {"messages": [{"role": "user", "content": "x" * 4096}]}
        assert _post(url, big, episode.key)[0] == 413
        status, body = _post(url, {"messages": [{"role": "user", "content": "hi"}], "n": 2}, episode.key)
        assert status == 400 and "less than or equal to 1" in body["error"]["message"]
        first: dict = {}
        thread = threading.Thread(target=lambda: first.update(r=_post(url, {"messages": [{"role": "user", "content": "a"}]}, episode.key)))
        thread.start()
        deadline = time.monotonic() + 30
        while episode.in_flight == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        status, body = _post(url, {"messages": [{"role": "user", "content": "b"}]}, episode.key)
        assert status == 429 and "max_concurrent_calls 1" in body["error"]["message"]
        held.release.set()
        thread.join(60)
        assert first["r"][0] == 200 and episode.calls == 1
    finally:
        held.release.set()
        endpoint.close()


class _BatchSizes:
    """A scripted policy that keeps the size of every batch it is given."""

    def __init__(self, tokenizer) -> None:
        self.inner = ScriptedPolicy(tokenizer, "ok")
        self.sizes: list[int] = []

    def generate(self, prompts, params) -> list[Generation]:
        self.sizes.append(len(prompts))
        return self.inner.generate(prompts, params)


def test_calls_of_live_episodes_that_keep_arriving_are_one_batch(chatml_tokenizer):
    # five programs call 80 ms apart: 320 ms from first to last, past the 250 ms wait, yet each
    # within it of the one before (as programs answered by one batch come back one by one)
    endpoint = AgentEndpoint(chatml_tokenizer, batch_wait_s=0.25)
    policy = _BatchSizes(chatml_tokenizer)
    episodes = [endpoint.open_episode(f"e{i}", policy, SamplingParams()) for i in range(5)]
    url = endpoint.base_url + "/chat/completions"
    start = threading.Barrier(5)
    statuses: list[int] = []

    def program(i: int) -> None:
        messages = [{"role": "user", "content": f"hi {i}"}]
        for _ in range(2):
            start.wait(30)
            time.sleep(0.08 * i)
            status, body = _post(url, {"messages": messages}, episodes[i].key)
            statuses.append(status)
            messages += [body["choices"][0]["message"], {"role": "user", "content": "more"}]

    try:
        threads = [threading.Thread(target=program, args=(i,)) for i in range(5)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        endpoint.close()
    assert statuses == [200] * 10 and policy.sizes == [5, 5]


def test_completions_extend_their_text_as_one_sample_and_honour_max_tokens(chatml_tokenizer):
    endpoint = AgentEndpoint(chatml_tokenizer)
    try:
        policy = VersionedPolicy(ScriptedPolicy(chatml_tokenizer, " one two three four"), version=7)
        episode = endpoint.open_episode("e1", policy, SamplingParams(max_new_tokens=16))
        url = endpoint.base_url + "/completions"
        status, first = _post(url, {"prompt": "Count:", "max_tokens": 2, "logprobs": 1}, episode.key)
        assert status == 200 and first["choices"][0]["finish_reason"] == "length"
        text = first["choices"][0]["text"]
        assert len(first["choices"][0]["logprobs"]["tokens"]) == 2
        status, second = _post(url, {"prompt": "Count:" + text + " more", "max_tokens": 50}, episode.key)
        assert status == 200
        (sample,) = episode.trajectories()
        spans = _spans(sample)
        assert [len(s) for s in spans] == [2, len(chatml_tokenizer.encode(" one two three four", add_special_tokens=False))]
        assert sample.versions == [7 if m else -1 for m in sample.action_mask]  # each token's weights
    finally:
        endpoint.close()


def test_completions_take_token_ids_and_return_them_exactly_as_trained(chatml_tokenizer):
    """Token in, token out (vLLM's prompt of ids and ``return_token_ids``): a program that keeps
    tokens sends back the ids it was given, plus its own, and the sample grows by exactly those."""
    endpoint = AgentEndpoint(chatml_tokenizer)
    try:
        episode = endpoint.open_episode("e1", VersionedPolicy(ScriptedPolicy(chatml_tokenizer, " one two")), SamplingParams())
        url = endpoint.base_url + "/completions"
        prompt = chatml_tokenizer.encode("Count:", add_special_tokens=False)
        status, first = _post(url, {"prompt": prompt, "return_token_ids": True}, episode.key)
        choice = first["choices"][0]
        assert status == 200 and choice["prompt_token_ids"] == prompt and choice["token_ids"]
        mine = chatml_tokenizer.encode(" and", add_special_tokens=False)
        again = choice["prompt_token_ids"] + choice["token_ids"] + mine
        request = urllib.request.Request(url, data=json.dumps({"prompt": [again], "return_token_ids": True, "stream": True}).encode(),
                                         headers={"Authorization": f"Bearer {episode.key}"})
        with urllib.request.urlopen(request, timeout=60) as response:
            events = [json.loads(line[6:]) for line in response.read().decode().splitlines() if line.startswith("data: {")]
        second = events[0]["choices"][0]  # streamed: the ids come with the first chunk
        assert second["prompt_token_ids"] == again and "".join(e["choices"][0]["text"] for e in events) == second["text"]
        (sample,) = episode.trajectories()  # one sample: the ids extend the first call's exactly
        assert sample.token_ids == again + second["token_ids"]
        assert _spans(sample) == [choice["token_ids"], second["token_ids"]]
        chat = endpoint.open_episode("e2", VersionedPolicy(ScriptedPolicy(chatml_tokenizer, "hi")), SamplingParams())
        status, reply = _post(endpoint.base_url + "/chat/completions",
                              {"messages": [{"role": "user", "content": "hello"}], "return_token_ids": True}, chat.key)
        (sample,) = chat.trajectories()
        assert status == 200 and reply["prompt_token_ids"] + reply["choices"][0]["token_ids"] == sample.token_ids
    finally:
        endpoint.close()


@pytest.mark.parametrize("prompt, says", [
    ("", "the prompt is empty"), ([], "the prompt is empty"), ([[]], "the prompt is empty"),
    ([5, 10**9], "token id 1000000000 is not in the tokenizer's vocabulary"), ([-1], "token id -1"),
])
def test_a_prompt_the_model_cannot_take_is_a_400_and_the_run_goes_on(chatml_tokenizer, prompt, says):
    endpoint = AgentEndpoint(chatml_tokenizer)
    try:
        episode = endpoint.open_episode("e1", VersionedPolicy(ScriptedPolicy(chatml_tokenizer, "ok")), SamplingParams())
        status, body = _post(endpoint.base_url + "/completions", {"prompt": prompt}, episode.key)
        assert status == 400 and says in body["error"]["message"]
        assert endpoint.generation_error is None and episode.calls == 0  # not the model's fault: no stop
    finally:
        endpoint.close()


def test_crashing_hanging_and_silent_programs_cost_only_their_own_episode(chatml_tokenizer, tmp_path, agent_log, caplog):
    rows = [{"mode": "ok"}, {"mode": "crash"}, {"mode": "hang"}, {"mode": "silent"}]
    agent = CommandAgent(_program(tmp_path, ROW_AGENT))
    with AgentCollector(
        agent, chatml_tokenizer, batch_size=4, group_size=1, seed=0, train_rows=rows, episode_timeout_s=8,
        failure_score=-1.0,
    ) as collector:
        batch = collector.collect(VersionedPolicy(ScriptedPolicy(chatml_tokenizer, "hi")))
    by_mode = {rows[t.row_index]["mode"]: t for t in batch.trajectories}
    assert by_mode["ok"].rewards == [1.0] and by_mode["ok"].error is None
    for mode, why in (("crash", "exit code 3"), ("hang", "timeout"), ("silent", "no reward line")):
        assert by_mode[mode].error is None and by_mode[mode].rewards == [-1.0], mode  # trained at failure_score
        assert why in by_mode[mode].info["agent_failure"]
    assert agent_metrics(batch.trajectories)["agent/failures"] == 3
    assert sum("boom-crash" in r.getMessage() for r in caplog.records) == 1  # the stderr tail, logged once
    assert _ended(int((agent_log / "child.pid").read_text()))  # the hung program's whole group was killed


def test_a_run_whose_programs_all_fail_ends_naming_the_command_and_its_stderr(chatml_tokenizer, tmp_path):
    command = _program(tmp_path, "import sys\nprint('no luck here', file=sys.stderr)\nsys.exit(2)\n", "broken.py")
    with AgentCollector(CommandAgent(command), chatml_tokenizer, batch_size=2, group_size=2, seed=0,
                        give_up_after_s=0.001) as collector:
        with pytest.raises(CollectionError, match=r"(?s)broken\.py.*exit code 2.*no luck here"):
            collector.collect(VersionedPolicy(ScriptedPolicy(chatml_tokenizer, "hi")))


def test_python_agents_sync_or_async_and_rubrics_for_those_that_report_no_reward(chatml_tokenizer):
    import openai

    def sync_agent(task, base_url, api_key):
        reply = openai.OpenAI(base_url=base_url, api_key=api_key).chat.completions.create(
            model="m", messages=[{"role": "user", "content": str(task["seed"])}])
        return {"reward": 2.0, "components": {"said": float(reply.choices[0].message.content == "hello")}}

    async def async_agent(task, base_url, api_key):
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "b"}])  # a new sample
        return None  # the rubric scores the final conversation

    policy = VersionedPolicy(ScriptedPolicy(chatml_tokenizer, "hello"), version=3)
    with AgentCollector(FunctionAgent(sync_agent), chatml_tokenizer, batch_size=1, group_size=2, seed=0) as collector:
        batch = collector.collect(policy)
    assert [t.rewards for t in batch.trajectories] == [[2.0], [2.0]]
    assert batch.trajectories[0].info["reward_components"] == {"said": 1.0}
    rubric = Rubric.bind(lambda completion, info: float(len(info["messages"]) + (completion == "hello")))
    with AgentCollector(FunctionAgent(async_agent, needs_reward=False), chatml_tokenizer, batch_size=1,
                        group_size=2, seed=0, rubric=rubric) as collector:
        batch = collector.collect(policy)
    for episode in batch.trajectories:
        assert episode.rewards == [0.0, 3.0] and len(episode.samples) == 2
        for sample in episode.samples:  # async: every generated token carries its weights' version
            assert sample.versions == [3 if m else -1 for m in sample.action_mask]


AGENT_MANIFEST = """
environment:
  env_type: rollout
  agent_command: [{python}, agent.py]
  episode_timeout_s: 120
model: {{name_or_path: tiny}}
algorithm: {{name: grpo}}
training: {{batch_size: 2, group_size: 2, max_steps: 2, max_new_tokens: 6, evaluation_interval: 0,
           rollout_mode: {mode}, output_dir: {out}}}
"""


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_manifest_trains_an_agent_program_and_logs_its_metrics(tmp_path, agent_log, mode):
    from agilerl.assembly.from_manifest import train_from_manifest
    from agilerl.manifest.spec import load_manifest

    _program(tmp_path, COMPACTING_AGENT)
    (tmp_path / "m.yaml").write_text(AGENT_MANIFEST.format(python=json.dumps(sys.executable), mode=mode, out=tmp_path / "run"))
    result = train_from_manifest(load_manifest(tmp_path / "m.yaml"), show_progress=False)
    assert result.step == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "agent/calls" in r]
    assert len(steps) == 2 and all(r["agent/calls"] == 16 and r["agent/samples_per_episode"] == 2 for r in steps)
    records = [json.loads(line) for line in (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()]
    given = {path.stem for path in agent_log.glob("*.json")}  # the ids the programs were given
    assert records and {r["episode"] for r in records} <= given


def test_eval_plays_agent_programs_locally_and_against_a_given_url(tmp_path, chatml_tokenizer, capsys):
    from agilerl.cli.main import main

    _program(tmp_path, ROW_AGENT)
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps({"mode": "ok", "i": i}) + "\n" for i in range(10)))
    (tmp_path / "m.yaml").write_text(
        f"environment: {{env_type: rollout, agent_command: [{json.dumps(sys.executable)}, agent.py], dataset: tasks.jsonl,"
        " train_test_split: 0.7}\nmodel: {name_or_path: tiny}\n"
    )
    out = tmp_path / "local.jsonl"
    assert main(["eval", str(tmp_path / "m.yaml"), "--max-new-tokens", "2", "--no-progress", "-o", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["episodes"] == 3 and summary["reward_mean"] == 1.0  # the held-out rows
    endpoint = AgentEndpoint(chatml_tokenizer)
    try:  # any OpenAI-compatible server: here one of ours, with a key of its own
        episode = endpoint.open_episode("outside", VersionedPolicy(ScriptedPolicy(chatml_tokenizer, "hi")), SamplingParams())
        out = tmp_path / "url.jsonl"
        assert main(["eval", str(tmp_path / "m.yaml"), "--model", "m", "--base-url", endpoint.base_url,
                     "--api-key", episode.key, "--no-progress", "-o", str(out), "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)
        assert summary["episodes"] == 3 and summary["reward_mean"] == 1.0
        assert episode.calls == 3  # the programs called that URL themselves
    finally:
        endpoint.close()
    assert os.path.exists(out)


@pytest.mark.slow
def test_the_example_agent_trains_on_the_tiny_model(tmp_path, capsys):
    from agilerl.cli.main import main

    example = Path(__file__).resolve().parents[1] / "examples" / "agent" / "manifest.yaml"
    assert main(["train", str(example), "--max-steps", "1", "--output-dir", str(tmp_path), "--no-progress"]) == 0
    said = capsys.readouterr()
    assert "env: agent program python agent.py, once per episode" in said.out + said.err
    (row,) = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines() if "agent/calls" in line]
    assert row["agent/failures"] == 0 and row["agent/calls"] == 16 * 3


def test_closing_the_collector_ends_a_running_program_with_its_group(chatml_tokenizer, tmp_path, agent_log):
    agent = CommandAgent(_program(tmp_path, ROW_AGENT))
    collector = AgentCollector(agent, chatml_tokenizer, batch_size=1, group_size=1, seed=0,
                               train_rows=[{"mode": "hang"}], episode_timeout_s=600)
    box: dict = {}
    thread = threading.Thread(target=lambda: box.update(batch=collector.collect(VersionedPolicy(ScriptedPolicy(chatml_tokenizer, "hi")))))
    thread.start()
    pid_file = agent_log / "child.pid"
    deadline = time.monotonic() + 60
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    collector.close()
    thread.join(60)
    assert not thread.is_alive() and "stopped" in box["batch"].trajectories[0].info["agent_failure"]
    assert _ended(child)


def test_a_call_that_finishes_after_its_episode_ended_is_not_trained_on(chatml_tokenizer):
    from agilerl.agents.episodes import Episode

    episode = Episode("e1", "key", ChatRenderer(chatml_tokenizer))
    messages = [{"role": "user", "content": "hi"}]
    plan = episode.plan_chat(messages, None, None)
    episode.record(plan, Generation([5, 6]), {"role": "assistant", "content": "x"}, 0.1)
    late = episode.plan_chat([*messages, {"role": "assistant", "content": "x"}, {"role": "user", "content": "more"}], None, None)
    (sample,) = episode.trajectories()
    before = list(sample.token_ids)
    episode.record(late, Generation([7]), {"role": "assistant", "content": "y"}, 0.1)
    assert sample.token_ids == before and episode.calls == 1


@pytest.mark.parametrize("family", ["chatml_tokenizer", "llama3_tokenizer"])
def test_the_next_turn_is_what_the_template_renders_after_the_reply(family, request):
    from agilerl.agents.episodes import continuation_ids

    tokenizer = request.getfixturevalue(family)
    renderer = ChatRenderer(tokenizer)
    opening = [{"role": "system", "content": "s"}, {"role": "user", "content": "What is 2+2?"}]
    reply = {"role": "assistant", "content": "4"}
    for new in ([{"role": "user", "content": "Sure?"}],  # the memoised turn tail
                [{"role": "user", "content": "Sure?"}, {"role": "user", "content": "Really?"}]):  # rendered
        full = tokenizer.apply_chat_template([*opening, reply, *new], tokenize=False, add_generation_prompt=True)
        head = tokenizer.apply_chat_template([*opening, reply], tokenize=False)
        tail = continuation_ids(renderer, reply, new, renderer.encode("4"))  # a reply cut before its close
        assert tokenizer.decode(tail) == full[len(head) - len(renderer.assistant_close):]


def test_validate_names_a_missing_program_script_function_and_task_file(tmp_path):
    from agilerl.assembly.checks import manifest_problems
    from agilerl.manifest.spec import parse_manifest

    def problems(environment: dict) -> list[str]:
        return manifest_problems(parse_manifest({"environment": {"env_type": "rollout", **environment}}, base_dir=tmp_path))

    (tmp_path / "agent.py").write_text("def play(task, base_url, api_key):\n    return 1.0\n")
    assert problems({"agent_command": ["python", "agent.py"]}) == []
    assert problems({"agent": "agent.py:play"}) == []
    assert problems({"agent_command": ["no-such-program-here", "x"]}) == [
        f"environment.agent_command: 'no-such-program-here' is neither on PATH nor a file in {tmp_path}"
    ]
    assert problems({"agent_command": ["python", "missing.py"]}) == [f"environment.agent_command: file not found: {tmp_path / 'missing.py'}"]
    assert problems({"agent": "play"}) == ["environment.agent: 'play' names no function: write 'path/to/file.py:fn' or 'module:fn'"]
    assert "environment.agent:" in problems({"agent": "agent.py:nothing"})[0]
    assert problems({"agent": "agent.py:play", "dataset": "tasks.jsonl"}) == [f"environment.dataset: file not found: {tmp_path / 'tasks.jsonl'}"]


URLLIB_AGENT = """
import json, os, urllib.request

def call(messages):
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 3}).encode()
    request = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions", data=body, headers={
        "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=120).read())["choices"][0]["message"]

seed = json.loads(os.environ["AGILERL_TASK"])["seed"]
first = call([{"role": "user", "content": f"Pick a number near {seed % 10}."}])
second = call([{"role": "user", "content": "Start over: pick a number."}])  # a rewritten history
print(json.dumps({"reward": float(any(c.isdigit() for c in first["content"] + second["content"]))}))
"""


@pytest.mark.slow
def test_agent_programs_train_under_ddp_on_two_ranks(tmp_path):
    import subprocess

    from agilerl.ports import free_port

    _program(tmp_path, URLLIB_AGENT)
    (tmp_path / "m.yaml").write_text(
        "environment: {env_type: rollout, agent_command: [python, agent.py]}\nmodel: {name_or_path: tiny}\n"
        "algorithm: {name: grpo}\ntraining: {batch_size: 2, group_size: 2, max_steps: 2, max_new_tokens: 3, "
        "evaluation_interval: 0, seed: 0}\n"
    )
    port = free_port()  # outside the ephemeral range: nothing takes it while accelerate starts
    out = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
         "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(port),
         "-m", "agilerl", "train", str(tmp_path / "m.yaml"), "--output-dir", str(out), "--no-progress"],
        check=False, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in steps if "agent/calls" in r]
    # each rank plays 2 x 2 episodes of 2 calls a step, each episode 2 samples; counts summed over ranks
    assert len(steps) == 2 and all(r["agent/calls"] == 16 and r["agent/samples_per_episode"] == 2 for r in steps)


def test_calls_of_live_episodes_made_while_one_generates_share_the_next_batch(chatml_tokenizer):
    endpoint = AgentEndpoint(chatml_tokenizer)
    held = _HeldPolicy(chatml_tokenizer)
    try:
        episodes = [endpoint.open_episode(f"e{i}", held, SamplingParams()) for i in range(5)]
        url = endpoint.base_url + "/chat/completions"
        results: list = []

        def call(episode) -> None:
            results.append(_post(url, {"messages": [{"role": "user", "content": episode.id}]}, episode.key))

        threads = [threading.Thread(target=call, args=(episodes[0],))]
        threads[0].start()
        assert held.entered.wait(30)  # the first call is in generate, held
        deadline = time.monotonic() + 30
        threads += [threading.Thread(target=call, args=(e,)) for e in episodes[1:]]
        for thread in threads[1:]:
            thread.start()
        while sum(e.in_flight for e in episodes) < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
        held.release.set()
        for thread in threads:
            thread.join(60)
        assert [status for status, _ in results] == [200] * 5
        assert held.inner.calls == 2  # the held call, then the four that queued behind it as one batch
    finally:
        held.release.set()
        endpoint.close()


def _png_url(color: tuple[int, int, int], size: tuple[int, int] = (32, 32)) -> str:
    import base64
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def test_a_vision_policy_sees_image_url_parts_and_each_sample_keeps_its_images(chatml_tokenizer):
    import openai

    from agilerl.train.tiny_model import tiny_vlm_and_tokenizer

    def shown(text: str, color: tuple[int, int, int]) -> dict:
        return {"role": "user", "content": [{"type": "image_url", "image_url": {"url": _png_url(color)}},
                                             {"type": "text", "text": text}]}

    model, tokenizer = tiny_vlm_and_tokenizer()
    endpoint = AgentEndpoint(tokenizer)
    try:
        greedy = SamplingParams(temperature=0.0, max_new_tokens=4)
        episode = endpoint.open_episode("e1", TransformersPolicy(model, tokenizer), greedy)
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=episode.key)
        messages = [shown("What color?", (255, 0, 0))]
        first = client.chat.completions.create(model="m", messages=messages)
        messages += [first.choices[0].message.model_dump(exclude_none=True), shown("And this one?", (0, 0, 255))]
        client.chat.completions.create(model="m", messages=messages)
        (sample,) = episode.trajectories()  # the second picture extended the conversation
        assert sample.media is not None and len(sample.media.images) == 2
        placeholders = set(sample.media.placeholder_ids)
        shown_ids = sum(t in placeholders for t, generated in zip(sample.token_ids, sample.action_mask) if not generated)
        assert shown_ids == sum(sample.media.placeholder_counts) > 0  # each picture expanded by the processor
        # a placeholder the model samples ends its sample there (trained, as the harness does)
        def reply_of(prompt) -> str:
            return "fine" if "go on" in tokenizer.decode(list(prompt)) else "a<|image_pad|>b"

        sampled = endpoint.open_episode("e3", ScriptedPolicy(tokenizer, reply_of), SamplingParams())
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=sampled.key)
        reply = client.chat.completions.create(model="m", messages=messages[:1])
        assert reply.choices[0].finish_reason == "length"
        client.chat.completions.create(model="m", messages=[*messages[:1], reply.choices[0].message.model_dump(exclude_none=True),
                                                             {"role": "user", "content": "go on"}])
        cut, fresh = sampled.trajectories()
        assert cut.media.ended and cut.token_ids[-1] in placeholders and not fresh.media.ended
        # an image the processor refuses (Qwen2-VL: an aspect ratio past 200) is the request's fault
        thin = endpoint.open_episode("e4", TransformersPolicy(model, tokenizer), greedy)
        status, body = _post(endpoint.base_url + "/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": _png_url((0, 0, 0), (1, 500))}}]}]}, thin.key)
        assert status == 400 and "processor refused the image (1x500)" in body["error"]["message"]
        assert endpoint.generation_error is None
    finally:
        endpoint.close()
    text_model = AgentEndpoint(chatml_tokenizer)
    try:
        episode = text_model.open_episode("e2", ScriptedPolicy(chatml_tokenizer, "x"), SamplingParams())
        status, body = _post(text_model.base_url + "/chat/completions", {"messages": messages[:1]}, episode.key)
        assert status == 400 and "image_url parts need a vision policy" in body["error"]["message"]
    finally:
        text_model.close()


def test_a_manifest_agent_function_gets_its_row_and_rubrics_score_what_it_does_not(tmp_path, chatml_tokenizer):
    from agilerl.assembly.agents import agent_collector_from_spec
    from agilerl.manifest.spec import parse_env_spec

    (tmp_path / "play.py").write_text(textwrap.dedent("""
        import openai

        def play(task, base_url, api_key):
            client = openai.OpenAI(base_url=base_url, api_key=api_key)
            client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["question"]}])
            return None if task["question"] == "rubric" else float(task["answer"])

        def echo(completion, answer):
            return float(completion == "hi") + float(answer)
    """))
    (tmp_path / "tasks.jsonl").write_text("".join(json.dumps({"question": q, "answer": a}) + "\n" for q, a in
                                                  [("rubric", "10"), ("own", "3"), ("own", "4"), ("own", "5")]))
    spec = parse_env_spec({"env_type": "rollout", "agent": "play.py:play", "dataset": "tasks.jsonl", "train_test_split": 0.99,
                           "rubrics": [{"name": "echo", "rubric": "play.py:echo"}]})
    with agent_collector_from_spec(spec, chatml_tokenizer, batch_size=3, group_size=2, base_dir=tmp_path, seed=0) as collector:
        batch = collector.collect(ScriptedPolicy(chatml_tokenizer, "hi"))
    for group in batch.groups:  # a group shares its row
        (row,) = {t.row_index for t in group}
        task = collector.train_rows[row]
        expected = 11.0 if task["question"] == "rubric" else float(task["answer"])
        assert [t.rewards for t in group] == [[expected], [expected]]
    assert [t.rewards for t in batch.trajectories].count([11.0]) == 2  # the rubric's row was played
    assert {t.info.get("reward_components", {}).get("echo") for t in batch.trajectories} == {None, 11.0}


class _BrokenPolicy:
    def generate(self, prompts, params):
        raise RuntimeError("CUDA out of memory (pretend)")


def test_a_failing_policy_stops_the_run_naming_it_not_the_programs(chatml_tokenizer, tmp_path):
    rows = [{"mode": "ok"}]
    with AgentCollector(CommandAgent(_program(tmp_path, ROW_AGENT)), chatml_tokenizer, batch_size=1, group_size=1,
                        seed=0, train_rows=rows) as collector:
        with pytest.raises(CollectionError, match="generating for the agent programs failed: RuntimeError: CUDA out of memory"):
            collector.collect(_BrokenPolicy())


class _IdsPolicy:
    """Replies with given token ids (then the stop token): a completion no text re-encodes to."""

    def __init__(self, ids: list[int]) -> None:
        self.ids = ids
        self.prompts: list[list[int]] = []

    def generate(self, prompts, params) -> list[Generation]:
        self.prompts += [list(p) for p in prompts]
        return [Generation(self.ids + list(params.stop_token_ids[:1]), [-0.5] * (len(self.ids) + 1)) for _ in prompts]


def test_the_next_prompt_holds_the_ids_the_model_generated_not_its_text_re_encoded(chatml_tokenizer):
    import openai

    text = "reward game"
    canonical = chatml_tokenizer.encode(text, add_special_tokens=False)
    spelled = [t for ch in text for t in chatml_tokenizer.encode(ch, add_special_tokens=False)]  # one id a character
    assert spelled != canonical and chatml_tokenizer.decode(spelled) == text
    endpoint = AgentEndpoint(chatml_tokenizer)
    try:
        policy = _IdsPolicy(spelled)
        stop = SamplingParams(stop_token_ids=(endpoint.renderer.end_of_turn_id,))
        episode = endpoint.open_episode("e1", policy, stop)
        client = openai.OpenAI(base_url=endpoint.base_url, api_key=episode.key)
        messages = [{"role": "user", "content": "Say it."}]
        first = client.chat.completions.create(model="m", messages=messages)
        assert first.choices[0].message.content == text
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "Again."}]
        client.chat.completions.create(model="m", messages=messages)
        opening, follow_up = policy.prompts
        assert follow_up[: len(opening) + len(spelled) + 1] == opening + spelled + [endpoint.renderer.end_of_turn_id]
        (sample,) = episode.trajectories()
        assert _spans(sample)[0] == spelled + [endpoint.renderer.end_of_turn_id]
    finally:
        endpoint.close()


@pytest.mark.parametrize("value, says", [
    (float("nan"), "the reward must be a finite number, got nan"), (float("inf"), "got inf"), (True, "got True"),
    ("1.0", "got '1.0'"), ({"reward": 1.0, "components": {"a": float("nan")}}, "finite numbers"),
    ({"reward": 1.0, "components": {"a": False}}, "finite numbers"), ({"reward": 1.0, "components": [1]}, "finite numbers"),
])
def test_a_reward_that_is_not_a_finite_number_is_refused_naming_where(value, says):
    assert reward_of(2, "here") == (2.0, {}) and reward_of({"reward": 1, "components": {"a": 3}}, "here") == (1.0, {"a": 3.0})
    assert reward_of(None, "here") is None and reward_of({"reward": None}, "here") is None  # none: the rubrics score it
    with pytest.raises(ValueError, match="^its line: ") as raised:
        reward_of(value, "its line")
    assert says in str(raised.value)


def test_a_task_past_what_an_environment_variable_holds_comes_in_its_file(tmp_path):
    """Linux refuses to start a program with a variable past 128 KiB (a long-context task would
    fail every episode with E2BIG): every program gets the task's file, and the variable too while
    it fits."""
    reads = CommandAgent(_program(tmp_path, """
        import json, os
        task = json.load(open(os.environ["AGILERL_TASK_FILE"]))
        same = os.environ.get("AGILERL_TASK") in (None, json.dumps(task))
        print(json.dumps({"reward": len(task["text"]) if same else -1, "components": {"in_env": int("AGILERL_TASK" in os.environ)}}))
    """, "reads.py"))
    assumes = CommandAgent(_program(tmp_path, "import json, os; json.loads(os.environ['AGILERL_TASK'])", "assumes.py"))
    run = lambda agent, size: agent.run({"text": "x" * size}, "http://127.0.0.1:9/v1", "k", "e", 60, threading.Event())
    small, big = run(reads, 10), run(reads, 200_000)
    assert (small.reward, small.components) == (10.0, {"in_env": 1.0})
    assert (big.reward, big.components) == (200_000.0, {"in_env": 0.0})
    failed = run(assumes, 200_000)
    assert "exit code 1" in failed.failure and "read the file AGILERL_TASK_FILE names" in failed.failure
    assert "KeyError" in failed.stderr_tail


def test_fields_that_shape_sampling_are_named_once_in_a_warning_and_the_run_samples(chatml_tokenizer):
    endpoint = AgentEndpoint(chatml_tokenizer)
    try:
        episode = endpoint.open_episode("e1", VersionedPolicy(ScriptedPolicy(chatml_tokenizer, "ok")), SamplingParams())
        url = endpoint.base_url + "/chat/completions"
        body = {"messages": [{"role": "user", "content": "hi"}], "temperature": 0.2, "response_format": {"type": "json_object"},
                "top_p": 1.0}  # top_p as the run's own: nothing to say
        with pytest.warns(AgileRLWarning) as said:
            assert _post(url, body, episode.key)[0] == 200
        (warning,) = [w for w in said if "agent programs sent" in str(w.message)]
        assert "sent temperature, response_format:" in str(warning.message) and "top_p," not in str(warning.message)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: a program sends them on every call
            assert _post(url, body, episode.key)[0] == 200
    finally:
        endpoint.close()
