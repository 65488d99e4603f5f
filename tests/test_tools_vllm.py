"""The same tool calls through ``agilerl eval --base-url`` against a real OpenAI-compatible server:
the tiny model under ``vllm serve --enable-auto-tool-choice --tool-call-parser hermes`` (in
.venv-vllm), which parses the model's ``<tool_call>`` text into structured ``tool_calls``.

The tiny model is first fitted (a few hundred plain gradient steps on two sequences) to answer
the task's first prompt with ``add(2, 3)`` and, once the tool's result is in the conversation,
with ``submit(5)``: a random model writes no call. vLLM renders both prompts with the Qwen2.5
template, from the messages our endpoint policy sends (the second carries the answer's
structured ``tool_calls`` and the ``tool`` message with its ``tool_call_id``)."""

from __future__ import annotations

import json

import pytest

from agilerl.cli.main import main
from tests.test_tools_endpoint import ENV
from tests.tool_families import family_tokenizer
from tests.vllm_serve import VLLMServe

pytestmark = pytest.mark.slow
FIT_MAX_STEPS = 300  # full-batch Adam steps at most; about 70 reach the margin below at FIT_LR
FIT_LR = 5e-3  # 3e-3 needs about 100 steps, 7e-3 about 140; 1e-2 never settles
FIT_MARGIN = 4.0  # every target token's logit this far above the next: greedy decoding (vLLM's too) answers it

TOOLS = [{"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "submit", "description": "Submit the answer.", "parameters": {
        "type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}}}]


def _fitted_model_dir(tmp_path):
    """The tiny model (hermes tokens, Qwen2.5 template) fitted to call add, then submit."""
    import torch

    from agilerl.train.tiny_model import build_tiny_model

    tokenizer = family_tokenizer("hermes")
    model = build_tiny_model(tokenizer, num_heads=1)
    user = [{"role": "user", "content": "What is 2+3?"}]
    add = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    submit = '<tool_call>\n{"name": "submit", "arguments": {"answer": 5}}\n</tool_call>'
    sequences = []
    for arguments in ({"a": 2, "b": 3}, '{"a": 2, "b": 3}'):  # however the server hands them to the template
        called = {"role": "assistant", "content": "", "tool_calls": [
            {"id": "x", "type": "function", "function": {"name": "add", "arguments": arguments}}]}
        for content in ("", None):
            messages = [*user, {**called, "content": content}, {"role": "tool", "tool_call_id": "x", "content": "5"}]
            sequences.append((messages, submit))
    sequences.append((user, add))
    rows = []
    for messages, reply in sequences:
        prompt = tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True, tokenize=False)
        ids = tokenizer.encode(prompt, add_special_tokens=False)
        target = tokenizer.encode(reply + "<|im_end|>", add_special_tokens=False)
        rows.append((ids + target, len(ids)))
    # one padded batch a step, until every target token wins by FIT_MARGIN (teacher-forced, so
    # greedy decoding follows the targets): 1500 single-sequence steps took 39 s on one thread
    width = max(len(ids) for ids, _ in rows)
    x = torch.tensor([ids + [0] * (width - len(ids)) for ids, _ in rows])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in rows])
    labels = torch.full_like(x, -100)
    for row, (ids, start) in enumerate(rows):
        labels[row, start : len(ids)] = x[row, start : len(ids)]
    optimiser = torch.optim.Adam(model.parameters(), lr=FIT_LR)
    model.train()
    targets = labels[:, 1:]
    scored = targets != -100
    for _ in range(FIT_MAX_STEPS):
        logits = model(x, attention_mask=mask).logits[:, :-1]
        target_logit = logits.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
        runner_up = logits.scatter(-1, targets.clamp(min=0).unsqueeze(-1), float("-inf")).max(-1).values
        if (target_logit - runner_up)[scored].min().item() >= FIT_MARGIN:
            break
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    else:
        raise AssertionError(f"the tiny model did not fit its tool calls in {FIT_MAX_STEPS} steps")
    folder = tmp_path / "tiny-tools"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.timeout(1800)
def test_vllm_tool_calls_run_through_eval_base_url(vllm_venv, tmp_path, capsys):
    from tests.test_vllm import vllm_env

    folder = _fitted_model_dir(tmp_path)
    serve = VLLMServe(
        vllm_venv, folder, tmp_path / "vllm.log", "--served-model-name", "tiny", "--max-model-len", "1024",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", env=vllm_env(),
    )
    (tmp_path / "calc.py").write_text(ENV)
    try:
        url = serve.wait_healthy() + "/v1"
        capsys.readouterr()
        code = main(["eval", str(tmp_path / "calc.py") + ":CalcEnv", "--base-url", url, "--model", "tiny",
                     "--tool-parser", "hermes", "-n", "1", "--max-turns", "3", "--max-new-tokens", "64",
                     "--output", str(tmp_path / "out.jsonl"), "--json", "--no-progress"])
        captured = capsys.readouterr()
        assert code == 0, captured.err
    finally:
        serve.stop()
    assert json.loads(captured.out)["reward_mean"] == 1.0, (tmp_path / "out.jsonl").read_text()
    (row,) = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    called = [m["tool_calls"][0]["function"] for m in row["messages"] if m.get("tool_calls")]
    assert called == [{"name": "add", "arguments": {"a": 2, "b": 3}}, {"name": "submit", "arguments": {"answer": 5}}]
    assert [m["content"] for m in row["messages"] if m["role"] == "tool"] == ["5", "done"]
