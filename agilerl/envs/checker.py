"""``check_env``: tell an env author precisely what is wrong with their env, all at once."""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from agilerl.envs.client import EnvClient
from agilerl.envs.openenv_native import OpenEnvTextEnv
from agilerl.errors import EnvCheckError, exception_text
from agilerl.images import ImageLimits, ImageObservation, observation_from, observation_images
from agilerl.envs.tool_check import tool_step, tools_problem
from agilerl.protocol import close_env, declared_members, member_problem, reset_problems, step_problems

__all__ = ["CheckReport", "check_env"]


@dataclass
class CheckReport:
    """What ``check_env`` found: problems break the protocol, warnings are likely mistakes that
    some envs make on purpose (``strict`` makes them problems), notes are worth knowing."""

    env_name: str
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_env(
    env: Any,
    *,
    seed: int = 0,
    action: str = "1",
    raise_on_error: bool = True,
    strict: bool = False,
    max_turns: int | None = None,
    tool_parser: Any = None,
) -> CheckReport:
    """Run one reset (twice, for reproducibility) and one step, and check every shape and type.

    ``action`` is the step's text: one the env takes (``agilerl env check`` passes the first
    scripted one; an env whose Action is an Enum or a list takes no "1"). ``max_turns`` is a
    budget given from outside (a manifest, ``--max-turns``): then the env need not declare one.
    ``tool_parser`` (a name or a parser): the step plays ``action`` as a run sends it, its calls
    through the env's ``call_tool`` (``agilerl.envs.tool_check``).
    An OpenEnv env need not honour seeds (OpenEnv does not ask it to): a reset that does not
    reproduce is a warning for one, unless ``strict``; for a text env it is a problem."""
    report = CheckReport(type(env).__name__)
    problems = report.problems
    for name in ("reset", "step"):
        if not callable(getattr(env, name, None)):
            problems.append(f"missing method {name}()")
    if problems:
        return _finish(report, raise_on_error)
    _check_optional_members(env, report, budget_given=max_turns is not None)
    if isinstance(env, OpenEnvTextEnv) and not env.takes_seed:
        report.notes.append("reset() takes no seed: OpenEnv allows that, but episodes cannot be replayed by seed")
    first = _call(report, "reset", env.reset, seed=seed)
    if first is not None and _check_reset_result(first, report):
        again = _call(report, "reset (second time, same seed)", env.reset, seed=seed)
        if again is not None and isinstance(again, tuple) and not _same_observation(again[0], first[0]):
            openenv = isinstance(env, OpenEnvTextEnv)
            fix = (
                "its reset() takes no seed" if openenv and not env.takes_seed
                else "seed your random generator from `seed`"
            )
            found = (
                f"reset(seed={seed}) is not reproducible: two calls gave different prompts "
                f"({first[0]!r:.60} vs {again[0]!r:.60}); {fix}"
            )
            (report.warnings if openenv and not strict else problems).append(found)
        if tool_parser is not None:
            tool_step(env, tool_parser, action, first[1] if isinstance(first, tuple) else {}, report, _call)
        elif (result := _call(report, f"step({action!r})", env.step, action)) is not None:
            _check_step_result(result, report)
    close = getattr(env, "close", None)
    if close is not None:
        _call(report, "close", close_env, env)
    return _finish(report, raise_on_error)


def _finish(report: CheckReport, raise_on_error: bool) -> CheckReport:
    if raise_on_error and report.problems:
        raise EnvCheckError(report.env_name, report.problems)
    return report


def _call(report: CheckReport, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # an env author's bug: report it, keep checking
        report.problems.append(f"{what} raised {exception_text(exc)}")
        return None


def _check_reset_result(result: Any, report: CheckReport) -> bool:
    problems = reset_problems(result)
    report.problems += problems
    if not problems:
        _check_images(result[0], "reset()", report)
    return not problems


def _check_step_result(result: Any, report: CheckReport) -> None:
    problems = step_problems(result)
    report.problems += problems
    if not problems:
        _check_images(result[0], "step()", report)


_LIMITS = ImageLimits()
"""A run's default bound: images over it are reported (a run fails unless it raises
``model.max_image_pixels``), and never decoded here."""


def _same_observation(a: Any, b: Any) -> bool:
    """Whether two observations show the same (images by their pixels: arrays have no ``==``).
    Images over the default bound are compared by size (and bytes) only: decoding a bomb to
    compare it would cost what the bound is there to prevent."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    try:
        first, second = observation_from(a, "reset()"), observation_from(b, "reset()")
    except Exception:
        return False
    if isinstance(first, ImageObservation) and isinstance(second, ImageObservation):
        images = (*first.images, *second.images)
        if any(_LIMITS.size_problem(image.width, image.height) for image in images):
            return first.text == second.text and [i.size for i in first.images] == [i.size for i in second.images]
    return first == second


def _check_images(observation: Any, method: str, report: CheckReport) -> None:
    """An image over the default pixel bound is a warning (its size read from its header or
    shape, never decoded)."""
    if isinstance(observation, str):
        return
    for image in observation_images(observation_from(observation, method)):
        problem = _LIMITS.size_problem(image.width, image.height)
        if problem is not None:
            report.warnings.append(f"{method}: {problem} (a run with the default fails)")


def _check_optional_members(env: Any, report: CheckReport, *, budget_given: bool) -> None:
    """Each declared member against the protocol's rule (a client's are its ``describe()``)."""
    members = env.describe().metadata() if isinstance(env, EnvClient) else declared_members(env)
    for name, value in members.items():
        if value is not None and (problem := member_problem(name, value)) is not None:
            report.problems.append(problem)
    for i, tool in enumerate(members["tools"] if isinstance(members["tools"], list) else []):
        if isinstance(tool, dict) and "name" not in tool.get("function", tool):
            report.problems.append(f"tools[{i}] has no 'name' (nor function.name)")
    tools = members["tools"] if isinstance(members["tools"], list) else []
    if all(isinstance(t, dict) and "name" in t.get("function", t) for t in tools):
        if (problem := tools_problem(tools)) is not None:  # a schema the run's checker cannot read
            report.problems.append(problem)
    if members["dataset_size"] is not None:
        params = inspect.signature(env.reset).parameters
        missing = [k for k in ("row_index", "evaluation") if k not in params]
        if missing and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
            report.problems.append(
                f"env has dataset_size, so reset() must accept {', '.join(missing)} as keywords"
            )
    if members["max_turns"] is None and not budget_given:
        report.notes.append("no max_turns attribute: manifests must set max_turns")
