"""OpenEnv envs that show pictures, on openenv-core's real base classes (the side venv): BrowserGym's
nested ``screenshot`` and Atari's flat ``screen`` with ``screen_shape`` become images through
``image_field``, in process and served by ``agilerl serve``, with the same pixels either way."""

from __future__ import annotations

import hashlib
import textwrap
from pathlib import Path

import numpy as np
import pytest

from agilerl.remote.client import RemoteEnvClient
from tests.health import ASGI_ON_A_FREE_PORT, start_server
from tests.test_openenv_native import run_script, side_python  # noqa: F401 - the side venv fixture
from tests.test_remote_openenv import openenv_python  # noqa: F401

ENVS = textwrap.dedent('''
    from typing import List, Optional

    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State


    def frame(seed):
        return [[[(seed * 40 + x * 7 + y * 3 + c * 50) % 256 for c in range(3)] for x in range(12)] for y in range(8)]


    class ClickAction(Action):
        command: str


    class BrowserObservation(Observation):
        text: str = ""
        url: str = ""
        screenshot: Optional[List[List[List[int]]]] = None
        goal: str = ""


    class BrowserEnv(Environment):
        """BrowserGym's observation shape: a nested [height][width][channels] screenshot."""

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.seed = seed or 0
            return BrowserObservation(text="page", url="http://x", screenshot=frame(self.seed), goal="click")

        def step(self, action: ClickAction, timeout_s=None, **kwargs):
            return BrowserObservation(text=f"clicked {action.command}", screenshot=frame(self.seed + 1), reward=1.0, done=True)

        @property
        def state(self):
            return State()


    class AtariAction(Action):
        action_id: int = 0


    class AtariObservation(Observation):
        screen: List[int] = []
        screen_shape: List[int] = []
        lives: int = 3


    class AtariEnv(Environment):
        """Atari's observation shape: flat pixels with their shape beside them."""

        def reset(self, seed=None, episode_id=None, **kwargs):
            pixels = frame(seed or 0)
            return AtariObservation(screen=[v for row in pixels for px in row for v in px], screen_shape=[8, 12, 3])

        def step(self, action: AtariAction, timeout_s=None, **kwargs):
            return AtariObservation(screen=[0] * 288, screen_shape=[8, 12, 3], lives=2, done=True)

        @property
        def state(self):
            return State()
''')


def _frame_sha(seed: int) -> str:
    pixels = np.array(
        [[[(seed * 40 + x * 7 + y * 3 + c * 50) % 256 for c in range(3)] for x in range(12)] for y in range(8)],
        dtype=np.uint8,
    )
    return hashlib.sha256(pixels.tobytes()).hexdigest()


@pytest.fixture
def envs_dir(tmp_path: Path) -> Path:
    (tmp_path / "envs.py").write_text(ENVS)
    return tmp_path


IN_PROCESS = '''
    import hashlib, json
    import numpy as np
    from agilerl.envs.client import InProcessEnvClient
    from agilerl.envs.entrypoints import entrypoint_factory

    def sha(observation):
        return [hashlib.sha256(np.asarray(i.pil()).tobytes()).hexdigest() for i in observation.images]

    seen = {}
    for name, field in (("BrowserEnv", "screenshot"), ("AtariEnv", "screen")):
        client = InProcessEnvClient(entrypoint_factory(f"envs.py:{name}", {}, image_field=field)())
        prompt, _ = client.reset(seed=2)
        seen[name] = {"text": prompt.text, "images": sha(prompt), "size": list(prompt.images[0].size)}
        client.close()
    print(json.dumps(seen))
'''


def test_openenv_image_fields_become_images_in_process(side_python: Path, envs_dir: Path) -> None:  # noqa: F811
    seen = run_script(side_python, IN_PROCESS, envs_dir)
    assert seen["BrowserEnv"] == {"text": "page", "images": [_frame_sha(2)], "size": [12, 8]}
    assert seen["AtariEnv"]["images"] == [_frame_sha(2)] and "screen" not in seen["AtariEnv"]["text"]


OPENENV_SERVER = ASGI_ON_A_FREE_PORT + (
    "import sys, envs; from openenv.core.env_server.http_server import create_app\n"
    "serve(create_app(getattr(envs, sys.argv[1]), getattr(envs, sys.argv[2]), getattr(envs, sys.argv[3])), sys.argv[4])\n"
)
SERVED = {  # env: (its Action and Observation classes, image field, action field, what the step shows)
    "BrowserEnv": ("ClickAction", "BrowserObservation", "screenshot", "command", "clicked go"),
    "AtariEnv": ("AtariAction", "AtariObservation", "screen", "action_id", "lives: 2"),
}


@pytest.mark.parametrize("server", ["agilerl serve", "openenv create_app"])
@pytest.mark.parametrize("env", sorted(SERVED))
def test_served_openenv_image_fields_reach_the_client_as_the_same_pixels(
    side_python: Path, envs_dir: Path, env: str, server: str  # noqa: F811
) -> None:
    """BrowserGym's nested screenshot and Atari's flat screen, served by ``agilerl serve`` and by
    OpenEnv's own server: the client reads the field (``image_field``) into the env's pixels."""
    action_cls, observation_cls, image_field, action_field, shown = SERVED[env]
    url_file = envs_dir / "serve.url"
    if server == "agilerl serve":
        command = [str(side_python), "-m", "agilerl", "serve", f"envs.py:{env}", "--port", "0", "--port-file", str(url_file)]
    else:
        command = [str(side_python), "-c", OPENENV_SERVER, env, action_cls, observation_cls, str(url_file)]
    process, url = start_server(command, url_file, envs_dir / "serve.log", cwd=envs_dir)
    try:
        with RemoteEnvClient(url, image_field=image_field, action_field=action_field) as client:
            prompt, _ = client.reset(seed=2)
            observation, _, terminated, _, _ = client.step("1" if env == "AtariEnv" else "go")
        assert image_field not in prompt.text and f"{image_field}_shape" not in prompt.text
        assert [hashlib.sha256(np.asarray(i.pil()).tobytes()).hexdigest() for i in prompt.images] == [_frame_sha(2)]
        assert shown in observation.text and terminated
        step_frame = hashlib.sha256(bytes(8 * 12 * 3)).hexdigest() if env == "AtariEnv" else _frame_sha(3)  # black
        assert hashlib.sha256(np.asarray(observation.images[0].pil()).tobytes()).hexdigest() == step_frame
    finally:
        process.terminate()
        process.wait(30)
