"""Calling a rubric: by the keywords it declares, with its result checked and explained.

A rubric is any callable taking some of ``completion``, ``answer``, ``question``, ``row`` and
``info`` by name, so argument order can never be wrong. It returns a number, a dict of named
numbers (components) that are summed, or a ``Reward`` (a total and its components, for rubrics
that weigh their parts, such as ``CompositeRubric``); components are reported for logging. An
``async`` rubric (or one returning an awaitable) is awaited on the shared event loop.
``make_format_rubric`` builds the simplest rubric: a regex over the whole completion.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from numbers import Real
from pathlib import Path
from typing import Any

from agilerl.data.openenv_rubric import as_openenv_rubric
from agilerl.data.reward import Reward, resolve_awaitable
from agilerl.errors import EnvUnavailable, RubricError

__all__ = ["RUBRIC_KEYWORDS", "Rubric", "load_rubric", "make_format_rubric"]

RUBRIC_KEYWORDS = ("completion", "answer", "question", "row", "info")
# Keywords read from a dataset column of the same name.
_COLUMN_KEYWORDS = ("answer", "question")


@dataclass(frozen=True)
class Rubric:
    """A callable plus the keywords it takes; ``score`` returns ``(reward, components)``."""

    fn: Callable[..., Any]
    keywords: tuple[str, ...]
    name: str

    @classmethod
    def bind(cls, fn: Callable[..., Any], name: str | None = None) -> Rubric:
        """Read the keywords ``fn`` declares; reject parameters we could never fill."""
        name = name or getattr(fn, "__qualname__", None) or repr(fn)
        fn = as_openenv_rubric(fn) or fn  # OpenEnv's Rubric objects score (action, observation)
        if not callable(fn):
            raise RubricError(f"rubric {name!r} is not callable (got {type(fn).__name__}).")
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError) as exc:
            raise RubricError(f"rubric {name!r}: cannot read its signature ({exc}).") from None
        keywords: list[str] = []
        for param in params:
            if param.kind is param.VAR_KEYWORD:
                return cls(fn, RUBRIC_KEYWORDS, name)
            if param.kind is param.VAR_POSITIONAL:
                continue
            if param.name in RUBRIC_KEYWORDS and param.kind is not param.POSITIONAL_ONLY:
                keywords.append(param.name)
            elif param.default is param.empty:
                raise RubricError(
                    f"rubric {name!r} requires parameter {param.name!r}, which is never passed; "
                    f"a rubric takes any of {', '.join(RUBRIC_KEYWORDS)} by keyword."
                )
        if not keywords:
            raise RubricError(
                f"rubric {name!r} takes none of {', '.join(RUBRIC_KEYWORDS)}; declare at "
                "least 'completion'."
            )
        return cls(fn, tuple(keywords), name)

    def check_columns(self, columns: Iterable[str]) -> None:
        """``answer``/``question`` come from columns of those names: fail early if absent."""
        existing = list(columns)
        nested = getattr(self.fn, "check_columns", None)
        if callable(nested):  # a composite: each of its entries checks its own keywords
            nested(existing)
            return
        for keyword in _COLUMN_KEYWORDS:
            if keyword in self.keywords and keyword not in existing and self._requires(keyword):
                raise RubricError(
                    f"rubric {self.name!r} takes {keyword!r} but the dataset has no "
                    f"{keyword!r} column; its columns are: {', '.join(existing)}. Rename one "
                    "with 'columns: {source: " + keyword + "}'."
                )

    def _requires(self, keyword: str) -> bool:
        param = inspect.signature(self.fn).parameters.get(keyword)
        return param is not None and param.default is param.empty

    def score(
        self, completion: str, row: Mapping[str, Any], info: Mapping[str, Any], where: str
    ) -> tuple[float, dict[str, float]]:
        """Call the rubric; ``where`` (e.g. ``"train row 12"``) names the row in errors."""
        available = {
            "completion": completion,
            "answer": row.get("answer"),
            "question": row.get("question"),
            "row": row,
            "info": info,
        }
        kwargs = {k: available[k] for k in self.keywords}
        try:
            result = resolve_awaitable(self.fn(**kwargs))
        except EnvUnavailable:  # an outage (a judge down for good) stops the run, unwrapped
            raise
        except (Exception, SystemExit) as exc:  # sys.exit() in a rubric is its error, not the run's end
            raise RubricError(
                f"rubric {self.name!r} raised {type(exc).__name__}: {exc} (on {where})."
            ) from exc
        return _as_reward(result, self.name, where)


def _as_reward(result: Any, name: str, where: str) -> tuple[float, dict[str, float]]:
    if type(result) is float and -math.inf < result < math.inf:  # a plain finite score: nothing else to check
        return result, {}
    if isinstance(result, Reward):
        total = _as_number(result.total, name, where, "total")
        return total, {k: _as_number(v, name, where, f"component {k!r}") for k, v in result.components.items()}
    if isinstance(result, Mapping):
        if not result:
            raise RubricError(f"rubric {name!r} returned an empty dict on {where}.")
        components = {
            str(k): _as_number(v, name, where, f"component {k!r}") for k, v in result.items()
        }
        try:
            return math.fsum(components.values()), components
        except OverflowError:  # finite parts whose sum is not (1e308 + 1e308)
            raise RubricError(
                f"rubric {name!r}'s components sum past the largest float on {where}: {components}."
            ) from None
    return _as_number(result, name, where, "result"), {}


def _as_number(value: Any, name: str, where: str, what: str) -> float:
    """``value`` as a finite float; ``RubricError`` naming the rubric (a composite's entry) and
    ``what`` otherwise: one inf would make the reward inf, and inf beside -inf makes it NaN."""
    if type(value) is float and -math.inf < value < math.inf:  # the common case, without the Real ABC's check
        return value
    if not isinstance(value, Real):
        raise RubricError(
            f"rubric {name!r} returned {what} {value!r} ({type(value).__name__}) on {where}; "
            "return a float, a dict of floats or a Reward."
        )
    try:
        number = float(value)
    except OverflowError:  # an int past the largest float
        number = math.inf if value > 0 else -math.inf
    if math.isnan(number):
        raise RubricError(f"rubric {name!r} returned NaN as {what} on {where}.")
    if math.isinf(number):
        raise RubricError(f"rubric {name!r} returned {number} as {what} on {where}; a score is a finite number.")
    return number


def load_rubric(
    rubric_name: str,
    rubric_file_path: str | None = None,
    *,
    base_dir: str | Path | None = None,
    config: Mapping[str, Any] | None = None,
) -> Rubric:
    """Resolve ``rubric_file_path:rubric_name``, or a registered rubric name, and bind it.

    With ``config``, what resolves is a factory (a judge, an OpenEnv Rubric class): it is called
    with ``config`` as keywords and what it returns is the rubric."""
    from agilerl.registry import resolve

    ref = f"{rubric_file_path}:{rubric_name}" if rubric_file_path else rubric_name
    target = resolve("rubric", ref, base_dir=base_dir)
    needs = getattr(target, "needs_config", None)
    if config is None and isinstance(needs, str):
        raise RubricError(
            f"rubric {ref!r} is built from settings: list it under 'rubrics:' with "
            f"'config: {{...}}' giving at least {needs} (see docs/rubrics.md)."
        )
    if config is not None:
        try:
            target = target(**config)
        except RubricError:
            raise
        except (Exception, SystemExit) as exc:  # the values may hold what must not be printed: name the keys only
            raise RubricError(
                f"rubric {ref!r}: building it with config keys {sorted(config)} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
    return Rubric.bind(target, name=ref)


def make_format_rubric(pattern: str, reward: float = 1.0) -> Callable[[str], float]:
    """A rubric paying ``reward`` when the whole completion matches ``pattern`` (DOTALL)."""
    compiled = re.compile(pattern, re.DOTALL)

    def format_rubric(completion: str) -> float:
        return reward if compiled.fullmatch(completion) else 0.0

    format_rubric.__qualname__ = f"format_rubric({pattern!r})"
    return format_rubric
