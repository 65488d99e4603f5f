"""Tool calls through the harness: parsed from the generated ids, run as the env's call_tool,
results rendered in the tool role by the family's real chat template, token for token."""

from __future__ import annotations

import pytest

from agilerl.llm_envs import RolloutHarness
from agilerl.rollout.tool_routing import TOOL_CALLS_INFO
from agilerl.tools import resolve_tool_parser
from tests.tool_families import family_tokenizer

_INT = {"type": "integer"}
TOOLS = [
    {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": _INT, "b": _INT}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "submit", "description": "Submit the answer.", "parameters": {
        "type": "object", "properties": {"answer": _INT}, "required": ["answer"]}}},
]


class CalcEnv:
    """A text env that takes parsed calls: ``tools`` beside ``call_tool(name, arguments)``."""

    tools = TOOLS
    max_turns = 4

    def __init__(self) -> None:
        self.steps: list[str] = []
        self.calls: list[tuple[str, dict]] = []

    def reset(self, seed=None):
        return "What is 2+3?", {}

    def step(self, action):
        self.steps.append(action)
        return "Use the tools.", 0.0, False, False, {}

    def call_tool(self, name, arguments):
        self.calls.append((name, arguments))
        if name == "add":
            return str(arguments["a"] + arguments["b"]), 0.0, False, False, {}
        right = arguments["answer"] == 5
        return ("correct" if right else "wrong"), float(right), True, False, {}


def _completion(tokenizer, parser, text_or_calls):
    text = text_or_calls if isinstance(text_or_calls, str) else "".join(parser.format_call(n, a) for n, a in text_or_calls)
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(tokenizer.eos_token)]


def test_calls_run_in_order_bad_ones_answered_in_the_tool_role_and_the_ids_equal_a_full_render():
    tokenizer = family_tokenizer("hermes")
    env = CalcEnv()
    harness = RolloutHarness.local(env, tokenizer, tool_parser="hermes")
    parser = harness.tool_routing.parser
    harness.reset(seed=0)
    first = _completion(tokenizer, parser, [("add", {"a": 2, "b": "3"}), ("nope", {})])
    _, reward, done, _, info = harness.step(first)
    assert [r["status"] for r in info[TOOL_CALLS_INFO]] == ["ok", "unknown_tool"]
    assert info[TOOL_CALLS_INFO][0]["result"] == "5" and not done  # "3" coerced: the schema says integer
    assert env.calls == [("add", {"a": 2, "b": 3})]
    second = _completion(tokenizer, parser, [("submit", {"answer": 5})])
    _, reward, done, _, info = harness.step(second)
    assert reward == 1.0 and done and env.steps == []
    messages = [
        {"role": "user", "content": "What is 2+3?"},
        {"role": "assistant", "content": tokenizer.decode(first[:-1])},
        {"role": "tool", "content": "5"},
        {"role": "tool", "content": "Error: unknown tool 'nope'; the tools are: add, submit"},
        {"role": "assistant", "content": tokenizer.decode(second[:-1])},
        {"role": "tool", "content": "correct"},
    ]
    full = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    traj = harness.trajectory
    assert traj.token_ids == tokenizer.encode(full, add_special_tokens=False)
    generated = [t for t, m in zip(traj.token_ids, traj.action_mask) if m]
    assert generated == first + second  # the trained tokens are exactly the generated ones
    assert len(traj.rewards) == 2  # each model turn is a turn


def test_a_completion_without_a_call_is_a_text_step_without_its_reasoning():
    tokenizer = family_tokenizer("hermes-qwen3")
    env = CalcEnv()
    harness = RolloutHarness.local(env, tokenizer, tool_parser="auto")
    assert harness.tool_routing.parser.name == "hermes"
    harness.reset(seed=0)
    parser = harness.tool_routing.parser
    drafted = "<think>maybe " + parser.format_call("submit", {"answer": 9}) + "</think>\n\nIt is 5."
    _, _, done, _, info = harness.step(_completion(tokenizer, parser, drafted))
    assert env.steps == ["It is 5."] and env.calls == [] and TOOL_CALLS_INFO not in info
    opted = RolloutHarness.local(CalcEnv(), tokenizer, tool_parser="hermes", send_reasoning=True)
    opted.reset(seed=0)
    opted.step(_completion(tokenizer, parser, drafted))
    assert "maybe" in opted.client.env.steps[0]

    class Reader(CalcEnv):
        send_reasoning = True  # the env itself opts in

    own = RolloutHarness.local(Reader(), tokenizer, tool_parser="hermes")
    own.reset(seed=0)
    own.step(_completion(tokenizer, parser, drafted))
    assert "maybe" in own.client.env.steps[0]


