"""LLM-judge rubrics on a ``JudgeEndpoint``: one completion at a time (``LLMJudge``), or a whole
GRPO group ranked in one call, RULER-style (``GroupJudge``).

The prompt is a template with ``{question}``, ``{answer}`` and ``{completion}`` (the group
judge: ``{completions}``, the numbered list). The score is read from the reply: with ``labels``
(``{"correct": 1, "wrong": 0}``) the last label the reply names, else its last number, mapped
from ``score_range`` onto [0, 1] and clamped. A number that is not finite (a reply of a
million digits reads as inf) is no score: the judgement fails, it never scores 1.

**Failure policy.** A judgement that cannot be had (the endpoint failed after its retries, or
its reply holds no score) scores ``failure_score`` (0.0 by default) and is counted in
``judge/failures``; with ``failure_score: null`` the sample's episode fails instead and the
collector replays or drops it, as for any env error. Only an outage (every call failing for
``give_up_after_s``) stops the run.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import string
from collections.abc import Mapping, Sequence
from typing import Any

from agilerl.data.judge import JUDGE_STATS, JudgeEndpoint
from agilerl.errors import JudgeFailed, RubricError

__all__ = ["DEFAULT_PROMPT", "DEFAULT_GROUP_PROMPT", "LLMJudge", "GroupJudge", "parse_score", "parse_scores"]

DEFAULT_PROMPT = (
    "You grade answers.\n\nQuestion:\n{question}\n\nReference answer:\n{answer}\n\n"
    "Response to grade:\n{completion}\n\n"
    "How correct and helpful is the response, from 0 (wrong) to 10 (perfect)? Reply with the number only."
)
DEFAULT_GROUP_PROMPT = (
    "You compare responses to one question.\n\nQuestion:\n{question}\n\nReference answer:\n{answer}\n\n"
    "Responses:\n{completions}\n\n"
    "Score every response from 0 (worst) to 1 (best), relative to the others. Reply with a JSON "
    "list of the scores, one per response, in order, and nothing else."
)
_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def _placeholders(template: str) -> set[str]:
    try:
        return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}
    except ValueError as exc:
        raise RubricError(f"judge prompt: not a valid template ({exc}); write literal braces as {{{{ }}}}.") from None


def _check_template(template: str, allowed: set[str]) -> set[str]:
    used = _placeholders(template)
    unknown = sorted(used - allowed)
    if unknown:
        raise RubricError(
            f"judge prompt: unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}; "
            f"it takes {', '.join('{' + a + '}' for a in sorted(allowed))}."
        )
    return used


def parse_score(reply: str, labels: Mapping[str, float] | None, score_range: Sequence[float]) -> float | None:
    """The reply's score in [0, 1]: its last label (with ``labels``) or its last number; None if none."""
    if labels:
        found = [(m.start(), labels[label]) for label in labels for m in re.finditer(rf"\b{re.escape(label)}\b", reply, re.I)]
        return float(max(found)[1]) if found else None
    numbers = _NUMBER.findall(reply)
    return _scaled(float(numbers[-1]), score_range) if numbers else None


def parse_scores(reply: str, count: int, score_range: Sequence[float]) -> list[float] | None:
    """``count`` scores in [0, 1] from a JSON list in the reply (or its numbers, in order)."""
    match = re.search(r"\[[^\[\]]*\]", reply)
    values: list[Any] = []
    if match:
        try:
            values = json.loads(match.group(0))
        except ValueError:
            values = []
    if not (isinstance(values, list) and len(values) == count and all(isinstance(v, (int, float)) for v in values)):
        values = [float(n) for n in _NUMBER.findall(match.group(0) if match else reply)]
    if len(values) != count:
        return None
    scores = [_scaled(float(v), score_range) for v in values]
    return None if None in scores else scores  # type: ignore[return-value]


def _scaled(value: float, score_range: Sequence[float]) -> float | None:
    """``value`` mapped from ``score_range`` onto [0, 1] and clamped; None when it is not finite."""
    if not math.isfinite(value):
        return None
    low, high = score_range
    return min(1.0, max(0.0, (value - low) / (high - low)))


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


class _JudgeRubric:
    """What both judges share: the endpoint, the template, the parsing and the failure policy."""

    allowed: set[str]

    def __init__(
        self,
        prompt: str,
        *,
        labels: Mapping[str, float] | None,
        score_range: Sequence[float],
        failure_score: float | None,
        **endpoint: Any,
    ) -> None:
        if "api_key" in endpoint:  # its value is never repeated, here or anywhere
            raise RubricError(
                "judge config: 'api_key' would put the key in the manifest; export it and name the "
                "variable instead: api_key_env: JUDGE_API_KEY."
            )
        self.used = _check_template(prompt, self.allowed)
        if len(score_range) != 2 or not all(map(_finite, score_range)) or score_range[1] <= score_range[0]:
            raise RubricError(f"judge score_range must be [low, high], finite numbers with low < high, got {list(score_range)}.")
        if labels is not None and not labels:
            raise RubricError("judge labels: give at least one {label: score}, or leave labels out to read a number.")
        for label, value in (labels or {}).items():
            if not _finite(value):
                raise RubricError(f"judge labels[{label!r}] must be a finite number, got {value!r}.")
        if failure_score is not None and not _finite(failure_score):
            raise RubricError(f"judge failure_score must be a finite number or null, got {failure_score!r}.")
        self.prompt = prompt
        self.labels = dict(labels) if labels else None
        self.score_range = tuple(score_range)
        self.failure_score = failure_score
        self.endpoint = JudgeEndpoint(**endpoint)

    def check_columns(self, columns: Sequence[str]) -> None:
        """The template's ``{question}``/``{answer}`` are dataset columns."""
        for name in ("question", "answer"):
            if name in self.used and name not in columns:
                raise RubricError(
                    f"judge prompt uses {{{name}}} but the dataset has no {name!r} column; its columns "
                    f"are: {', '.join(columns)}. Rename one with 'columns: {{source: {name}}}'."
                )

    def _failed(self, why: str) -> float:
        """The failure policy (module doc): ``failure_score``, or the episode fails."""
        if self.failure_score is None:
            raise JudgeFailed(why)
        return self.failure_score


