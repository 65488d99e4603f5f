"""Tool calls checked on every path (issue 41): ``agilerl serve`` checks a call's name and
arguments with the in-process checker before the env's ``call_tool``, and answers a refused one
as in process; what ``call_tool`` does wrong (raises, hangs, returns a dict or None) is named
``call_tool``, in process and served."""

from __future__ import annotations

import threading

import pytest

from agilerl.errors import CollectionError
from agilerl.generation.policy import ScriptedPolicy
from agilerl.llm_envs.openenv_server import resolve_env
from agilerl.remote.client import RemoteEnvClient
from agilerl.rollout.collector import RolloutCollector
from agilerl.rollout.tool_routing import TOOL_CALLS_INFO, ToolCallingClient, ToolRouting
from agilerl.tools import REFUSED_INFO
from tests.test_tools_harness import TOOLS, CalcEnv
from tests.tool_families import family_tokenizer

CALL = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'


def test_the_server_runs_call_tool_only_for_listed_tools_and_checked_arguments():
    received: list[tuple[str, dict]] = []

    class Recording(CalcEnv):
        def call_tool(self, name, arguments):
            received.append((name, arguments))
            return super().call_tool(name, arguments)

    url, server = resolve_env(Recording, {})
    with server:
        client = RemoteEnvClient(url)
        try:
            client.reset(seed=0)
            text, reward, done, _, info = client.call_tool("shout", {})
            assert text == "Error: unknown tool 'shout'; the tools are: add, submit" and reward == 0.0 and not done
            assert info[REFUSED_INFO]["status"] == "unknown_tool"
            text, _, _, _, info = client.call_tool("add", {"a": 1, "c": 2})
            assert info[REFUSED_INFO]["status"] == "schema_violation" and "lacks required 'b'" in text
            assert client.call_tool("add", {"a": "2", "b": 3})[0] == "5"  # coerced, as in process
            # a harness whose tool list differs records the server's refusal as the call's status
            routing = ToolRouting.build("hermes", None)
            stale = [*TOOLS, {"name": "shout", "parameters": {"type": "object"}}]
            calling = ToolCallingClient(client)
            _, _, _, _, info = calling.step(routing.action('<tool_call>{"name": "shout", "arguments": {}}</tool_call>', stale))
            (record,) = info[TOOL_CALLS_INFO]
            assert record["status"] == "unknown_tool" and record["result"].startswith("Error: unknown tool 'shout'")
        finally:
            client.close()
    assert received == [("add", {"a": 2, "b": 3})]


class Misbehaving(CalcEnv):
    """A text env whose call_tool raises, hangs, or returns what a step may not."""

    release = threading.Event()

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def call_tool(self, name, arguments):
        if self.mode == "raise":
            raise ValueError("boom")
        if self.mode == "hang":
            self.release.wait(10)
        return {"observation": "x"} if self.mode == "dict" else None


@pytest.mark.parametrize("served", [False, True], ids=["in_process", "served"])
@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("raise", "Misbehaving.call_tool('add') raised ValueError: boom"),
        ("dict", "Misbehaving.call_tool() must return a 5-tuple"),
        ("none", "Misbehaving.call_tool() must return a 5-tuple (observation, reward, terminated, truncated, info), got NoneType"),
        ("hang", "call_tool('add') did not finish"),
    ],
)
def test_what_call_tool_does_wrong_names_call_tool(mode, said, served):
    tokenizer = family_tokenizer("hermes")
    Misbehaving.release.clear()
    url, server = resolve_env(lambda: Misbehaving(mode), {}) if served else (None, None)
    factory = (lambda: url) if served else (lambda: Misbehaving(mode))
    try:
        with RolloutCollector(factory, tokenizer, batch_size=1, group_size=1, env_timeout_s=0.5, episode_retries=0,
                              tool_parser="hermes", seed=0) as collector:
            with pytest.raises(CollectionError, match=r"in step: .*" + said.replace("(", r"\(").replace(")", r"\)").replace(".", "[.]")):
                collector.collect(ScriptedPolicy(tokenizer, CALL))
    finally:
        Misbehaving.release.set()
        if server is not None:
            server.stop()
