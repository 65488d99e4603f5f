"""Tool calls checked on every path (issue 41): a depth bomb in any family's arguments is a call
with status ``invalid_json`` and the episode goes on; a tool schema the checker cannot read is
refused when the tool set is built, naming the tool and the keyword."""

from __future__ import annotations

import json

import pytest

from agilerl.errors import EnvProtocolError
from agilerl.llm_envs import RolloutHarness
from agilerl.rollout.tool_routing import TOOL_CALLS_INFO
from agilerl.tools import ToolSet, resolve_tool_parser
from tests.test_tools_harness import TOOLS, CalcEnv
from tests.tool_families import FAMILIES, family_tokenizer

FAMILY_NAMES = [f for f in FAMILIES if f != "hermes-qwen3"]
_ARRAY_TOOLS = [{"name": "add", "parameters": {"type": "object", "properties": {"a": {"type": "array"}}}}]


def _bomb(family: str, depth: int) -> str:
    """One call to ``add`` in ``family``'s format whose argument ``a`` nests ``depth`` deep."""
    nested = "[" * depth + "]" * depth
    text = resolve_tool_parser(family, None).format_call("add", {"a": "@@"})
    for quoted in ('<|"|>@@<|"|>', '"@@"', "@@"):  # Gemma's string, JSON's, Qwen3-Coder's text
        if quoted in text:
            return text.replace(quoted, nested, 1)
    raise AssertionError(text)


@pytest.mark.parametrize("family", FAMILY_NAMES)
@pytest.mark.parametrize("depth", [10_000, 200])
def test_a_depth_bomb_is_an_invalid_call_in_every_family_as_text_and_ids(family, depth):
    tokenizer = family_tokenizer(family)
    text = _bomb(family, depth)
    for parsed in (
        resolve_tool_parser(family, None).parse_text(text, ToolSet(_ARRAY_TOOLS)),
        resolve_tool_parser(family, tokenizer).parse(tokenizer.encode(text, add_special_tokens=False), ToolSet(_ARRAY_TOOLS)),
    ):
        (call,) = parsed.calls
        # Qwen3-Coder's values are text: the schema's array cannot be read from it
        assert call.status == ("schema_violation" if family == "qwen3_coder" else "invalid_json"), call.error
        assert call.arguments is None or json.dumps(call.arguments)
        assert "nest" in call.error or family == "qwen3_coder"


def test_the_episode_goes_on_after_a_depth_bomb():
    tokenizer = family_tokenizer("hermes")
    env = CalcEnv()
    with RolloutHarness(env, tokenizer, tool_parser="hermes") as harness:
        harness.reset(seed=0)
        bomb = _bomb("hermes", 10_000)
        ids = tokenizer.encode(bomb, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        _, _, done, _, info = harness.step(ids)
        (record,) = info[TOOL_CALLS_INFO]
        assert record["status"] == "invalid_json" and record["result"].startswith("Error: invalid JSON") and not done
        assert env.calls == []
        call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
        _, _, _, _, info = harness.step(tokenizer.encode(call, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")])
        assert info[TOOL_CALLS_INFO][0]["result"] == "5"


@pytest.mark.parametrize(
    ("parameters", "keyword"),
    [
        ({"type": "object", "required": 5}, "parameters.required"),
        ({"type": "object", "properties": [{"name": "a"}]}, "parameters.properties"),
        ({"type": "object", "properties": {"a": {"enum": 5}}}, "parameters.properties.a.enum"),
        ({"type": "object", "properties": {"a": {"type": 3}}}, "parameters.properties.a.type"),
        ({"type": "object", "properties": {"a": {"type": "array", "items": 4}}}, "parameters.properties.a.items"),
        ({"anyOf": {}}, "parameters.anyOf"),
        ({"type": "object", "properties": {"a": {"maxLength": -1}}}, "parameters.properties.a.maxLength"),
        ([], "parameters"),
    ],
)
def test_an_unreadable_schema_is_refused_when_the_tool_set_is_built(parameters, keyword):
    tools = [TOOLS[1], {"type": "function", "function": {"name": "add", "parameters": parameters}}]
    with pytest.raises(EnvProtocolError, match=rf"tool 'add': {keyword.replace('.', '[.]')} must"):
        ToolSet(tools)


def test_a_well_formed_schema_with_code_type_names_builds_and_checks():
    tools = ToolSet([{"name": "f", "inputSchema": {"type": "object", "properties": {
        "x": {"type": "float"}, "n": {"type": ["int32", "null"]}, "e": {"enum": [1, 2]}}, "required": ["x"]}}])
    assert tools.call("f", {"x": "2.5", "n": "4", "e": 2}).arguments == {"x": 2.5, "n": 4, "e": 2}
    assert tools.call("f", {"n": 1}).status == "schema_violation"
    assert tools.call("g", {}).status == "unknown_tool"
    assert tools.call("f", [1]).status == "invalid_json"
