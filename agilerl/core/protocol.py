"""The text-env protocol: the one shape every environment is reached through."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

StepResult = tuple[str, float, bool, bool, dict[str, Any]]
"""``(observation, reward, terminated, truncated, info)``, as ``env.step`` returns it."""


@runtime_checkable
class TextEnv(Protocol):
    """Text in, text out.

    Optional members an env may add: ``tools`` (a list of JSON-schema tool specs rendered through
    the chat template), ``dataset_size`` (then ``reset(seed, *, row_index=None, evaluation=None)``
    picks a row), ``max_turns`` (the turn budget used when a manifest leaves it out),
    ``system_prompt`` and ``close()``.
    """

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; return the first prompt and an info dict."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply the model's text; return observation, reward, terminated, truncated, info."""
        ...


def reset_env(
    env: Any,
    seed: int | None = None,
    *,
    row_index: int | None = None,
    evaluation: bool | None = None,
) -> tuple[str, dict[str, Any]]:
    """Call ``env.reset`` passing ``row_index``/``evaluation`` only when they are set.

    Plain envs only take ``seed``; dataset-backed envs also take the keywords.
    """
    kwargs: dict[str, Any] = {}
    if row_index is not None:
        kwargs["row_index"] = row_index
    if evaluation is not None:
        kwargs["evaluation"] = evaluation
    return env.reset(seed=seed, **kwargs)


def close_env(env: Any) -> None:
    """Close an env if it has a ``close`` method."""
    close = getattr(env, "close", None)
    if callable(close):
        close()
