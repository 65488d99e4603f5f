"""agilerl plugin: reasoning-gym's procedural datasets as dataset-backed rollout envs.

Registration names ``"module:attr"`` targets, so listing plugins never imports reasoning-gym.
"""

from __future__ import annotations

from collections.abc import Callable

from agilerl import hookimpl


@hookimpl
def register_envs(register: Callable[..., None]) -> None:
    register(
        "reasoning-gym",
        "agilerl_env_reasoning_gym.env:make_env",
        description="A reasoning-gym dataset (env_config: dataset, size, seed, config).",
    )


@hookimpl
def register_rubrics(register: Callable[..., None]) -> None:
    register(
        "reasoning-gym",
        "agilerl_env_reasoning_gym.env:score",
        description="reasoning-gym's own scorer for the row's dataset, on the <answer> block.",
    )
