"""OpenEnv's RFC 004 ``Rubric`` objects, read without importing openenv: which scores each named
part of a rubric tree gave on one call, even when many calls run at once on one shared tree.

A rubric's ``last_score`` is one attribute shared by every caller, so it cannot say which call
scored what. Instead every rubric of the tree gets a forward hook that writes its result into
the dict of the current call, held in a ``ContextVar``: threads have their own, and asyncio
tasks (``WeightedSum`` gathers its children in tasks) copy the caller's, so each call sees its
own parts only. Parts a ``Sequential`` did not run are absent, not stale.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from agilerl.envs.openenv_types import RUBRIC, TRAJECTORY_RUBRIC, has_base

__all__ = ["is_openenv_rubric", "is_trajectory_rubric", "RubricRecorder"]

_scores: ContextVar[dict[int, float] | None] = ContextVar("agilerl_rubric_scores", default=None)


def is_openenv_rubric(obj: Any) -> bool:
    """True for an OpenEnv ``Rubric`` subclass or instance."""
    return has_base(obj, RUBRIC)


def is_trajectory_rubric(obj: Any) -> bool:
    """True for an OpenEnv ``TrajectoryRubric`` (it keeps the episode's steps between calls)."""
    return has_base(obj, TRAJECTORY_RUBRIC)


def _record(rubric: Any, action: Any, observation: Any, result: Any) -> None:
    scores = _scores.get()
    if scores is not None and isinstance(result, (int, float)):
        scores[id(rubric)] = float(result)


class RubricRecorder:
    """Hooks on every rubric of one tree; ``recording()`` yields the dict a call fills, and
    ``components`` names what it holds by ``named_rubrics()`` paths (``code.syntax``)."""

    def __init__(self, rubric: Any) -> None:
        self.rubric = rubric
        self.named = [("", rubric), *rubric.named_rubrics()]
        for _, part in self.named:
            if _record not in getattr(part, "_forward_hooks", ()):
                part.register_forward_hook(_record)
        self.stateful = any(is_trajectory_rubric(part) for _, part in self.named)
        self.lock = threading.Lock()  # a stateful tree is called by one caller at a time

    @contextmanager
    def recording(self) -> Iterator[dict[int, float]]:
        scores: dict[int, float] = {}
        token = _scores.set(scores)
        try:
            yield scores
        finally:
            _scores.reset(token)

    def components(self, scores: dict[int, float]) -> dict[str, float]:
        """The named parts' scores of one call (the root itself is the reward, not a part)."""
        return {name: scores[id(part)] for name, part in self.named if name and id(part) in scores}
