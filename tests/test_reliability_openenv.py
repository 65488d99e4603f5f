"""OpenEnv Actions that are not one text field, on openenv-core's real base classes (the side venv
of tests/test_openenv_native.py): an Enum (by value and by name), an IntEnum, a list of floats, a
Literal, all fields defaulted, a name plus arguments.

In process, the model's text fills each by the field's type (JSON for what is not ``str``), and a
text that fits none gets pydantic's own message. ``agilerl env check`` steps with the first
scripted action. ``agilerl serve`` hosts every one of them: OpenEnv's client sends the fields, an
agilerl client sends text, read as in process; ``--action-field`` and ``action_field`` in
``--env-config`` say where a text goes.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.test_openenv_native import run_agilerl, run_script, side_python  # noqa: F401 - the side venv fixture
from tests.test_remote_openenv import openenv_python  # noqa: F401 - side_python's own fixture

LAYOUTS = textwrap.dedent('''
    import enum
    from typing import Literal
    from fastmcp import FastMCP
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.types import Action, Observation, State


    class Move(str, enum.Enum):  # OpenEnv's grid world
        UP = "UP"
        DOWN = "DOWN"


    class Turn(enum.IntEnum):
        LEFT = 0
        RIGHT = 1


    class GridAction(Action):
        direction: Move


    class TurnAction(Action):
        turn: Turn


    class ControlAction(Action):  # dm_control
        vector: list[float]


    class DriveAction(Action):  # carla's action type
        action_type: Literal["brake", "accelerate", "steer"]


    class CarlaAction(Action):  # several fields, all defaulted
        throttle: float = 0.0
        steer: float = 0.0
        brake: bool = False


    class ToolAction(Action):  # a name plus arguments
        name: str
        arguments: dict = {}


    class Echo(Observation):
        seen: str = ""


    def _env(action_cls):
        class Env(Environment):
            SUPPORTS_CONCURRENT_SESSIONS = True

            def reset(self, seed=None, episode_id=None, **kwargs):
                return Echo(seen="start")

            def step(self, action: action_cls, timeout_s=None, **kwargs):
                return Echo(seen=action.model_dump_json(exclude={"metadata"}), reward=1.0)

            @property
            def state(self):
                return State()

        Env.__name__ = Env.__qualname__ = action_cls.__name__.replace("Action", "Env")
        return Env


    GridEnv, TurnEnv, ControlEnv = _env(GridAction), _env(TurnAction), _env(ControlAction)
    DriveEnv, CarlaEnv, ToolEnv = _env(DriveAction), _env(CarlaAction), _env(ToolAction)


    class PushEnv(MCPEnvironment):
        """One MCP tool whose argument is a list of floats, not text."""

        def __init__(self):
            mcp = FastMCP("push")

            @mcp.tool
            def push(vector: list[float]) -> str:
                """Push by a vector."""
                return f"pushed {vector}"

            super().__init__(mcp)

        def reset(self, seed=None, episode_id=None, **kwargs):
            return Observation(done=False)

        def _step_impl(self, action, timeout_s=None, **kwargs):
            return Observation(done=False)

        @property
        def state(self):
            return State()
''')

TEXTS = {
    "GridEnv": ["UP", "down", '"DOWN"', "SIDEWAYS"],
    "TurnEnv": ["LEFT", "1", "right", "5"],
    "ControlEnv": ["[0.5, -0.5]", " [1, 2]\n", "fast"],
    "DriveEnv": ["brake", "fly"],
    "CarlaEnv": ['{"throttle": 0.5, "brake": true}', "go", '{"throttle": "x"}'],
    "ToolEnv": ["move", '{"name": "move", "arguments": {"x": 1}}'],
}


@pytest.fixture
def layouts(tmp_path: Path) -> Path:
    (tmp_path / "layouts.py").write_text(LAYOUTS)
    return tmp_path


def test_text_fills_each_action_shape_by_its_field_type(side_python: Path, layouts: Path) -> None:  # noqa: F811
    seen = run_script(side_python, f'''
        import json
        from agilerl.envs.entrypoints import entrypoint_factory

        seen = {{}}
        for name, texts in {TEXTS!r}.items():
            env = entrypoint_factory(f"layouts.py:{{name}}")()
            env.reset()
            for text in texts:
                try:
                    seen[f"{{name}} {{text}}"] = json.loads(env.step(text)[0])
                except ValueError as exc:  # OpenEnvAdapterError
                    seen[f"{{name}} {{text}}"] = str(exc)
        push = entrypoint_factory("layouts.py:PushEnv")()
        push.reset()
        seen["push"] = push.step("[0.5, -0.5]")[0]  # an MCP tool's list argument reads the text as JSON
        print(json.dumps(seen))
    ''', layouts)
    assert seen["GridEnv UP"] == {"direction": "UP"}
    assert seen["GridEnv down"] == {"direction": "DOWN"}  # a member's name, any case
    assert seen['GridEnv "DOWN"'] == {"direction": "DOWN"}
    assert seen["GridEnv SIDEWAYS"] == (
        "GridAction rejected the text 'SIDEWAYS': direction: Input should be 'UP' or 'DOWN' (got 'SIDEWAYS'); "
        "'direction' takes Move: one of UP, DOWN, written as JSON or a member's name."
    )
    assert [seen[f"TurnEnv {t}"] for t in ("LEFT", "1", "right")] == [{"turn": 0}, {"turn": 1}, {"turn": 1}]
    assert "turn: Input should be 0 or 1 (got 5)" in seen["TurnEnv 5"]
    assert seen["ControlEnv [0.5, -0.5]"] == {"vector": [0.5, -0.5]}
    assert seen["ControlEnv  [1, 2]\n"] == {"vector": [1.0, 2.0]}
    # pydantic's own message, not its "For further information visit" line
    assert seen["ControlEnv fast"] == (
        "ControlAction rejected the text 'fast': vector: Input should be a valid list (got 'fast'); "
        "'vector' takes list[float], written as JSON."
    )
    assert seen["DriveEnv brake"] == {"action_type": "brake"}
    assert "action_type: Input should be 'brake', 'accelerate' or 'steer' (got 'fly')" in seen["DriveEnv fly"]
    # no one field takes the text: a JSON object of the fields is the whole Action
    assert seen['CarlaEnv {"throttle": 0.5, "brake": true}'] == {"throttle": 0.5, "steer": 0.0, "brake": True}
    assert "must be a JSON object of them" in seen["CarlaEnv go"] and "--action-field" in seen["CarlaEnv go"]
    assert "throttle: Input should be a valid number" in seen['CarlaEnv {"throttle": "x"}']
    assert seen["ToolEnv move"] == {"name": "move", "arguments": {}}
    assert seen['ToolEnv {"name": "move", "arguments": {"x": 1}}'] == {"name": "move", "arguments": {"x": 1}}
    assert seen["push"] == "pushed [0.5, -0.5]"
    assert not any("further information" in str(v) for v in seen.values())


@pytest.mark.slow
def test_env_check_steps_with_the_first_scripted_action(side_python: Path, layouts: Path) -> None:  # noqa: F811
    grid = run_agilerl(side_python, "env", "check", "layouts.py:GridEnv", "--actions", "UP,DOWN",
                       "--max-turns", "2", "--json", cwd=layouts)
    assert grid.returncode == 0, grid.stdout + grid.stderr
    summary = json.loads(grid.stdout)
    assert summary["problems"] == [] and summary["rewards"] == [2.0]
    assert not any("max_turns" in note for note in summary["notes"])  # --max-turns sets it
    control = run_agilerl(side_python, "env", "check", "layouts.py:ControlEnv", "--actions", "[0.5, -0.5],[1, 0]",
                          "--max-turns", "2", "--json", cwd=layouts)
    assert control.returncode == 0, control.stdout + control.stderr
    assert json.loads(control.stdout)["turns"] == [2]


TEXT_STEPS = textwrap.dedent('''
    import json
    from agilerl.remote.client import RemoteEnvClient

    def text_steps(url, texts, **options):  # an agilerl client's steps: the Actions seen, or the error
        out = []
        with RemoteEnvClient(url, observation_field="seen", request_timeout_s=60, **options) as client:
            client.reset()
            for text in texts:
                try:
                    out.append(json.loads(client.step(text)[0]))
                except Exception as exc:  # the server's VALIDATION_ERROR
                    out.append(f"{type(exc).__name__}: {exc}")
        return out
''')

SERVED = TEXT_STEPS + textwrap.dedent('''
    import subprocess, sys
    from openenv.core.generic_client import GenericEnvClient

    def start(*args):
        return subprocess.Popen([sys.executable, "-m", "agilerl", "serve", *args, "--port", "0"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def url_of(proc):
        line = next((l for l in proc.stdout if l.startswith("serving ")), None)
        assert line is not None, proc.stderr.read()
        return line.split(" at ")[1].split()[0]


    seen = {}
    procs = {  # all started at once: each start imports agilerl and openenv
        "carla": start("layouts.py:CarlaEnv"), "tool": start("layouts.py:ToolEnv"),
        "control": start("layouts.py:ControlEnv"),
        "flag": start("layouts.py:CarlaEnv", "--action-field", "steer"),
        "config": start("layouts.py:CarlaEnv", "--env-config", '{"action_field": "throttle"}'),
    }
    bad = subprocess.Popen([sys.executable, "-m", "agilerl", "serve", "layouts.py:CarlaEnv", "--action-field", "gas"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        servers = {key: url_of(proc) for key, proc in procs.items()}
        with GenericEnvClient(base_url=servers["carla"]).sync() as client:
            client.reset()
            seen["openenv_carla"] = json.loads(client.step({"throttle": 0.5, "brake": True}).observation["seen"])
        with GenericEnvClient(base_url=servers["tool"]).sync() as client:
            client.reset()
            seen["openenv_tool"] = json.loads(client.step({"name": "move", "arguments": {"x": 1}}).observation["seen"])
        seen["text_carla"] = text_steps(servers["carla"], ['{"brake": true}', "go"])
        seen["text_control"] = text_steps(servers["control"], ["[0.5, -0.5]"], action_field="vector")
        seen["flag"] = text_steps(servers["flag"], ["0.25"])
        seen["config"] = text_steps(servers["config"], ["0.75"])
    finally:
        for proc in procs.values():
            proc.terminate()
            proc.wait(30)
    seen["bad"] = [bad.wait(120), bad.stderr.read()]
    print(json.dumps(seen))
''')


@pytest.mark.slow
def test_serve_hosts_actions_with_no_text_field(side_python: Path, layouts: Path) -> None:  # noqa: F811
    (layouts / "served.py").write_text(SERVED)
    seen = run_script(side_python, "exec(open('served.py').read())", layouts)
    # OpenEnv's own client sends the fields: no text field is needed
    assert seen["openenv_carla"] == {"throttle": 0.5, "steer": 0.0, "brake": True}
    assert seen["openenv_tool"] == {"name": "move", "arguments": {"x": 1}}
    # an agilerl client sends text ({"message": text}), read as in process
    carla_ok, carla_bad = seen["text_carla"]
    assert carla_ok == {"throttle": 0.0, "steer": 0.0, "brake": True}
    assert "CarlaAction has several fields (throttle, steer, brake)" in carla_bad and "--action-field" in carla_bad
    assert seen["text_control"] == [{"vector": [0.5, -0.5]}]
    assert seen["flag"] == [{"throttle": 0.0, "steer": 0.25, "brake": False}]
    assert seen["config"] == [{"throttle": 0.75, "steer": 0.0, "brake": False}]
    code, stderr = seen["bad"]
    assert code == 2 and "action_field 'gas': CarlaAction has no such field (its fields: throttle, steer, brake)" in stderr


class _Count(BaseModel):
    count: int


class _ValidatesItsAction:
    """A text env whose step raises pydantic's ValidationError on text that is not a number."""

    max_turns = 2

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        return "a number?", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        return str(_Count(count=action).count), 1.0, True, False, {}


