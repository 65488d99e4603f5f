"""OpenEnv-native envs in process: an ``Environment`` subclass named as an entrypoint (a file, a
manifest, an installed OpenEnv package) runs as a text env, the classic kind and the MCP kind.

The envs below subclass openenv-core's real base classes, so they run in the side venv of
``tests/test_remote_openenv.py`` (openenv-core installed), with this project installed there
without its heavy extras; each check is a script or an ``agilerl`` command run by that python.
Without openenv-core (this venv), listing still works and naming such an env says the extra.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agilerl.cli.main import main
from tests.test_remote_openenv import openenv_python  # noqa: F401 - the side venv fixture

ROOT = Path(__file__).resolve().parent.parent
LIGHT_DEPS = ("pluggy", "importlib-metadata", "aiohttp", "uv")

ENVS = textwrap.dedent('''
    from fastmcp import FastMCP
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.mcp_environment import MCPEnvironment
    from openenv.core.env_server.types import Action, Observation, State


    class WordAction(Action):
        word: str


    class WordObservation(Observation):
        message: str = ""
        letters: int = 0


    class WordEnv(Environment):
        """Guess the fruit; the episode ends on the right word."""

        closed = 0

        def __init__(self, secret="kiwi"):
            super().__init__()
            self.secret = secret
            self._state = State(step_count=0)

        def reset(self, seed=None, episode_id=None, **kwargs):
            self._state = State(episode_id=episode_id, step_count=0)
            return WordObservation(message=f"Guess a fruit (seed {seed}).", metadata={"seed": seed})

        def step(self, action: WordAction, timeout_s=None, **kwargs):
            self._state.step_count += 1
            won = action.word.strip() == self.secret
            return WordObservation(
                message="yes" if won else f"no, not {action.word}", letters=len(action.word),
                reward=1.0 if won else 0.0, done=won, metadata={"turn": self._state.step_count},
            )

        @property
        def state(self):
            return self._state

        def close(self):
            type(self).closed += 1


    class NoteAction(Action):
        word: str
        note: str = ""


    class NoteEnv(Environment[NoteAction, WordObservation, State]):
        """Its step is not annotated: the Action type comes from Environment[...]."""

        def reset(self, seed=None, episode_id=None, **kwargs):
            return WordObservation(message="write")

        def step(self, action, timeout_s=None, **kwargs):
            return WordObservation(message=f"{action.word}|{action.note}", reward=0.5)

        @property
        def state(self):
            return State()


    class CalcEnv(MCPEnvironment):
        """One MCP tool, run(code)."""

        def __init__(self):
            mcp = FastMCP("calc")

            @mcp.tool
            def run(code: str) -> str:
                """Evaluate an arithmetic expression."""
                return str(eval(code, {"__builtins__": {}}))

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


@pytest.fixture(scope="session")
def side_python(openenv_python: Path) -> Path:  # noqa: F811 - the imported fixture
    """The openenv side venv's python, with this project installed (editable, light deps only)."""
    probe = [str(openenv_python), "-c", "import agilerl, pluggy, importlib_metadata, aiohttp; print(agilerl.__file__)"]
    found = subprocess.run(probe, check=False, capture_output=True, text=True, cwd="/")
    if found.returncode != 0 or Path(found.stdout.strip()) != ROOT / "agilerl" / "__init__.py":
        pip = [str(openenv_python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        subprocess.run([*pip, *LIGHT_DEPS], check=True)
        subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    return openenv_python


@pytest.fixture
def envs_dir(tmp_path: Path) -> Path:
    (tmp_path / "envs.py").write_text(ENVS)
    return tmp_path


def run_script(python: Path, code: str, cwd: Path, env: dict[str, str] | None = None) -> object:
    """Run ``code`` with ``python`` in ``cwd``; its last stdout line is JSON, returned parsed."""
    done = subprocess.run(
        [str(python), "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True, text=True, timeout=180,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_agilerl(python: Path, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "agilerl", *args], cwd=cwd, capture_output=True, text=True, timeout=180,
        env={**os.environ, **(env or {})},
    )


def test_a_word_env_plays_as_a_text_env(side_python: Path, envs_dir: Path) -> None:
    seen = run_script(side_python, '''
        import json, sys
        from agilerl.envs.client import InProcessEnvClient
        from agilerl.envs.entrypoints import entrypoint_factory

        client = InProcessEnvClient(entrypoint_factory("envs.py:WordEnv", {"secret": "fig"})())
        first = client.reset(seed=3)
        miss, hit = client.step("apple"), client.step("fig")
        state = client.state()
        client.close(); client.close()
        envs = sys.modules[type(client.env.env).__module__]
        print(json.dumps({"name": client.name, "field": client.env.action_field, "first": first,
                          "miss": miss, "hit": hit, "state": state, "closed": envs.WordEnv.closed}))
    ''', envs_dir)
    assert seen == {
        "name": "WordEnv",
        "field": "word",  # no 'message' field: the Action's one required field takes the text
        "first": ["Guess a fruit (seed 3).", {"seed": 3}],
        "miss": ["no, not apple", 0.0, False, False, {"turn": 1}],
        "hit": ["yes", 1.0, True, False, {"turn": 2}],
        "state": {"episode_id": None, "step_count": 2},
        "closed": 1,
    }


def test_env_check_plays_an_openenv_class(side_python: Path, envs_dir: Path) -> None:
    done = run_agilerl(side_python, "env", "check", "envs.py:WordEnv", "--actions", "apple,kiwi",
                       "--max-turns", "4", "--json", cwd=envs_dir)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["env"], summary["problems"], summary["errors"]) == ("WordEnv", [], [])
    assert (summary["turns"], summary["rewards"], summary["terminated"]) == ([2], [1.0], 1)


def test_a_manifest_entrypoint_with_adapter_options(side_python: Path, envs_dir: Path) -> None:
    (envs_dir / "manifest.yaml").write_text(textwrap.dedent('''
        environment:
          env_type: rollout
          entrypoint: envs.py:WordEnv
          max_turns: 3
          observation_field: letters
          env_config: {secret: plum}
    '''))
    done = run_agilerl(side_python, "env", "check", "manifest.yaml", "--actions", "grape,plum", "--json", cwd=envs_dir)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["rewards"] == [1.0]
    seen = run_script(side_python, '''
        import json
        from agilerl.envs.entrypoints import entrypoint_factory

        letters = entrypoint_factory("envs.py:WordEnv", observation_field="letters")()
        errors = []
        for name, config, options in [("WordEnv", {}, {"action_field": "guess"}), ("NoteEnv", {}, {"action_field": "note"}),
                                      ("WordEnv", {"secret": "fig", "action_field": "word"}, {})]:
            try:
                entrypoint_factory(f"envs.py:{name}", config, **options)
            except ValueError as exc:  # OpenEnvAdapterError/InvalidArgument, raised before any env is built
                errors.append(str(exc))
        print(json.dumps({"letters": letters.step("grape")[0], "errors": errors}))
    ''', envs_dir)
    assert seen["letters"] == "5"  # observation_field reads a non-text field as JSON
    assert seen["errors"] == [
        "action_field 'guess': WordAction has no such field (its fields: word); set action_field to one of them.",
        "NoteAction also requires word, but the model's text fills one field ('note'); give them defaults, "
        "or write a small text env around this one.",
        "env_config.action_field: env_config holds WordEnv's own arguments and it takes no action_field; the "
        "adapter's options are fields of the manifest's environment: section (action_field: word), keywords of "
        "entrypoint_factory(), or --action-field for agilerl env check and agilerl serve.",
    ]


def test_the_action_type_comes_from_the_generic_base(side_python: Path, envs_dir: Path) -> None:
    seen = run_script(side_python, '''
        import json
        from agilerl.envs.entrypoints import entrypoint_factory

        env = entrypoint_factory("envs.py:NoteEnv")()
        print(json.dumps({"type": env.action_type.__name__, "field": env.action_field,
                          "reset": env.reset(), "step": env.step("hi")}))
    ''', envs_dir)
    assert seen == {"type": "NoteAction", "field": "word", "reset": ["write", {}], "step": ["hi|", 0.5, False, False, {}]}


def test_an_mcp_env_steps_through_its_tool(side_python: Path, envs_dir: Path) -> None:
    seen = run_script(side_python, '''
        import json
        from agilerl.envs.entrypoints import entrypoint_factory

        env = entrypoint_factory("envs.py:CalcEnv")()  # one tool, one argument: both found
        named = entrypoint_factory("envs.py:CalcEnv", mcp_tool="run", action_field="code")()
        wrong = entrypoint_factory("envs.py:CalcEnv", mcp_tool="eval")()
        wrong.reset()
        try:
            wrong.step("1")
        except ValueError as exc:
            error = str(exc)
        out = {"reset": env.reset(seed=2), "ok": env.step("6*7"), "bad": env.step("1/0")[0],
               "target": [env.mcp_tool, env.action_field], "named": named.step("2+2")[0], "error": error}
        env.close(); named.close(); wrong.close()
        print(json.dumps(out))
    ''', envs_dir)
    assert seen["reset"] == ["", {"seed": 2}]
    assert seen["ok"] == ["42", 0.0, False, False, {}]
    assert seen["bad"].startswith("Error: ") and "division by zero" in seen["bad"]
    assert seen["target"] == ["run", "code"]
    assert seen["named"] == "4"
    assert seen["error"] == "mcp_tool 'eval': CalcEnv has no such tool (its tools: run)."


FRUIT_PACKAGE = {
    "fruit_env/__init__.py": "import pathlib, os\npathlib.Path(os.environ['FRUIT_IMPORTED']).touch()\n",
    "fruit_env/openenv.yaml": "spec_version: 1\nname: fruit_env\ntype: space\nruntime: fastapi\n"
    "app: server.app:app\nport: 8000\ndescription: Guess the fruit\n",
    "fruit_env/models.py": "from openenv.core.env_server.types import Action, Observation\n\n\n"
    "class FruitAction(Action):\n    word: str\n\n\nclass FruitObservation(Observation):\n    message: str = ''\n",
    "fruit_env/server/__init__.py": "",
    "fruit_env/server/fruit_environment.py": textwrap.dedent('''
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import State
        from fruit_env.models import FruitObservation


        class FruitEnvironment(Environment):
            def reset(self, seed=None, episode_id=None, **kwargs):
                return FruitObservation(message="Name a fruit.")

            def step(self, action, timeout_s=None, **kwargs):  # unannotated: create_app's action_cls
                return FruitObservation(message=action.word, reward=float(action.word == "kiwi"),
                                        done=action.word == "kiwi")

            @property
            def state(self):
                return State()
    '''),
    "fruit_env/server/app.py": textwrap.dedent('''
        from openenv.core.env_server.http_server import create_app
        from fruit_env.models import FruitAction, FruitObservation
        from fruit_env.server.fruit_environment import FruitEnvironment

        app = create_app(FruitEnvironment, FruitAction, FruitObservation, env_name="fruit_env")
    '''),
}


@pytest.fixture
def fruit_site(tmp_path: Path) -> Path:
    """An installed ``openenv-fruit_env`` as pip lays one out: the package and its dist-info."""
    site = tmp_path / "site"
    for name, text in FRUIT_PACKAGE.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_text(text)
    info = site / "openenv_fruit_env-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: openenv-fruit_env\nVersion: 0.1.0\n")
    (info / "RECORD").write_text("".join(f"{name},,\n" for name in FRUIT_PACKAGE) + f"{info.name}/METADATA,,\n")
    return site


def test_an_installed_openenv_package_is_listed_without_importing_it(fruit_site: Path, tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    env = {"PYTHONPATH": str(fruit_site), "FRUIT_IMPORTED": str(marker)}
    done = subprocess.run([sys.executable, "-m", "agilerl", "envs", "list", "--json"], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=120)
    assert done.returncode == 0, done.stderr
    fruit = [row for row in json.loads(done.stdout) if row["name"] == "fruit"]
    assert fruit == [{
        "name": "fruit", "kind": "env", "target": "fruit_env.server.app (OpenEnv package openenv-fruit_env)",
        "description": "OpenEnv env: Guess the fruit", "plugin": "openenv-fruit_env",
        "distribution": "openenv-fruit_env", "version": "0.1.0", "conflict": False,
    }]
    assert not marker.exists()


@pytest.mark.skipif(importlib.util.find_spec("openenv") is not None, reason="openenv-core is installed here")
def test_without_openenv_core_naming_an_openenv_env_says_the_extra(
    fruit_site: Path, envs_dir: Path, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(fruit_site), "FRUIT_IMPORTED": str(tmp_path / "imported")}
    (envs_dir / "word.py").write_text("from openenv.core.env_server.interfaces import Environment\n")
    fix = "needs the 'openenv' extra (openenv is not installed): pip install 'agilerl-envlayer[openenv]'"
    for source, what in [("fruit", "OpenEnv env 'fruit' (openenv-fruit_env)"), ("word.py:Environment", "env 'word.py:Environment'")]:
        done = subprocess.run([sys.executable, "-m", "agilerl", "env", "check", source], capture_output=True,
                              text=True, env=env, cwd=envs_dir, timeout=120)
        assert (done.returncode, done.stderr) == (2, f"error: {what} {fix}\n")


def test_an_installed_openenv_package_runs_by_name(side_python: Path, fruit_site: Path, tmp_path: Path) -> None:
    env = {"PYTHONPATH": str(fruit_site), "FRUIT_IMPORTED": str(tmp_path / "imported")}
    done = run_agilerl(side_python, "env", "check", "fruit", "--actions", "fig,kiwi", "--max-turns", "3",
                       "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["env"], summary["problems"], summary["rewards"]) == ("FruitEnvironment", [], [1.0])


def test_import_agilerl_never_imports_openenv(side_python: Path, envs_dir: Path) -> None:
    seen = run_script(side_python, '''
        import json, sys
        import agilerl, agilerl.envs.entrypoints, agilerl.registry
        from agilerl.cli.main import build_parser
        build_parser().format_help()
        agilerl.registry.get_registry()
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in ("openenv", "fastmcp"))))
    ''', envs_dir)
    assert seen == []


def test_openenv_options_reach_only_openenv_envs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "plain.py").write_text(
        "class Plain:\n    max_turns = 1\n    def __init__(self, action_field='x'):\n        self.f = action_field\n"
        "    def reset(self, seed=None):\n        return self.f, {}\n    def step(self, a):\n        return a, 0.0, True, False, {}\n"
    )
    from agilerl.envs.entrypoints import entrypoint_factory

    # a text env keeps every env_config key: 'action_field' here is its own argument
    assert entrypoint_factory("plain.py:Plain", {"action_field": "y"}, base_dir=tmp_path)().reset() == ("y", {})
    assert main(["env", "check", str(tmp_path / "plain.py:Plain"), "--env-config", '{"action_field": "z"}', "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["problems"] == []


HOST = '''
    import json, subprocess, sys, urllib.request
    from openenv.core.generic_client import GenericEnvClient

    cases = json.loads(sys.argv[1])  # [[entrypoint, actions], ...]: the servers start at once
    servers = [subprocess.Popen([sys.executable, "-m", "agilerl", "serve", entrypoint, "--port", "0"],
                                stdout=subprocess.PIPE, text=True) for entrypoint, _ in cases]
    seen = []
    try:
        for server, (_, actions) in zip(servers, cases):
            line = next(l for l in server.stdout if l.startswith("serving "))
            url = line.split(" at ")[1].split()[0]
            schema = json.load(urllib.request.urlopen(url + "/schema"))
            with GenericEnvClient(base_url=url).sync() as client:
                first = client.reset(seed=5)
                steps = [client.step(action) for action in actions]
                state = client.state()
            seen.append({
                "schema": sorted(schema["action"]["properties"]),
                "reset": first.observation, "steps": [[s.observation, s.reward, s.done] for s in steps],
                "state": state,
            })
    finally:
        for server in servers:
            server.terminate()
            server.wait(30)
    print(json.dumps(seen, default=str))
'''


def test_an_openenv_env_is_hosted_with_its_own_fields(side_python: Path, envs_dir: Path) -> None:
    """`agilerl serve` of an OpenEnv class: openenv's GenericEnvClient speaks the env's own fields."""
    (envs_dir / "host.py").write_text(textwrap.dedent(HOST))
    cases = [["envs.py:WordEnv", [{"word": "fig"}, {"word": "kiwi"}]],
             ["envs.py:CalcEnv", [{"type": "call_tool", "tool_name": "run", "arguments": {"code": "6*7"}}]]]
    hosted = subprocess.run([str(side_python), "host.py", json.dumps(cases)], cwd=envs_dir,
                            capture_output=True, text=True, timeout=180)
    assert hosted.returncode == 0, hosted.stderr[-3000:]
    word, calc = json.loads(hosted.stdout.strip().splitlines()[-1])
    assert word["schema"] == ["metadata", "word"]
    assert word["reset"] == {"message": "Guess a fruit (seed 5).", "letters": 0}
    assert word["steps"] == [[{"message": "no, not fig", "letters": 3}, 0.0, False],
                             [{"message": "yes", "letters": 4}, 1.0, True]]
    assert word["state"] == {"episode_id": None, "step_count": 2}
    (observation, reward, done), = calc["steps"]
    assert (observation["tool_name"], observation["error"], reward, done) == ("run", None, None, False)
    assert observation["result"]["data"] == "42"
