"""OpenEnv's own environments as they are written, in process: their package layout, their
``reset`` signatures, their observations' shapes, and their wheels without ``openenv.yaml``.

Each env here is written on openenv-core's real base classes, shaped like one in OpenEnv's
``envs/`` folder (connect4, chess, openspiel, coding, repl, textarena, echo), and runs in the side
venv of ``tests/test_openenv_native.py``. Scripts run with ``python -P`` (no current folder on
``sys.path``), as the ``agilerl`` console script does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.test_openenv_native import run_agilerl, side_python  # noqa: F401 - the side venv fixture
from tests.test_remote_openenv import openenv_python  # noqa: F401 - side_python's own fixture

GAME_PACKAGE = {
    "games/tic_env/__init__.py": "",
    "games/tic_env/models.py": textwrap.dedent('''
        from openenv.core.env_server.types import Action, Observation


        class DropAction(Action):
            column: int


        class GridObservation(Observation):
            board: list[list[int]]
            legal_actions: list[int]


        class MoveAction(Action):
            move: str


        class BoardObservation(Observation):
            fen: str
            legal_moves: list[str]
            is_check: bool = False
            result: str | None = None
            episode: str = ""
    '''),
    "games/tic_env/server/__init__.py": "",
    # connect4's layout: relative import first, absolute when run from the env's folder; reset(self)
    "games/tic_env/server/drop_environment.py": textwrap.dedent('''
        from openenv.core.env_server import Environment
        from openenv.core.env_server.types import State

        try:
            from ..models import DropAction, GridObservation
        except ImportError:
            from models import DropAction, GridObservation


        class DropEnvironment(Environment):
            """Drop a piece in a column; three in a column wins."""

            def __init__(self):
                super().__init__()
                self.reset()

            def reset(self):
                self.board = [[0, 0, 0] for _ in range(3)]
                return GridObservation(board=self.board, legal_actions=[0, 1, 2])

            def step(self, action: DropAction):
                column = action.column
                row = max(r for r in range(3) if self.board[r][column] == 0)
                self.board[row][column] = 1
                won = row == 0
                return GridObservation(board=self.board, legal_actions=[c for c in range(3) if self.board[0][c] == 0],
                                       reward=float(won), done=won)

            @property
            def state(self):
                return State()
    '''),
    # chess's: absolute sibling import only, reset(self, fen=None), step annotated with the base
    # Action (openspiel's), a random episode id that seeds nothing
    "games/tic_env/server/board_environment.py": textwrap.dedent('''
        import uuid

        from openenv.core.env_server import Action, Environment
        from openenv.core.env_server.types import State

        from models import BoardObservation, MoveAction


        class BoardEnvironment(Environment):
            def __init__(self):
                super().__init__()
                self.reset()

            def reset(self, fen: str = None):
                self.fen = fen or "start"
                return BoardObservation(fen=self.fen, legal_moves=["e2e4", "d2d4"], episode=str(uuid.uuid4()))

            def step(self, action: Action):
                if not isinstance(action, MoveAction):
                    raise ValueError(f"Expected MoveAction, got {type(action)}")
                done = action.move == "e2e4"
                return BoardObservation(fen=f"{self.fen} {action.move}", legal_moves=[], done=done,
                                        result="1-0" if done else None, reward=1.0 if done else -0.1)

            @property
            def state(self):
                return State()
    '''),
}


@pytest.fixture
def games(tmp_path: Path) -> Path:
    """An OpenEnv repository's ``envs/`` folder in miniature: ``games/tic_env/{models.py,server/}``."""
    for name, text in GAME_PACKAGE.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "elsewhere").mkdir()
    return tmp_path


