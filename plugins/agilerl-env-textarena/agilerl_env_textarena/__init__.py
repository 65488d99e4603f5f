"""agilerl plugin: TextArena's single-player games, adapted to the text protocol.

Registration never imports ``textarena`` (over a second of imports); :class:`TextArenaEnv`
imports it when the first env is built.
"""

from __future__ import annotations

from functools import partial

from agilerl import hookimpl
from agilerl_env_textarena.env import GAMES, TextArenaEnv


@hookimpl
def register_envs(register):
    register(
        "textarena",
        TextArenaEnv,
        description="Any single-player TextArena env: env_config {env_id: 'Sudoku-v0'}.",
    )
    for name, env_id in GAMES.items():
        register(name, partial(TextArenaEnv, env_id), description=f"TextArena {env_id}")
