"""The command line: ``agilerl tool-parsers list``, and ``agilerl env check`` playing scripted
completions (``--action``, commas and all) whose tool calls it parses, runs and shows."""

from __future__ import annotations

import json

from agilerl.cli.main import main
from tests.test_tools_endpoint import ENV

ADD = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
MUL = '<tool_call>{"name": "mul", "arguments": {}}</tool_call>'
SUBMIT = '<tool_call>{"name": "submit", "arguments": {"answer": 5}}</tool_call>'


def test_tool_parsers_list_names_the_built_in_families(capsys):
    assert main(["tool-parsers", "list", "--json"]) == 0
    names = [row["name"] for row in json.loads(capsys.readouterr().out)]
    assert names == ["deepseek", "gemma", "granite", "harmony", "hermes", "llama3_json", "mistral", "qwen3_coder"]


def test_env_check_shows_each_call_its_status_and_its_result(tmp_path, capsys):
    (tmp_path / "calc.py").write_text(ENV)
    source = str(tmp_path / "calc.py") + ":CalcEnv"
    assert main(["env", "check", source, "--tool-parser", "hermes", "--action", ADD + MUL, "--action", SUBMIT]) == 0
    out = capsys.readouterr().out
    assert '[call] add({"a": 2, "b": 3}) ok\n[tool] 5\n[call] mul({}) unknown_tool\n' in out
    assert "[tool] Error: unknown tool 'mul'; the tools are: add, submit" in out
    assert "2 turns, reward 1" in out
    assert main(["env", "check", source, "--tool-parser", "hermes", "--action", ADD, "--action", SUBMIT, "--json"]) == 0
    first, second = json.loads(capsys.readouterr().out)["turn_rewards"][0]
    assert [(c["name"], c["status"], c["result"]) for c in first["tool_calls"]] == [("add", "ok", "5")]
    assert second["reward"] == 1.0


def test_env_check_takes_whole_completions_with_commas_and_not_both_kinds(tmp_path, capsys):
    (tmp_path / "echo.py").write_text(
        "class Echo:\n    max_turns = 2\n    def reset(self, seed=None):\n        return 'say', {}\n"
        "    def step(self, action):\n        return action, float(action == 'a, b, c'), False, False, {}\n"
    )
    source = str(tmp_path / "echo.py") + ":Echo"
    assert main(["env", "check", source, "--action", "a, b, c", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rewards"] == [2.0]  # both turns got the whole text
    assert main(["env", "check", source, "--action", "x", "--actions", "1,2"]) == 2
    assert "give --actions (comma-separated) or --action (repeated), not both" in capsys.readouterr().err