def test_literal_tag_text_is_not_a_call():
    tokenizer = family_tokenizer("hermes")
    parser = resolve_tool_parser("hermes", tokenizer)
    # the tag spelled out of ordinary tokens, as an env's text would be re-tokenized by a model
    spelled = [t for piece in ("<", "tool", "_call", ">") for t in tokenizer.encode(piece, add_special_tokens=False)]
    body = tokenizer.encode('{"name": "add", "arguments": {"a": 1, "b": 2}}', add_special_tokens=False)
    parsed = parser.parse(spelled + body)
    assert parsed.calls == () and "add" in parsed.content


def test_auto_without_any_sign_of_a_format_lists_the_choices():
    from agilerl.train.tiny_model import build_tiny_tokenizer

    tokenizer = build_tiny_tokenizer()
    tokenizer.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    with pytest.raises(ValueError, match="hermes.*qwen3_coder|deepseek, gemma, granite, harmony, hermes"):
        resolve_tool_parser("auto", tokenizer)


def test_tool_stats_per_episode_become_metrics_and_tool_format_pays_for_well_formed_calls():
    from agilerl.registry import get_registry
    from agilerl.tools.metrics import tool_call_metrics

    tokenizer = family_tokenizer("hermes")
    harness = RolloutHarness.local(CalcEnv(), tokenizer, tool_parser="hermes")
    parser = harness.tool_routing.parser
    harness.reset(seed=0)
    harness.step(_completion(tokenizer, parser, [("add", {"a": 2, "b": 3}), ("nope", {}), ("add", {"a": 1})]))
    harness.step(_completion(tokenizer, parser, "It is 5."))
    harness.step(_completion(tokenizer, parser, [("submit", {"answer": 5})]))
    stats = harness.trajectory.info["tool_stats"]
    assert stats == {"turns": 3, "calls": 4, "no_call_turns": 1, "ok": 2, "unknown_tool": 1, "schema_violation": 1}
    metrics = tool_call_metrics([stats, None, {"turns": 1, "calls": 0, "no_call_turns": 1}])
    assert metrics["tools/calls_per_episode"] == 2.0 and metrics["tools/well_formed_rate"] == 0.5
    assert metrics["tools/failed/unknown_tool"] == 0.5 and metrics["tools/failed/invalid_json"] == 0.0
    tool_format = get_registry().load("rubric", "tool_format")
    assert tool_format(completion=parser.format_call("add", {"a": 1, "b": 2}) + "<tool_call>{oops</tool_call>") == 0.5
    assert tool_format(completion="no call") == 0.0
    assert tool_format(completion="", info={"tool_calls": [{"status": "ok"}]}) == 1.0


def test_a_template_without_a_tool_role_gets_the_results_as_a_user_message_and_goes_on():
    tokenizer = family_tokenizer("hermes")
    strict = tokenizer.__class__(
        tokenizer_object=tokenizer.backend_tokenizer, eos_token="<|im_end|>", pad_token="<|endoftext|>",
        chat_template=(
            "{%- for m in messages %}{%- if m.role not in ('system', 'user', 'assistant') %}"
            "{{ raise_exception('roles are system, user and assistant') }}{%- endif %}"
            "{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' }}{%- endfor %}"
            "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
        ),
    )
    harness = RolloutHarness.local(CalcEnv(), strict, tool_parser="hermes")
    harness.reset(seed=0)
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    with pytest.warns(UserWarning, match="rendered as one user message"):
        _, _, done, _, info = harness.step(strict.encode(call, add_special_tokens=False) + [strict.convert_tokens_to_ids("<|im_end|>")])
    assert not done and info[TOOL_CALLS_INFO][0]["result"] == "5"
    assert strict.decode(harness.trajectory.token_ids).endswith("<|im_start|>user\n5<|im_end|>\n<|im_start|>assistant\n")


def test_a_text_env_served_by_us_takes_parsed_calls_over_the_wire():
    """``agilerl serve`` of a text env with call_tool: its tools come from /metadata, each call
    travels as OpenEnv's call_tool step frame and reaches the env's call_tool."""
    from agilerl.llm_envs.openenv_server import resolve_env

    tokenizer = family_tokenizer("hermes")
    url, server = resolve_env(CalcEnv, {})
    with server, RolloutHarness(url, tokenizer, tool_parser="hermes") as harness:
        harness.reset(seed=0)
        assert [t["function"]["name"] for t in harness.chat.tools] == ["add", "submit"]
        parser = harness.tool_routing.parser
        _, _, done, _, info = harness.step(_completion(tokenizer, parser, [("add", {"a": 2, "b": "3"})]))
        assert info[TOOL_CALLS_INFO][0]["result"] == "5" and not done
        _, reward, done, _, _ = harness.step(_completion(tokenizer, parser, [("submit", {"answer": 5})]))
        assert reward == 1.0 and done
