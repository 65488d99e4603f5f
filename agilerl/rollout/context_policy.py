"""What an episode does when its conversation outgrows the model's context
(``environment.context_policy``).

- ``error`` (the default): the episode ends there, cut after its last generated token
  (``agilerl.rollout.context``; the collector's "context" ends).
- ``truncate``: the next prompt is the opening (system prompt and first prompt) and the newest
  whole turns that fit; the oldest turns are dropped.
- ``restart``: the next prompt is a fresh context the env builds: its optional
  ``restart_prompt(history) -> str`` (``history``: the conversation's messages so far), or by
  default the first prompt and the text of the newest turns that fit, under the system prompt.

Either way the rewritten context opens a new training sample (``Trajectory.split``): the tokens
generated so far stay exactly as generated in the samples before it, the new prompt is rendered
fresh from text (prompt tokens are never trained), and what follows is exactly what the model
generates next; the closed sample ends after its last generated token (the reply that no longer
fit moves to the new context). The rewrite happens before a turn whose prompt leaves less than
``room_for`` tokens to generate, and keeps the new context within half of ``max_model_len`` when
it can (so several turns follow before the next rewrite); a rewrite that cannot make the room
leaves the episode to go on as under ``error``. The collector counts rewrites (``rollout/context_restarts``, ``rollout/context_truncations``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from agilerl.errors import EnvProtocolError

__all__ = ["ContextPolicy", "CONTEXT_POLICIES", "Conversation", "room_for", "target_for", "rewrite", "default_restart_prompt"]

ContextPolicy = Literal["error", "truncate", "restart"]
CONTEXT_POLICIES: tuple[str, ...] = ("error", "truncate", "restart")


def target_for(max_model_len: int) -> int:
    """The size a rewritten context aims for: half the context, the rest for the turns to come."""
    return max_model_len // 2


def room_for(max_model_len: int, max_new_tokens: int) -> int:
    """Tokens a prompt must leave for the next completion before it is rewritten: a whole
    completion, but never more than half the context (the rest holds the conversation)."""
    return max(1, min(max_new_tokens, max_model_len // 2))


@dataclass
class Conversation:
    """An episode's conversation as text messages: what a rewrite renders from. ``opening`` is
    what the reset opened (system prompt, first prompt); each turn is the model's answer and the
    env's reply to it."""

    opening: list[dict[str, Any]]
    turns: list[tuple[dict[str, Any], dict[str, Any]]] = field(default_factory=list)

    def add_turn(self, answer: str, role: str, observation: str) -> None:
        self.turns.append(({"role": "assistant", "content": answer}, {"role": role, "content": observation}))

    def messages(self, newest: int | None = None) -> list[dict[str, Any]]:
        """The opening and the ``newest`` turns (all of them by default), as chat messages."""
        return [*self.opening, *(message for turn in self.newest(newest) for message in turn)]

    def newest(self, count: int | None) -> list[tuple[dict[str, Any], dict[str, Any]]]:
        """The ``count`` newest turns, oldest first (all of them for None)."""
        if count is None:
            return self.turns
        return self.turns[len(self.turns) - count :] if count > 0 else []


def rewrite(
    policy: ContextPolicy,
    conversation: Conversation,
    render: Callable[[list[dict[str, Any]]], list[int]],
    limit: int,
    *,
    target: int | None = None,
    restart_prompt: Callable[[list[dict[str, Any]]], Any] | None = None,
    env_name: str = "env",
) -> list[int] | None:
    """The prompt ids (``render``: messages to ids with the generation prompt) of the rewritten
    context, at most ``limit`` tokens and, keeping fewer turns, ``target`` when it can; None
    when the policy cannot fit one (or has no turn to drop yet)."""
    if policy == "error" or not conversation.turns:
        return None
    if policy == "truncate":  # drop at least the oldest turn; keep as many newest as fit
        return _largest_fit(len(conversation.turns) - 1, lambda k: render(conversation.messages(k)), limit, target)
    system = [m for m in conversation.opening[:1] if m.get("role") == "system"]
    if restart_prompt is not None:
        text = restart_prompt(conversation.messages())
        if not isinstance(text, str):
            raise EnvProtocolError(
                f"{env_name}.restart_prompt(history) must return the new context's text (a str), "
                f"got {type(text).__name__}"
            )
        ids = render([*system, {"role": "user", "content": text}])
        return ids if len(ids) <= limit else None
    return _largest_fit(
        len(conversation.turns),
        lambda k: render([*system, {"role": "user", "content": default_restart_prompt(conversation, k)}]),
        limit,
        target,
    )


def default_restart_prompt(conversation: Conversation, newest: int) -> str:
    """The first prompt, then the text of the ``newest`` turns, oldest first, under a note that
    earlier turns were left out."""
    first = "\n\n".join(_text(m) for m in conversation.opening if m.get("role") != "system")
    lines = [f"{m['role']}: {_text(m)}" for turn in conversation.newest(newest) for m in turn]
    return "\n".join([first, "[earlier turns left out]", *lines])


def _largest_fit(
    most: int, ids_for: Callable[[int], list[int]], limit: int, target: int | None = None
) -> list[int] | None:
    """The ids of the largest ``k`` in ``0..most`` whose ids fit ``target`` (their length grows
    with ``k``), else of the largest that fits ``limit``."""
    if target is not None and target < limit:
        return _largest_fit(most, ids_for, target) or _largest_fit(most, ids_for, limit)
    best: list[int] | None = None
    low, high = 0, most
    while low <= high:
        k = (low + high) // 2
        ids = ids_for(k)
        if len(ids) <= limit:
            best, low = ids, k + 1
        else:
            high = k - 1
    return best


def _text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""
