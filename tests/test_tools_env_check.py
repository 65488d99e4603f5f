"""``agilerl env check`` with ``tool_parser`` (issue 41): its protocol step sends the first
scripted completion as a run does, through the parser and the env's ``call_tool``, so an OpenEnv
MCP env without ``mcp_tool`` checks, in process and served (real openenv-core, in its side venv);
and a tool schema the run's checker cannot read is a problem naming the tool and the keyword."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from agilerl.cli.main import main
from tests.test_openenv_native import run_agilerl, side_python  # noqa: F401 - the side venv fixture
from tests.test_remote_openenv import openenv_python  # noqa: F401
from tests.test_tools_openenv import ECHO

CALL = '<tool_call>{"name": "echo_message", "arguments": {"message": "hi"}}</tool_call>'


@pytest.fixture
def echo_dir(tmp_path: Path) -> Path:
    (tmp_path / "envs.py").write_text(ECHO)
    return tmp_path


def _checked(out: str) -> dict:
    summary = json.loads(out)
    assert summary["problems"] == [], summary
    assert summary["turn_rewards"][0][0]["tool_calls"][0]["result"] == "hi"
    return summary


@pytest.mark.slow
def test_env_check_of_an_mcp_env_without_mcp_tool_goes_through_the_parser(side_python: Path, echo_dir: Path) -> None:  # noqa: F811
    done = run_agilerl(side_python, "env", "check", "envs.py:EchoMCPEnv", "--tool-parser", "hermes",
                       "--action", CALL, "--max-turns", "1", "--json", cwd=echo_dir)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    _checked(done.stdout)


@pytest.mark.slow
def test_env_check_of_a_served_mcp_env_without_mcp_tool_goes_through_the_parser(
    side_python: Path, echo_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    server = subprocess.Popen([str(side_python), "-m", "agilerl", "serve", "envs.py:EchoMCPEnv", "--port", "0"],
                              cwd=echo_dir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = next(line for line in server.stdout if line.startswith("serving ")).split(" at ")[1].split()[0]
        manifest = tmp_path / "m.yaml"
        manifest.write_text(
            f"environment:\n  env_type: rollout\n  env_url: {url}\n  max_turns: 1\n  tool_parser: hermes\n"
            "model:\n  name_or_path: tiny\nalgorithm:\n  name: grpo\n"
        )
        assert main(["env", "check", str(manifest), "--action", CALL, "--json"]) == 0
        _checked(capsys.readouterr().out)
        # a completion without a call: the env takes only calls, which the check says, and is no problem
        assert main(["env", "check", str(manifest), "--action", "no call", "--episodes", "0", "--json"]) == 0
        assert any("takes only calls" in note for note in json.loads(capsys.readouterr().out)["notes"])
    finally:
        server.terminate()
        server.wait(timeout=30)


@pytest.mark.parametrize(
    ("schema", "said"),
    [
        ('{"type": "object", "required": 5}', "tool 'add': parameters.required must be a list"),
        ('{"type": "object", "properties": ["a"]}', "tool 'add': parameters.properties must be an object"),
        ('{"type": "object", "properties": {"a": {"enum": 5}}}', "tool 'add': parameters.properties.a.enum must be a list"),
    ],
)
def test_env_check_reports_a_schema_the_checker_cannot_read(tmp_path: Path, capsys, schema, said) -> None:
    (tmp_path / "bad.py").write_text(textwrap.dedent(f'''
        class BadTools:
            tools = [{{"type": "function", "function": {{"name": "add", "parameters": {schema}}}}}]
            max_turns = 1

            def reset(self, seed=None):
                return "q", {{}}

            def step(self, action):
                return "s", 0.0, True, False, {{}}

            def call_tool(self, name, arguments):
                return "r", 0.0, True, False, {{}}
    '''))
    source = str(tmp_path / "bad.py") + ":BadTools"
    assert main(["env", "check", source, "--tool-parser", "hermes", "--action", "x", "--json"]) == 1
    assert any(said in problem for problem in json.loads(capsys.readouterr().out)["problems"])
