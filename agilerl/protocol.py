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
    picks a row) and ``eval_dataset_size`` (rows of its held-out split), ``max_turns`` (the turn
    budget used when a manifest leaves it out), ``max_reward`` (for accuracy), ``system_prompt``
    and ``close()``.
    """

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; return the first prompt and an info dict."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply the model's text; return observation, reward, terminated, truncated, info."""
        ...


DESCRIBED_MEMBERS: dict[str, type | tuple[type, ...]] = {
    # the optional members a server publishes at /metadata, and the type each must have
    "max_turns": int,
    "dataset_size": int,
    "eval_dataset_size": int,
    "max_reward": (int, float),
    "system_prompt": str,
    "tools": list,
}


def describe_env(env: Any) -> dict[str, Any]:
    """The optional members ``env`` declares (None where absent or of the wrong type): what a
    server publishes at ``/metadata`` so that remote clients see its env as a local one."""
    described: dict[str, Any] = {}
    for name in DESCRIBED_MEMBERS:
        try:
            value = getattr(env, name, None)
        except Exception:  # noqa: BLE001 - a broken property describes nothing, it must not end sessions
            value = None
        described[name] = value if has_member_type(name, value) else None
    return described


def has_member_type(name: str, value: Any) -> bool:
    """Whether ``value`` is usable as the optional member ``name`` (a bool is not a number)."""
    return isinstance(value, DESCRIBED_MEMBERS[name]) and not isinstance(value, bool)


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
