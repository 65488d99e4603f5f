"""From an env name (registered, ``module:attr`` or ``file.py:attr``) to a zero-argument factory.

The server builds one env per session with it; ``agilerl.factory`` adds the manifest's other
sources (URLs, datasets) on top.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agilerl.errors import AgileRLError
from agilerl.registry import resolve

EnvFactory = Callable[[], Any]


def entrypoint_factory(
    entrypoint: str | Callable[..., Any],
    env_config: dict[str, Any] | None = None,
    *,
    base_dir: str | Path | None = None,
    install: list[str] | None = None,
) -> EnvFactory:
    """A factory calling ``entrypoint(**env_config)``; ``system_prompt`` is set after construction."""
    target = entrypoint
    if isinstance(entrypoint, str):
        target = resolve("env", entrypoint, base_dir=base_dir, install=install)
    if not callable(target):
        raise AgileRLError(
            f"entrypoint {entrypoint!r} resolved to {type(target).__name__}, which is not callable; "
            "name an env class or a function that returns an env"
        )
    config = dict(env_config or {})
    system_prompt = config.pop("system_prompt", None)

    def build() -> Any:
        env = target(**config)
        if system_prompt is not None:
            env.system_prompt = system_prompt
        return env

    return build
