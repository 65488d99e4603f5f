"""What a rubric returns when its total is not the plain sum of its parts, and how an async
rubric's result is waited for: the two facts both rubric callers (``rubric`` for plain callables,
``openenv_rubric`` for OpenEnv's ``Rubric`` trees) build on."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from agilerl.concurrency import shared_loop

__all__ = ["Reward", "resolve_awaitable"]


@dataclass(frozen=True)
class Reward:
    """A rubric's result when its total is not the plain sum of its parts (weights, gates)."""

    total: float
    components: dict[str, float]


def resolve_awaitable(result: Any) -> Any:
    """``result``, awaited on the shared event loop when it is awaitable (an async rubric called
    from a sync ``step``); from that loop's own thread an awaitable cannot be waited for."""
    if not inspect.isawaitable(result):
        return result

    async def wait() -> Any:
        return await result

    return shared_loop().run(wait())
