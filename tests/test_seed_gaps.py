"""The Environments page's promises: mcp_tool on the harness, and process_observation()."""

from __future__ import annotations

from typing import Any

import pytest

from agilerl.errors import InvalidArgument
from agilerl.llm_envs import RolloutHarness, process_observation
from agilerl.manifest.spec import parse_env_spec
from tests.test_remote_client import foreign_server  # noqa: F401 - a fixture


def _mcp_echo(frame: dict[str, Any]) -> dict[str, Any]:
    if frame["type"] == "reset":
        return {"observation": {"prompt": "Say something."}, "done": False}
    said = frame["data"]["arguments"]["message"]
    result = {"content": [{"type": "text", "text": f"echo: {said}"}], "is_error": False}
    return {"observation": {"tool_name": "echo_message", "result": result}, "reward": 1.0, "done": True}


def test_a_harness_built_from_a_url_steps_through_the_mcp_tool(foreign_server, chatml_tokenizer):  # noqa: F811
    url, received = foreign_server(_mcp_echo)
    harness = RolloutHarness(url, chatml_tokenizer, max_turns=2, mcp_tool="echo_message")
    harness.reset(seed=0)
    _, reward, terminated, _, _ = harness.step("hello")
    harness.close()
    assert (reward, terminated) == (1.0, True)
    assert received[1]["data"] == {"type": "call_tool", "tool_name": "echo_message", "arguments": {"message": "hello"}}
    assert "echo: hello" in chatml_tokenizer.decode(harness.trajectory.token_ids)


def test_from_spec_takes_mcp_tool_and_local_refuses_it(foreign_server, chatml_tokenizer):  # noqa: F811
    url, received = foreign_server(_mcp_echo)
    spec = parse_env_spec({"env_type": "rollout", "env_url": url, "max_turns": 2})
    harness = RolloutHarness.from_spec(spec, chatml_tokenizer, mcp_tool="echo_message")
    harness.reset(seed=0)
    harness.step("hi")
    harness.close()
    assert received[1]["data"]["tool_name"] == "echo_message"

    class Local:
        def reset(self, seed=None):
            return "p", {}

        def step(self, action):
            return "o", 0.0, True, False, {}

    with pytest.raises(InvalidArgument, match="mcp_tool='echo_message' applies to an env given as a URL"):
        RolloutHarness.local(Local(), chatml_tokenizer, max_turns=1, mcp_tool="echo_message")


def test_process_observation_reads_a_payload_as_the_client_does():
    payload = {"board": {"rows": ["x..", ".o."]}, "legal": [1, 2]}
    assert process_observation(payload, observation_field="board.rows") == '["x..",".o."]'
    assert process_observation(payload, observation_processor="json") == '{"board":{"rows":["x..",".o."]},"legal":[1,2]}'
    assert process_observation({"text": "hi"}) == "hi"


def test_a_server_without_metadata_needs_max_turns_only_when_nothing_else_gives_it(foreign_server, chatml_tokenizer):  # noqa: F811
    from agilerl.errors import AgileRLError

    url, _ = foreign_server(_mcp_echo)
    spec = parse_env_spec({"env_type": "rollout", "env_url": url, "mcp_tool": "echo_message"})
    with pytest.raises(AgileRLError, match="declares no usable max_turns .*OpenEnv servers publish none.*Set environment.max_turns"):
        RolloutHarness.from_spec(spec, chatml_tokenizer)