def test_a_validation_error_is_shown_by_its_field_and_message_in_process_and_served() -> None:
    from agilerl.envs.checker import check_env
    from agilerl.llm_envs.openenv import RemoteEnvClient
    from agilerl.llm_envs.openenv_server import resolve_env

    report = check_env(_ValidatesItsAction(), action="many", raise_on_error=False)
    expected = "count: Input should be a valid integer, unable to parse string as an integer (got 'many')"
    assert report.problems == [f"step('many') raised ValidationError: {expected}"]
    url, server = resolve_env(_ValidatesItsAction)
    with server, RemoteEnvClient(url, request_timeout_s=60) as client:
        client.reset()
        with pytest.raises(Exception) as raised:
            client.step("many")
    assert expected in str(raised.value) and "further information" not in str(raised.value)


def test_serve_and_env_check_take_every_adapter_option_as_a_flag() -> None:
    from agilerl.cli.args import ADAPTER_FLAGS
    from agilerl.envs.openenv_native import ADAPTER_OPTIONS

    assert [option for option, _ in ADAPTER_FLAGS] == list(ADAPTER_OPTIONS)


ON_OPENENV = TEXT_STEPS + textwrap.dedent('''
    import subprocess, sys, time, urllib.request
    from agilerl.ports import free_port

    SERVER = ("import sys, uvicorn, layouts; from openenv.core.env_server.http_server import create_app; "
              "app = create_app(getattr(layouts, sys.argv[1]), getattr(layouts, sys.argv[2]), layouts.Echo); "
              "uvicorn.run(app, host='127.0.0.1', port=int(sys.argv[3]), log_level='warning')")

    def serve(env, action):
        port = free_port()  # outside the ephemeral range: nothing takes it while the server imports
        proc = subprocess.Popen([sys.executable, "-c", SERVER, env, action, str(port)])
        return proc, f"http://127.0.0.1:{port}"

    def healthy(url, proc):
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                urllib.request.urlopen(url + "/health", timeout=2)
                return
            except OSError:
                time.sleep(0.2)
        raise SystemExit(f"{url} never answered /health")

    servers = {"control": serve("ControlEnv", "ControlAction"), "grid": serve("GridEnv", "GridAction"),
               "carla": serve("CarlaEnv", "CarlaAction"), "drive": serve("DriveEnv", "DriveAction")}
    try:
        for proc, url in servers.values():
            healthy(url, proc)
        seen = {
            "control": text_steps(servers["control"][1], ["[0.5, -0.5]", "fast"], action_field="vector"),
            "grid": text_steps(servers["grid"][1], ["down", '"UP"'], action_field="direction"),
            "carla": text_steps(servers["carla"][1], ['{"throttle": 0.5, "brake": true}']),
            "drive": text_steps(servers["drive"][1], ["brake"], action_field="action_type"),
        }
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(30)
    print(json.dumps(seen))
''')


@pytest.mark.slow
def test_on_openenvs_own_server_the_client_fills_each_field_from_the_text(side_python: Path, layouts: Path) -> None:  # noqa: F811
    """OpenEnv's server validates the fields as sent: the client reads its /schema and sends a
    list as a list, an enum by its value, a JSON object of fields as the whole Action."""
    (layouts / "on_openenv.py").write_text(ON_OPENENV)
    seen = run_script(side_python, "exec(open('on_openenv.py').read())", layouts)
    assert seen["control"][0] == {"vector": [0.5, -0.5]}
    assert seen["control"][1].startswith("RemoteEnvError")  # not a list: the server says so
    assert seen["grid"] == [{"direction": "DOWN"}, {"direction": "UP"}]
    assert seen["carla"] == [{"throttle": 0.5, "steer": 0.0, "brake": True}]
    assert seen["drive"] == [{"action_type": "brake"}]
