"""What frames an episode for the model: its system prompt, the tools the chat template shows, and
the role each observation takes: one ``EpisodeChat`` value, the env's defaults overridden per
episode by the same keys in ``reset``'s info."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from agilerl.errors import EnvProtocolError

__all__ = ["EPISODE_CHAT_KEYS", "EpisodeChat"]


EPISODE_CHAT_KEYS = ("system_prompt", "tools", "observation_role")
"""The ``reset`` info keys an env sets per episode; a ``step``'s info may set ``observation_role``
for that one observation (``"tool"`` for a tool's result)."""


@dataclass(frozen=True)
class EpisodeChat:
    """How an episode is framed for the model: its system prompt, the tools the chat template
    shows, and the role each observation is rendered in.

    The harness, the collector and ``agilerl env check`` all read an episode's framing through
    ``for_episode``/``role_for``, so they render it the same way.
    """

    system_prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    observation_role: str = "user"

    def for_episode(self, info: dict[str, Any], env_name: str = "env") -> EpisodeChat:
        """These defaults overridden by the ``EPISODE_CHAT_KEYS`` that ``reset``'s info sets."""
        changes = {key: _checked(key, info[key], env_name, "reset") for key in EPISODE_CHAT_KEYS if key in info}
        return replace(self, **changes) if changes else self

    def role_for(self, step_info: dict[str, Any], env_name: str = "env") -> str:
        """The role of one step's observation: its info's ``observation_role``, else the episode's."""
        if "observation_role" not in step_info:
            return self.observation_role
        return _checked("observation_role", step_info["observation_role"], env_name, "step")

    def opening(self, prompt: str, info: dict[str, Any]) -> list[dict[str, Any]]:
        """The conversation a reset opens: the env's own ``info["messages"]``, else the system
        prompt (if any) and ``prompt`` as the user's message."""
        if info.get("messages"):
            return info["messages"]
        messages: list[dict[str, Any]] = []
        if self.system_prompt:
            messages.append({"role": "system", "content": self.system_prompt})
        messages.append({"role": "user", "content": prompt})
        return messages


def _checked(key: str, value: Any, env_name: str, method: str) -> Any:
    """``value`` when it can be the framing ``key`` (``None`` clears a prompt or tools), else an
    ``EnvProtocolError`` naming the key, the value and the shape it needs."""
    if key == "system_prompt" and (value is None or isinstance(value, str)):
        return value
    if key == "tools" and (value is None or (isinstance(value, list) and all(isinstance(t, dict) for t in value))):
        return value or None
    if key == "observation_role" and isinstance(value, str) and value:
        return value
    needs = {
        "system_prompt": "a str (or None)",
        "tools": "a list of JSON-schema dicts (or None)",
        "observation_role": 'a non-empty str such as "user" or "tool"',
    }[key]
    raise EnvProtocolError(f"{env_name}.{method}() info[{key!r}] must be {needs}, got {value!r}")