def run_isolated(python: Path, code: str, cwd: Path, env: dict[str, str] | None = None) -> object:
    """Run ``code`` with ``python -P`` (the current folder is not importable) in ``cwd``; its last
    stdout line is JSON, returned parsed."""
    done = subprocess.run([str(python), "-P", "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=180, env={**os.environ, **(env or {})})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_openenv_package_layouts_and_reset_signatures(side_python: Path, games: Path) -> None:  # noqa: F811
    seen = run_isolated(side_python, '''
        import json, sys
        from pathlib import Path
        from agilerl.envs.checker import check_env
        from agilerl.envs.entrypoints import entrypoint_factory
        from agilerl.assembly.env_factory import make_env_factory
        from agilerl.manifest.spec import parse_env_spec

        out = {"cwd_importable": "" in sys.path or "." in sys.path}
        # a file of a package, relative imports (connect4's layout), reset(self)
        drop = entrypoint_factory("games/tic_env/server/drop_environment.py:DropEnvironment")()
        out["drop"] = [drop.action_field, drop.reset(seed=3)[0], drop.step("1")[:3], type(drop.env).__module__]
        out["described"] = [type(drop).__doc__]  # /metadata's description: the env's docstring
        # a file of a package, absolute sibling import only (chess's standalone form), reset(fen=None)
        board = entrypoint_factory("games/tic_env/server/board_environment.py:BoardEnvironment")()
        board.reset(seed=1, fen="8/8")
        out["board"] = [board.action_type.__name__, board.action_field, board.step("e2e4")[:3]]
        out["described"].append(type(board).__doc__)  # none: OpenEnv's default, "<Name> environment"
        # module:attr, found from the manifest's folder (games/), not from the current one
        spec = parse_env_spec({"env_type": "rollout", "entrypoint": "tic_env.server.drop_environment:DropEnvironment"})
        out["module_attr"] = type(make_env_factory(spec, base_dir=Path("games").resolve())().env).__name__
        report = check_env(entrypoint_factory("games/tic_env/server/board_environment.py:BoardEnvironment")(),
                           action="e2e4", raise_on_error=False, strict=True)
        out["strict"] = [p.split(":")[0] for p in report.problems]
        print(json.dumps(out))
    ''', games)
    assert seen["cwd_importable"] is False
    assert seen["drop"] == [
        "column",  # DropAction's one required field takes the text, coerced to int
        "board:\n[0,0,0]\n[0,0,0]\n[0,0,0]\nlegal_actions: [0,1,2]",  # every field: no field is the text
        ["board:\n[0,0,0]\n[0,0,0]\n[0,1,0]\nlegal_actions: [0,1,2]", 0.0, False],
        "tic_env.server.drop_environment",  # imported as part of its package
    ]
    assert seen["board"] == ["MoveAction", "move", ['fen: 8/8 e2e4\nlegal_moves: []\nis_check: false\nresult: 1-0', 1.0, True]]
    assert seen["described"] == ["Drop a piece in a column; three in a column wins.", "BoardEnvironment environment"]
    assert seen["module_attr"] == "DropEnvironment"
    assert seen["strict"] == ["reset(seed=0) is not reproducible"]


def test_env_check_warns_of_an_unseeded_openenv_env_and_passes(side_python: Path, games: Path) -> None:  # noqa: F811
    """The console script (no current folder on its path) finds ``module:attr`` in the current folder."""
    agilerl = side_python.parent / "agilerl"
    done = subprocess.run([str(agilerl), "env", "check", "tic_env.server.board_environment:BoardEnvironment",
                           "--actions", "d2d4,e2e4", "--json"], cwd=games / "games", capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["problems"] == [] and summary["errors"] == []
    assert [w.split(":")[0] for w in summary["warnings"]] == ["reset(seed=0) is not reproducible"]
    assert summary["warnings"][0].endswith("its reset() takes no seed")
    assert "played 5 turns an episode; --max-turns N to change" in summary["notes"]
    assert (summary["turns"], summary["rewards"], summary["terminated"]) == ([2], [0.9], 1)


OBSERVATIONS = '''
    import json
    from openenv.core.env_server.mcp_types import CallToolObservation, ToolError, ToolErrorType
    from openenv.core.env_server.types import Observation
    from pydantic import BaseModel
    from agilerl.envs.observations import default_text
    from agilerl.envs.openenv_native import observation_payload


    class OpenSpielObservation(Observation):
        info_state: list[float]
        legal_actions: list[int]
        game_phase: str = "playing"
        current_player_id: int = 0
        opponent_last_action: int | None = None


    class TextArenaMessage(BaseModel):
        sender_id: int
        content: str
        category: str


    class TextArenaObservation(Observation):
        prompt: str
        messages: list[TextArenaMessage] = []
        current_player_id: int = 0
        legal_players: list[int] = []
        info: dict = {}


    class CodeObservation(Observation):
        stdout: str = ""
        stderr: str = ""
        exit_code: int = 0


    class CodeBlockResult(BaseModel):
        stdout: str = ""
        stderr: str = ""
        locals_snapshot: dict[str, str] = {}
        execution_time: float = 0.0
        success: bool = True
        exception: str | None = None


    class REPLObservation(Observation):
        result: CodeBlockResult = CodeBlockResult()
        context_preview: str | None = None
        context_length: int = 0
        available_variables: list[str] = []
        iteration: int = 0
        max_iterations: int = 30


    class EchoObservation(Observation):
        echoed_message: str
        message_length: int = 0


    shapes = {
        "openspiel": OpenSpielObservation(info_state=[0.0, 1.0], legal_actions=[0, 2], game_phase="playing"),
        "textarena": TextArenaObservation(prompt="GuessTheNumber-v0", messages=[
            TextArenaMessage(sender_id=-1, content="[GAME] Your guess 50 is too high.", category="MESSAGE")]),
        "coding_ok": CodeObservation(stdout="42\\n"),
        "coding_error": CodeObservation(stderr="Traceback (most recent call last):\\nZeroDivisionError: division by zero\\n",
                                        exit_code=1),
        "repl_error": REPLObservation(result=CodeBlockResult(stdout="partial\\n", success=False,
                                                             exception="ZeroDivisionError: division by zero"),
                                      available_variables=["context"], iteration=1),
        "echo": EchoObservation(echoed_message="hi", message_length=2),
        "mcp_error": CallToolObservation(tool_name="run", result=None, error=ToolError(
            error_type=ToolErrorType.EXECUTION_ERROR, message="bad input")),
        "reset_only": Observation(metadata={"seed": 1}),
    }
    print(json.dumps({name: default_text(observation_payload(obs)) for name, obs in shapes.items()}))
'''


def test_default_observation_text_on_openenv_observation_shapes(side_python: Path, tmp_path: Path) -> None:  # noqa: F811
    assert run_isolated(side_python, OBSERVATIONS, tmp_path) == {
        # no field is obviously the text: every field, never the constant game_phase alone
        "openspiel": "info_state: [0.0,1.0]\nlegal_actions: [0,2]\ngame_phase: playing\ncurrent_player_id: 0",
        # the game's feedback is in messages; the prompt only names the game after turn 1
        "textarena": "[GAME] Your guess 50 is too high.",
        "coding_ok": "42\n",
        "coding_error": "stderr:\nTraceback (most recent call last):\nZeroDivisionError: division by zero\nexit code: 1",
        "repl_error": "partial\nexception: ZeroDivisionError: division by zero",
        "echo": "hi",  # echoed_message is named like a text field
        "mcp_error": "Error: bad input",
        "reset_only": "",
    }


def _wheel(folder: Path, distribution: str, files: dict[str, str]) -> Path:
    """A wheel as a build backend writes one (no openenv.yaml in it, as OpenEnv's envs build)."""
    project = distribution.replace("-", "_")
    info = f"{project}-0.1.0.dist-info"
    metadata = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {distribution}\nVersion: 0.1.0\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    path = folder / f"{project}-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, text in {**files, **metadata}.items():
            wheel.writestr(name, text)
        wheel.writestr(f"{info}/RECORD", "".join(f"{name},,\n" for name in [*files, *metadata, f"{info}/RECORD"]))
    return path


PARROT = {
    "parrot_env/__init__.py": "",
    "parrot_env/models.py": "from openenv.core.env_server.types import Action, Observation\n\n\n"
    "class ParrotAction(Action):\n    message: str\n\n\nclass ParrotObservation(Observation):\n"
    "    echoed_message: str = ''\n",
    "parrot_env/server/__init__.py": "",
    "parrot_env/server/parrot_environment.py": textwrap.dedent('''
        from openenv.core.env_server.interfaces import Environment
        from openenv.core.env_server.types import State

        from ..models import ParrotAction, ParrotObservation


        class ParrotEnvironment(Environment):
            """Says back what it hears."""

            def reset(self):
                return ParrotObservation(echoed_message="ready")

            def step(self, action: ParrotAction):
                return ParrotObservation(echoed_message=action.message, reward=1.0, done=True)

            @property
            def state(self):
                return State()
    '''),
    "parrot_env/server/app.py": textwrap.dedent('''
        try:
            from openenv.core.env_server.http_server import create_app
            from ..models import ParrotAction, ParrotObservation
            from .parrot_environment import ParrotEnvironment
        except ImportError:
            from openenv.core.env_server.http_server import create_app
            from models import ParrotAction, ParrotObservation
            from server.parrot_environment import ParrotEnvironment

        app = create_app(ParrotEnvironment, ParrotAction, ParrotObservation, env_name="parrot_env")
    '''),
}


def test_a_wheel_installed_openenv_package_without_yaml_is_found(side_python: Path, tmp_path: Path) -> None:  # noqa: F811
    site = tmp_path / "site"
    wheel = _wheel(tmp_path, "openenv-parrot-env", PARROT)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--disable-pip-version-check", "--target", str(site), str(wheel)], check=True)
    assert not list(site.rglob("openenv.yaml"))
    env = {"PYTHONPATH": str(site)}
    listed = subprocess.run([sys.executable, "-m", "agilerl", "envs", "list", "--json"], capture_output=True,
                            text=True, env={**os.environ, **env}, timeout=120)
    assert listed.returncode == 0, listed.stderr
    parrot = [row for row in json.loads(listed.stdout) if row["name"] == "parrot"]
    assert [(r["description"], r["distribution"]) for r in parrot] == [("OpenEnv env: parrot_env environment",
                                                                        "openenv-parrot-env")]
    done = run_agilerl(side_python, "env", "check", "parrot", "--actions", "polly", "--json", cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert (summary["env"], summary["problems"], summary["rewards"]) == ("ParrotEnvironment", [], [1.0])


def test_action_type_is_a_field_of_an_entrypoint() -> None:
    from agilerl.errors import ConfigError
    from agilerl.manifest.spec import parse_env_spec

    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "envs.py:Env", "action_type": "models:MoveAction"})
    assert spec.action_type == "models:MoveAction"
    with pytest.raises(ConfigError, match="'action_type' applies only with an OpenEnv 'entrypoint'"):
        parse_env_spec({"env_type": "rollout", "env_url": "ws://127.0.0.1:1", "action_type": "models:MoveAction"})
