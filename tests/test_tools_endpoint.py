"""``agilerl eval --base-url`` with ``--tool-parser``: an OpenAI-compatible endpoint's structured
``tool_calls`` run as the env's ``call_tool``, and the next request carries the answer's calls and
their results as the endpoint's own messages (``tool`` role, matching ``tool_call_id``).

The endpoint here is a scripted aiohttp server on loopback; ``tests/test_tools_vllm.py`` runs the
same path against a real ``vllm serve --enable-auto-tool-choice``."""

from __future__ import annotations

import json
import textwrap

from agilerl.cli.main import main
from agilerl.concurrency import LoopThread

ENV = textwrap.dedent('''
    INT = {"type": "integer"}

    class CalcEnv:
        """add(a, b) answers, submit(answer) ends the episode: 1.0 for 5."""

        tools = [
            {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
                "type": "object", "properties": {"a": INT, "b": INT}, "required": ["a", "b"]}}},
            {"type": "function", "function": {"name": "submit", "description": "Submit the answer.", "parameters": {
                "type": "object", "properties": {"answer": INT}, "required": ["answer"]}}},
        ]
        max_turns = 4

        def reset(self, seed=None):
            return "What is 2+3?", {}

        def step(self, action):
            return "Use the tools.", 0.0, False, False, {}

        def call_tool(self, name, arguments):
            if name == "add":
                return str(arguments["a"] + arguments["b"]), 0.0, False, False, {}
            return "done", float(arguments["answer"] == 5), True, False, {}
''')


class ScriptedEndpoint:
    """Answers each chat request with the next scripted message; keeps every request body."""

    def __init__(self, replies: list[dict]) -> None:
        self.replies = list(replies)
        self.requests: list[dict] = []
        self._loop = LoopThread("scripted-endpoint")
        self.url = self._loop.run(self._start())

    async def _start(self) -> str:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self._runner.addresses[0][1]}/v1"

    async def _chat(self, request):
        from aiohttp import web

        self.requests.append(await request.json())
        message = self.replies.pop(0)
        return web.json_response({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}]})

    def close(self) -> None:
        self._loop.run(self._runner.cleanup())
        self._loop.stop()


def _call(call_id: str, name: str, arguments: dict) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def test_an_endpoints_tool_calls_run_as_calls_and_return_as_tool_messages(tmp_path, capsys):
    (tmp_path / "calc.py").write_text(ENV)
    endpoint = ScriptedEndpoint([
        {"role": "assistant", "content": None, "tool_calls": [_call("chatcmpl-tool-1", "add", {"a": 2, "b": 3}),
                                                               _call("chatcmpl-tool-2", "divide", {})]},
        {"role": "assistant", "content": "It is 5.", "tool_calls": [_call("chatcmpl-tool-3", "submit", {"answer": 5})]},
    ])
    try:
        code = main(["eval", str(tmp_path / "calc.py") + ":CalcEnv", "--base-url", endpoint.url, "--model", "m",
                     "--tool-parser", "hermes", "-n", "1", "--output", str(tmp_path / "out.jsonl"), "--json"])
    finally:
        endpoint.close()
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out)
    assert summary["reward_mean"] == 1.0
    assert summary["tools"]["tools/calls_per_episode"] == 3.0 and summary["tools"]["tools/failed/unknown_tool"] == 1.0
    first, second = endpoint.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["add", "submit"]
    answer, *results = second["messages"][-3:]
    assert answer["role"] == "assistant" and [c["id"] for c in answer["tool_calls"]] == ["chatcmpl-tool-1", "chatcmpl-tool-2"]
    assert [(m["role"], m["tool_call_id"], m["content"]) for m in results] == [
        ("tool", "chatcmpl-tool-1", "5"),
        ("tool", "chatcmpl-tool-2", "Error: unknown tool 'divide'; the tools are: add, submit"),
    ]
    row = json.loads((tmp_path / "out.jsonl").read_text().splitlines()[-1])
    assert any(m.get("tool_calls") for m in row["messages"])


def test_without_a_tool_parser_a_text_env_reads_an_endpoints_calls_as_json_lines(tmp_path, capsys):
    (tmp_path / "echo.py").write_text(textwrap.dedent('''
        class Echo:
            max_turns = 1
            def reset(self, seed=None):
                return "Call something.", {}
            def step(self, action):
                return "", float(action == '{"name":"add","arguments":"{\\\\"a\\\\": 1}"}'), True, False, {}
    '''))
    endpoint = ScriptedEndpoint([{"role": "assistant", "content": None, "tool_calls": [_call("x", "add", {"a": 1})]}])
    try:
        code = main(["eval", str(tmp_path / "echo.py") + ":Echo", "--base-url", endpoint.url, "--model", "m",
                     "-n", "1", "--output", str(tmp_path / "out.jsonl"), "--json"])
    finally:
        endpoint.close()
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert json.loads(captured.out)["reward_mean"] == 1.0  # as before tool parsers
