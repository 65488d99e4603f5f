"""Interop with the real openenv-core 0.3.0: our client drives its servers (a plain text env and
an MCP env), and its GenericEnvClient drives our server.

openenv-core pulls in fastapi, gradio, fastmcp and more, so it lives in its own virtual
environment, ``<repo>/.venv-openenv`` (created on first use, reused after); its server and
client run as subprocesses of that venv's python.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from agilerl.remote.client import RemoteEnvClient
from agilerl.remote.hosting import resolve_env
from tests.extra_venvs import VENVS
from tests.health import ASGI_ON_A_FREE_PORT, start_server
from tests.test_remote_server import (
    assert_all_closed_once,
    fresh_env_class,
)

OPENENV_SERVER = ASGI_ON_A_FREE_PORT + textwrap.dedent('''
import sys
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Action, Observation, State


class MessageAction(Action):
    message: str


class ShoutObservation(Observation):
    shouted: str = ""


class ShoutEnv(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(episode_id=episode_id or "e", step_count=0)
        return ShoutObservation(shouted=f"ready {seed}", metadata={"seed": seed})

    def step(self, action, timeout_s=None, **kwargs):
        self._state.step_count += 1
        done = self._state.step_count >= 2
        return ShoutObservation(shouted=action.message.upper(), reward=1.5, done=done)

    @property
    def state(self):
        return self._state


class CalcEnv(MCPEnvironment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        mcp = FastMCP("calc")

        @mcp.tool
        def run(code: str) -> str:
            """Evaluate an arithmetic expression."""
            return str(eval(code, {"__builtins__": {}}))

        super().__init__(mcp)
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs):
        self._state = State(step_count=0)
        return Observation(done=False)

    def _step_impl(self, action, timeout_s=None, **kwargs):
        return Observation(done=False, metadata={"error": "unknown action"})

    @property
    def state(self):
        return self._state


kind, url_file = sys.argv[1], sys.argv[2]
if kind == "text":
    app = create_app(ShoutEnv, MessageAction, ShoutObservation, max_concurrent_envs=8)
else:
    app = create_app(CalcEnv, CallToolAction, CallToolObservation, max_concurrent_envs=8)
serve(app, url_file)
''')


@pytest.fixture(scope="session")
def openenv_python() -> Path:
    """``.venv-openenv``'s python: openenv-core, from pip's configured indexes (tests/extra_venvs.py)."""
    return VENVS["openenv"].ensure()


@pytest.fixture
def openenv_server(openenv_python: Path, tmp_path: Path) -> Iterator[object]:
    """Start an openenv-core server ("text" or "mcp") in the venv; yields a start function."""
    procs: list[subprocess.Popen[bytes]] = []
    script = tmp_path / "openenv_server.py"
    script.write_text(OPENENV_SERVER)

    def start(kind: str) -> str:
        url_file = tmp_path / f"{kind}.url"
        proc, url = start_server([str(openenv_python), str(script), kind, str(url_file)], url_file, tmp_path / f"{kind}.log")
        procs.append(proc)
        return url

    yield start
    for proc in procs:
        proc.terminate()
        proc.wait(timeout=20)


def test_our_client_drives_an_openenv_text_env(openenv_server: object) -> None:
    url = openenv_server("text")  # type: ignore[operator]
    with RemoteEnvClient(url) as client:
        assert client.reset(seed=4) == ("ready 4", {})  # openenv drops observation metadata
        assert client.step("hello") == ("HELLO", 1.5, False, False, {})
        assert client.step("again") == ("AGAIN", 1.5, True, False, {})
        assert client.state()["step_count"] == 2
        assert client.reset(seed=5)[0] == "ready 5"  # a new episode on the same session
        # openenv's /metadata describes no turn budget, tools or system prompt: none are made up.
        info = client.describe()
        assert (info.max_turns, info.tools, info.system_prompt, info.dataset_size) == (None,) * 4


def test_our_client_drives_an_openenv_mcp_env(openenv_server: object) -> None:
    url = openenv_server("mcp")  # type: ignore[operator]
    with RemoteEnvClient(url, mcp_tool="run", action_field="code") as client:
        assert client.reset() == ("", {})
        assert client.step("6*7") == ("42", 0.0, False, False, {})
        assert client.step("1/0")[0].startswith("Error: ")


def test_openenv_generic_client_drives_our_server(openenv_python: Path, tmp_path: Path) -> None:
    """openenv's GenericEnvClient plays a text env: the env's info (here the answer) never
    reaches it, and a reply it JSON-parsed into a number or a bool is taken as its text."""
    env_cls = fresh_env_class()
    script = tmp_path / "generic_client.py"
    script.write_text(textwrap.dedent('''
        import json, sys
        from openenv.core.generic_client import GenericEnvClient

        with GenericEnvClient(base_url=sys.argv[1]).sync() as env:
            first = env.reset(seed=5)
            step = env.step({"message": 7})
            flag = env.step({"message": True})
            last = env.step({"message": "win"})
            state = env.state()
        print(json.dumps({
            "reset": first.observation, "step": [step.observation, step.reward, step.done],
            "flag": flag.observation, "last": [last.observation, last.reward, last.done], "state": state,
        }))
    '''))
    url, server = resolve_env(env_cls, {"max_turns": 5})
    with server:
        done = subprocess.run([str(openenv_python), str(script), url], check=False, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr[-3000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["reset"] == {"text": "start 5", "truncated": False}  # no metadata: the seed stays home
        assert seen["step"] == [{"text": "7", "truncated": False}, 0.5, False]
        assert seen["flag"] == {"text": "TRUE", "truncated": False}
        assert seen["last"] == [{"text": "WIN", "truncated": False}, 0.5, True]
        assert seen["state"]["step_count"] == 3 and seen["state"]["turn"] == 3
        assert_all_closed_once(server, env_cls, built=1)
    # our own client asks for the info through the protocol (/ws?metadata=1), and gets it
    url, server = resolve_env(env_cls, {"max_turns": 5})
    with server, RemoteEnvClient(url) as client:
        assert client.reset(seed=5) == ("start 5", {"seed": 5})
        assert client.step("hi")[4] == {"turn": 1}
