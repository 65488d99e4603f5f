"""The in-process env client: a text env called directly, with its outputs checked."""

from __future__ import annotations

import math
from typing import Any

from agilerl.errors import EnvProtocolError
from agilerl.protocol import StepResult, close_env, reset_env
from agilerl.errors import AgileRLError


class EnvClient:
    """Base of the env clients (in-process and remote): the text-env interface plus ``state``.

    The harness wraps anything that is not an ``EnvClient`` in an ``InProcessEnvClient``.
    """

    def reset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        raise NotImplementedError

    def step(self, action: str) -> StepResult:
        raise NotImplementedError

    def state(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class InProcessEnvClient(EnvClient):
    """Wraps a text env living in this process; the same interface as ``RemoteEnvClient``."""

    def __init__(self, env: Any) -> None:
        self.env = env
        self._closed = False

    @property
    def name(self) -> str:
        return type(self.env).__name__

    def __getattr__(self, item: str) -> Any:
        # Optional protocol members (tools, dataset_size, max_turns, system_prompt) pass through.
        if item.startswith("_") or item == "env":
            raise AttributeError(item)
        return getattr(self.env, item)

    def reset(
        self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None
    ) -> tuple[str, dict[str, Any]]:
        result = reset_env(self.env, seed, row_index=row_index, evaluation=evaluation)
        if not (isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], str)):
            raise EnvProtocolError(
                f"{self.name}.reset() must return (prompt: str, info: dict), got {_describe(result)}"
            )
        return result[0], dict(result[1] or {})

    def step(self, action: str) -> StepResult:
        result = self.env.step(action)
        if not (isinstance(result, tuple) and len(result) == 5):
            raise EnvProtocolError(
                f"{self.name}.step() must return (observation, reward, terminated, truncated, "
                f"info), got {_describe(result)}"
            )
        observation, reward, terminated, truncated, info = result
        if not isinstance(observation, str):
            raise EnvProtocolError(
                f"{self.name}.step() observation must be str, got {type(observation).__name__}"
            )
        if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
            raise EnvProtocolError(f"{self.name}.step() reward must be a finite number, got {reward!r}")
        return observation, float(reward), bool(terminated), bool(truncated), dict(info or {})

    def state(self) -> dict[str, Any]:
        state = getattr(self.env, "state", None)
        if callable(state):
            return dict(state())
        return {}

    def close(self) -> None:
        """Close the env exactly once, however often this is called."""
        if not self._closed:
            self._closed = True
            close_env(self.env)


def _describe(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a tuple of {len(value)} ({', '.join(type(v).__name__ for v in value)})"
    return f"{type(value).__name__} {value!r:.80}"
