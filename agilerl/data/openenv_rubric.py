"""OpenEnv's ``Rubric`` objects (RFC 004: ``WeightedSum``, ``Gate``, ``Sequential``,
``RubricDict``, ``LLMJudge``, trajectory rubrics, your own subclasses) as our rubrics.

An OpenEnv rubric is called as ``rubric(action, observation)``. Scoring a dataset row, the
action is the completion text and the observation a ``RowObservation``: the row's ``question``,
``answer``, the whole ``row`` and ``info``; ``done`` is true (one answer is the whole episode)
and ``str(observation)`` is the question (what ``LLMJudge``'s ``{observation}`` shows). Its
result is the reward, each named child (``named_rubrics()``) a component; a sync or async tree
works, containers included.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agilerl.data.reward import Reward, resolve_awaitable
from agilerl.envs.openenv_rubrics import RubricRecorder, is_openenv_rubric
from agilerl.errors import RubricError

__all__ = ["RowObservation", "OpenEnvRubric", "as_openenv_rubric"]


@dataclass
class RowObservation:
    """What an OpenEnv rubric sees as the observation when it scores a dataset row."""

    question: Any = None
    answer: Any = None
    row: Mapping[str, Any] = field(default_factory=dict)
    info: Mapping[str, Any] = field(default_factory=dict)
    done: bool = True
    reward: float | None = None

    @property
    def metadata(self) -> Mapping[str, Any]:
        """The row, where an OpenEnv rubric reads ``observation.metadata``."""
        return self.row

    def __str__(self) -> str:
        return "" if self.question is None else str(self.question)


class OpenEnvRubric:
    """A rubric over an OpenEnv ``Rubric`` tree: the tree's score, and its named parts."""

    def __init__(self, rubric: Any) -> None:
        self.recorder = RubricRecorder(rubric)
        self.__qualname__ = type(rubric).__name__

    def __call__(
        self,
        completion: str,
        question: Any = None,
        answer: Any = None,
        row: Mapping[str, Any] | None = None,
        info: Mapping[str, Any] | None = None,
    ) -> Any:
        """The ``Reward`` (awaitable when the tree is async; ``resolve_awaitable`` waits)."""
        observation = RowObservation(question, answer, row or {}, info or {})
        if self.recorder.stateful:  # a trajectory rubric keeps steps: one episode at a time
            with self.recorder.lock:
                self.recorder.rubric.reset()
                return self._score(completion, observation, wait=True)
        return self._score(completion, observation, wait=False)

    def _score(self, completion: str, observation: RowObservation, *, wait: bool) -> Any:
        with self.recorder.recording() as scores:
            result = self.recorder.rubric(completion, observation)
        if hasattr(result, "__await__"):
            awaiting = self._finish(result, scores)
            if wait:
                return resolve_awaitable(awaiting)
            return awaiting
        return Reward(float(result), self.recorder.components(scores))

    async def _finish(self, pending: Any, scores: dict[int, float]) -> Reward:
        """Await the tree in a context that records into this call's ``scores``."""
        from agilerl.envs.openenv_rubrics import _scores

        token = _scores.set(scores)
        try:
            result = await pending
        finally:
            _scores.reset(token)
        return Reward(float(result), self.recorder.components(scores))


def as_openenv_rubric(obj: Any) -> OpenEnvRubric | None:
    """``obj`` as our rubric when it is an OpenEnv ``Rubric`` (a class is built with no
    arguments; pass ``config`` in the manifest for one that takes some); else None."""
    if not is_openenv_rubric(obj):
        return None
    if isinstance(obj, type):
        try:
            obj = obj()
        except TypeError as exc:
            raise RubricError(
                f"OpenEnv rubric {obj.__name__} cannot be built without arguments ({exc}); list it "
                "under 'rubrics:' with 'config: {...}' holding them."
            ) from None
    return OpenEnvRubric(obj)
