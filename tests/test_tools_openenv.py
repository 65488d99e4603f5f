"""OpenEnv MCP envs with ``tool_parser`` in place of ``mcp_tool``: in process, served by
``agilerl serve``, and on openenv-core's own server. The env's tools are listed and shown to
the model, each parsed call becomes ``call_tool(name, arguments)``, results come back in the
tool role. openenv-core lives in the side venv (tests/test_remote_openenv.py)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from agilerl.llm_envs import RolloutHarness
from tests.test_openenv_native import run_script, side_python  # noqa: F401 - the side venv fixture
from tests.test_remote_openenv import openenv_python, openenv_server  # noqa: F401
from tests.tool_families import family_tokenizer

ECHO = textwrap.dedent('''
    from fastmcp import FastMCP
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.types import Observation, State


    class EchoMCPEnv(MCPEnvironment):
        """As OpenEnv's echo_env: two MCP tools, echo_message and echo_with_length."""

        def __init__(self):
            mcp = FastMCP("echo_env")

            @mcp.tool
            def echo_message(message: str) -> str:
                """Echo back the message."""
                return message

            @mcp.tool
            def echo_with_length(message: str) -> dict:
                """Echo back the message with its length."""
                return {"message": message, "length": len(message)}

            super().__init__(mcp)
            self._state = State(step_count=0)

        def reset(self, seed=None, episode_id=None, **kwargs):
            return Observation(done=False, metadata={"seed": seed})

        def _step_impl(self, action, timeout_s=None, **kwargs):
            return Observation(done=False)

        @property
        def state(self):
            return self._state
''')

CALLS = ('<tool_call>{"name": "echo_with_length", "arguments": {"message": "hi"}}</tool_call>'
         '<tool_call>{"name": "shout", "arguments": {}}</tool_call>'
         '<tool_call>{"name": "echo_message", "arguments": {"text": "hi"}}</tool_call>')


@pytest.fixture
def echo_dir(tmp_path: Path) -> Path:
    (tmp_path / "envs.py").write_text(ECHO)
    return tmp_path


def test_an_mcp_env_in_process_takes_parsed_calls(side_python: Path, echo_dir: Path) -> None:  # noqa: F811
    seen = run_script(side_python, f'''
        import json
        from agilerl.envs.client import InProcessEnvClient
        from agilerl.envs.entrypoints import entrypoint_factory
        from agilerl.rollout.tool_routing import ToolCallingClient, ToolRouting
        from agilerl.tools import resolve_tool_parser

        client = ToolCallingClient(InProcessEnvClient(entrypoint_factory("envs.py:EchoMCPEnv")()))
        _, info = client.reset(seed=1)
        routing = ToolRouting(resolve_tool_parser("hermes", None))
        calls = client.step(routing.action({CALLS!r}, info["tools"]))
        text = client.step(routing.action("no call here", info["tools"]))
        client.close()
        print(json.dumps({{"tools": [t["function"]["name"] for t in info["tools"]], "calls": calls, "text": text}}))
    ''', echo_dir)
    assert seen["tools"] == ["echo_message", "echo_with_length"]
    records = seen["calls"][4]["tool_calls"]
    assert [(r["name"], r["status"]) for r in records] == [
        ("echo_with_length", "ok"), ("shout", "unknown_tool"), ("echo_message", "schema_violation")]
    assert records[0]["result"] == '{"message":"hi","length":2}'
    assert records[1]["result"].startswith("Error: unknown tool 'shout'")
    assert seen["text"][:3] == ["No tool call found. Call one of the tools: echo_message, echo_with_length.", 0.0, False]


def _play(url: str) -> tuple[RolloutHarness, dict]:
    tokenizer = family_tokenizer("hermes")
    harness = RolloutHarness(url, tokenizer, max_turns=2, tool_parser="hermes")
    harness.reset(seed=3)
    call = '<tool_call>{"name": "echo_message", "arguments": {"message": "hello"}}</tool_call>'
    ids = tokenizer.encode(call, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    _, _, _, _, info = harness.step(ids)
    return harness, info


@pytest.mark.slow
def test_an_mcp_env_served_by_us_takes_parsed_calls(side_python: Path, echo_dir: Path) -> None:  # noqa: F811
    server = subprocess.Popen([str(side_python), "-m", "agilerl", "serve", "envs.py:EchoMCPEnv", "--port", "0"],
                              cwd=echo_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = next(line for line in server.stdout if line.startswith("serving "))
        url = line.split(" at ")[1].split()[0]
        harness, info = _play(url)
        with harness:
            assert [t["function"]["name"] for t in harness.chat.tools] == ["echo_message", "echo_with_length"]
            assert info["tool_calls"][0]["result"] == "hello"
            text = harness.tokenizer.decode(harness.trajectory.token_ids)
            assert "<tool_response>\nhello\n</tool_response>" in text and '"name": "echo_with_length"' in text
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.slow
def test_openenv_cores_own_mcp_server_takes_parsed_calls(openenv_server: object) -> None:  # noqa: F811
    url = openenv_server("mcp")  # type: ignore[operator]
    tokenizer = family_tokenizer("hermes")
    with RolloutHarness(url, tokenizer, max_turns=2, tool_parser="hermes") as harness:
        harness.reset(seed=3)
        assert [t["function"]["name"] for t in harness.chat.tools] == ["run"]
        call = '<tool_call>{"name": "run", "arguments": {"code": "6*7"}}</tool_call>'
        ids = tokenizer.encode(call, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
        _, reward, done, truncated, info = harness.step(ids)
        assert info["tool_calls"][0]["result"] == "42" and not done and not truncated
        assert "<tool_response>\n42\n</tool_response>" in tokenizer.decode(harness.trajectory.token_ids)