class LLMJudge(_JudgeRubric):
    """Scores one completion per call; async, so a composite awaits its judges together."""

    allowed = {"question", "answer", "completion"}

    def __init__(
        self,
        prompt: str = DEFAULT_PROMPT,
        *,
        labels: Mapping[str, float] | None = None,
        score_range: Sequence[float] = (0.0, 10.0),
        failure_score: float | None = 0.0,
        **endpoint: Any,
    ) -> None:
        super().__init__(prompt, labels=labels, score_range=score_range, failure_score=failure_score, **endpoint)
        self.__qualname__ = f"llm_judge({self.endpoint.model})"

    async def __call__(self, completion: str, question: Any = None, answer: Any = None) -> float:
        prompt = self.prompt.format_map({"question": question, "answer": answer, "completion": completion})
        try:
            reply = await self.endpoint.complete(prompt)
        except JudgeFailed as exc:
            return self._failed(str(exc))
        score = parse_score(reply, self.labels, self.score_range)
        if score is None:
            JUDGE_STATS.add(failures=1)
            return self._failed(f"the judge's reply holds no score: {reply[:120]!r}")
        return score


class GroupJudge(_JudgeRubric):
    """Ranks the completions of one group (same question and answer) in one call, RULER-style.

    Each sample's call waits until ``group_size`` samples of its question have arrived, or
    ``gather_s`` after the first did (a bound, for a group that lost members), then one request
    scores them all and each caller gets its own score in [0, 1]. The collector steps every
    member of a group in the same phase, so they arrive together.
    """

    allowed = {"question", "answer", "completions"}

    def __init__(
        self,
        prompt: str = DEFAULT_GROUP_PROMPT,
        *,
        group_size: int | None = None,
        gather_s: float = 2.0,
        score_range: Sequence[float] = (0.0, 1.0),
        failure_score: float | None = 0.0,
        **endpoint: Any,
    ) -> None:
        if group_size is not None and group_size < 1 or gather_s <= 0:
            raise RubricError(f"llm_judge_group: group_size >= 1 and gather_s > 0 are needed, got {group_size} and {gather_s}.")
        super().__init__(prompt, labels=None, score_range=score_range, failure_score=failure_score, **endpoint)
        self.group_size = group_size
        self.gather_s = gather_s
        self._waiting: dict[str, list[tuple[str, asyncio.Future[float]]]] = {}
        self.__qualname__ = f"llm_judge_group({self.endpoint.model})"

    async def __call__(self, completion: str, question: Any = None, answer: Any = None) -> float:
        loop = self.endpoint._loop
        if not loop.on_loop_thread():
            return await loop.run_async(self(completion, question, answer))
        key = json.dumps([str(question), str(answer)])
        future: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        members = self._waiting.setdefault(key, [])
        members.append((completion, future))
        if len(members) == 1:
            asyncio.get_running_loop().call_later(self.gather_s, self._flush, key, members, question, answer)
        if self.group_size is not None and len(members) >= self.group_size:
            self._flush(key, members, question, answer)
        return await future

    def _flush(self, key: str, members: list[tuple[str, asyncio.Future[float]]], question: Any, answer: Any) -> None:
        if self._waiting.get(key) is not members:  # already flushed
            return
        del self._waiting[key]
        asyncio.ensure_future(self._judge(members, question, answer))

    async def _judge(self, members: list[tuple[str, asyncio.Future[float]]], question: Any, answer: Any) -> None:
        listed = "\n\n".join(f"Response {i + 1}:\n{completion}" for i, (completion, _) in enumerate(members))
        prompt = self.prompt.format_map({"question": question, "answer": answer, "completions": listed})
        try:
            reply = await self.endpoint.complete(prompt)
            scores = parse_scores(reply, len(members), self.score_range)
            if scores is None:
                JUDGE_STATS.add(failures=1)
                raise JudgeFailed(f"the group judge's reply holds no {len(members)} scores: {reply[:120]!r}")
        except JudgeFailed as exc:
            for _, future in members:
                if not future.done():
                    try:
                        future.set_result(self._failed(str(exc)))
                    except JudgeFailed as failed:
                        future.set_exception(failed)
            return
        except BaseException as exc:  # an outage (JudgeUnavailable): every member stops the same way
            for _, future in members:
                if not future.done():
                    future.set_exception(exc)
            return
        for (_, future), score in zip(members, scores):
            if not future.done():
                future.set_result(score)
