"""agilerl plugin: GEM's text games, one registered name per game and difficulty.

Registration never imports ``gem`` (a second of imports): the targets are partials of
:class:`GemEnv`, which imports it when the first env is built.
"""

from __future__ import annotations

from functools import partial

from agilerl import hookimpl
from agilerl_env_gem.env import GAMES, GemEnv


@hookimpl
def register_envs(register):
    register("gem", GemEnv, description="Any GEM env: env_config {env_id: 'game:Wordle-v0-easy'}.")
    for name, env_id in GAMES.items():
        register(name, partial(GemEnv, env_id), description=f"GEM {env_id}")
