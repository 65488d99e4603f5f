"""The text-env protocol: the one shape every environment is reached through, and its rules.

Every user of an env (the in-process client, the env server, ``check_env``) checks what the env
returns with the functions here, so they all accept and refuse the same things: ``reset`` returns
``(str, dict)``; ``step`` returns ``(str, finite real number, bool, bool, dict)`` (a bool is not a
reward; numpy's bool counts as a bool); text is valid Unicode (``valid_text``: a lone surrogate is
carried as its escape). What an env declares about itself (turn budget, tools,
system prompt, dataset sizes, best reward) is one ``EnvInfo``, built by these rules on either side
of a connection; a turn budget is an int >= 1.
"""

from __future__ import annotations

import inspect
import json
import math
import numbers
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agilerl.errors import AgileRLWarning, EnvProtocolError, InvalidArgument
from agilerl.images import ImageObservation, observation_from, observation_problem

__all__ = [
    "StepResult",
    "TextEnv",
    "DESCRIBED_MEMBERS",
    "member_problem",
    "declared_members",
    "EnvInfo",
    "describe_env",
    "reset_kwargs",
    "reward_problem",
    "MAX_ABS_REWARD",
    "valid_text",
    "reset_problems",
    "step_problems",
    "check_reset_result",
    "check_step_result",
    "read_state",
    "state_dict",
    "close_env",
]

StepResult = tuple["str | ImageObservation", float, bool, bool, dict[str, Any]]
"""``(observation, reward, terminated, truncated, info)``, as ``env.step`` returns it. An
observation is a ``str``, or a mapping with ``text`` and ``image``/``images`` (docs/vision.md),
read into an ``ImageObservation`` by ``agilerl.images.observation_from``."""


@runtime_checkable
class TextEnv(Protocol):
    """Text in, text out.

    Optional members an env may add (``DESCRIBED_MEMBERS``, read into an ``EnvInfo``): ``tools``
    (a list of JSON-schema tool specs rendered through the chat template), ``dataset_size`` (then
    ``reset(seed, *, row_index=None, evaluation=None)`` picks a row) and ``eval_dataset_size``
    (rows of its held-out split), ``max_turns`` (the turn budget used when a manifest leaves it
    out), ``max_reward`` (for accuracy), ``system_prompt``, ``send_reasoning`` (with a tool
    parser: ``step`` also receives the model's reasoning); and ``close()``. An env with ``tools``
    may take the model's parsed calls through ``call_tool(name, arguments) -> StepResult``
    (``environment.tool_parser``, docs/tools.md).
    """

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode; return the first prompt and an info dict."""
        ...

    def step(self, action: str) -> StepResult:
        """Apply the model's text; return observation, reward, terminated, truncated, info."""
        ...


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_tool_list(value: Any) -> bool:
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        return False
    try:
        json.dumps(value)  # a server publishes them: what cannot travel is refused locally too
    except (TypeError, ValueError):
        return False
    return True


_RULES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    # what each fact about an env must be: "<name> must be <what>"
    "max_turns": ("an int >= 1", lambda v: _is_int(v) and v >= 1),
    "tools": ("a list of JSON-schema dicts", _is_tool_list),
    "system_prompt": ("a str", lambda v: isinstance(v, str)),
    "dataset_size": ("an int >= 0", lambda v: _is_int(v) and v >= 0),
    "eval_dataset_size": ("an int >= 0", lambda v: _is_int(v) and v >= 0),
    "max_reward": (
        "a finite number",
        lambda v: isinstance(v, numbers.Real) and not _is_bool(v) and math.isfinite(v),
    ),
    "max_concurrent_envs": ("an int >= 1", lambda v: _is_int(v) and v >= 1),
    "send_reasoning": ("a bool", lambda v: isinstance(v, bool)),
}

DESCRIBED_MEMBERS = (
    "max_turns", "tools", "system_prompt", "dataset_size", "eval_dataset_size", "max_reward", "send_reasoning"
)
"""The optional members an env may declare (``TextEnv``); a server publishes them at ``/metadata``."""


def member_problem(name: str, value: Any) -> str | None:
    """Why ``value`` cannot be the env fact ``name`` (see ``EnvInfo``); None when it can."""
    what, usable = _RULES[name]
    if usable(value):
        return None
    return f"{name} must be {what}, got {_short_repr(value)}"


def declared_members(env: Any) -> dict[str, Any]:
    """The optional members ``env`` declares, as it declares them (None where absent or where
    reading raises): what ``check_env`` judges and ``describe_env`` keeps the usable part of."""
    declared: dict[str, Any] = {}
    for name in DESCRIBED_MEMBERS:
        try:
            declared[name] = getattr(env, name, None)
        except Exception:  # a broken property declares nothing
            declared[name] = None
    return declared


@dataclass(frozen=True)
class EnvInfo:
    """What an env declares about itself, in one typed value that is read once and passed along.

    ``EnvClient.describe()`` returns it: built by ``describe_env`` from a local env, parsed by
    ``EnvInfo.parse`` from a server's ``/metadata``, by the same rules, so a remote env is seen as
    the same env. None where the env does not say. It cannot hold a value the rules refuse.
    """

    name: str
    """What messages call the env: its class name, or the name its server gives."""
    max_turns: int | None = None
    """The turn budget used when a manifest or caller gives none."""
    tools: list[dict[str, Any]] | None = None
    """JSON-schema tool specs, rendered through the chat template."""
    system_prompt: str | None = None
    dataset_size: int | None = None
    """Rows of the train split: then ``reset`` takes ``row_index`` and ``evaluation``."""
    eval_dataset_size: int | None = None
    """Rows of the held-out split."""
    max_reward: float | None = None
    """The best episode reward (accuracy is reward / max_reward)."""
    max_concurrent_envs: int | None = None
    """Sessions the env's server admits at once (replicas summed); None in process: no limit."""
    send_reasoning: bool | None = None
    """With a tool parser: the env's ``step`` receives the model's reasoning too (it opted in)."""

    def __post_init__(self) -> None:
        given = {name: value for name in _RULES if (value := getattr(self, name)) is not None}
        problems = [p for name, value in given.items() if (p := member_problem(name, value)) is not None]
        if problems:
            raise InvalidArgument(f"{self.name}: {'; '.join(problems)}")

    @classmethod
    def parse(cls, values: Mapping[str, Any], *, name: str) -> EnvInfo:
        """The usable facts among ``values`` (an env's members, or ``/metadata``); a value the
        rules refuse is left out with a warning, the same way on either side of a connection."""
        kept: dict[str, Any] = {}
        for key in _RULES:
            value = values.get(key)
            if value is None:
                continue
            problem = member_problem(key, value)
            if problem is None:
                kept[key] = float(value) if key == "max_reward" else value
            else:
                warnings.warn(
                    f"{name}: {problem}; it is ignored (agilerl env check lists such problems)",
                    AgileRLWarning,
                    stacklevel=3,
                )
        return cls(name=name, **kept)

    def metadata(self) -> dict[str, Any]:
        """The declared members as a server publishes them at ``/metadata`` (None where unsaid)."""
        return {name: getattr(self, name) for name in DESCRIBED_MEMBERS}

    def turn_budget(self, max_turns: int | None = None) -> int:
        """``max_turns`` when given (it must be usable), else the env's own; the one error for
        a run that has neither names the field to set."""
        if max_turns is not None:
            problem = member_problem("max_turns", max_turns)
            if problem is not None:
                raise InvalidArgument(problem)
            return max_turns
        if self.max_turns is None:
            raise InvalidArgument(
                f"no turn budget: max_turns is not given and {self.name} declares no usable max_turns "
                "(an int >= 1; OpenEnv servers publish none). Set environment.max_turns in the manifest "
                "or pass max_turns= (agilerl env check SOURCE --max-turns N to try one)."
            )
        return self.max_turns


def describe_env(env: Any) -> EnvInfo:
    """What a local ``env`` declares, by the protocol's rules: what its in-process client
    describes and what a server serving it publishes."""
    return EnvInfo.parse(declared_members(env), name=type(env).__name__)


def reset_kwargs(row_index: int | None = None, evaluation: bool | None = None) -> dict[str, Any]:
    """The keywords ``reset`` gets besides ``seed``: ``row_index``/``evaluation`` only when set, so
    plain envs (which take only ``seed``) and dataset envs are reset the same way."""
    kwargs: dict[str, Any] = {}
    if row_index is not None:
        kwargs["row_index"] = row_index
    if evaluation is not None:
        kwargs["evaluation"] = evaluation
    return kwargs


MAX_ABS_REWARD = 1e15
"""Rewards lie within +-1e15: a group's rewards are summed and squared in float32 by the losses
and in float64 by the statistics; past this a sum overflows to inf and the loss turns NaN (a
reward of 1e308 ended a run with ``OverflowError``). Real rewards are many orders below it."""


def reward_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a step's reward (a finite real number within ``MAX_ABS_REWARD``,
    not a bool): the rule a local env's result and a server's reply are both read by; None when
    it can. A step breaking it is a protocol error: that rollout is lost, the run goes on."""
    if not isinstance(value, numbers.Real) or _is_bool(value):
        return f"must be a number (int or float), got {_short_repr(value)}"
    try:
        finite = math.isfinite(value)
    except OverflowError:  # an int past any float (a JSON reply may hold 1000 digits)
        finite = False
    if not finite:
        return f"must be finite, got {_short_repr(value)}"
    if abs(value) > MAX_ABS_REWARD:
        return f"must lie within +-{MAX_ABS_REWARD:.0e} (training sums and squares rewards), got {value!r}; scale the env's rewards"
    return None


def valid_text(text: str) -> str:
    """``text`` as UTF-8 can carry it: a lone surrogate (``"\\ud800"``, which no tokenizer or
    wire takes) becomes its backslash escape, six characters, in process and on the wire alike.
    An ``ImageObservation``'s text is made valid the same way."""
    if type(text) is ImageObservation:
        return ImageObservation(valid_text(text.text), text.images)  # type: ignore[return-value]
    if text.isascii():  # O(1) in CPython: the common case costs nothing
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def reset_problems(result: Any) -> list[str]:
    """What is wrong with a ``reset`` result; empty when it is a ``(prompt: str, info: dict)`` tuple."""
    if not isinstance(result, tuple) or len(result) != 2:
        return [f"reset() must return a 2-tuple (prompt, info), got {_shape(result)}"]
    prompt, info = result
    problems = []
    if not isinstance(prompt, str) and (problem := observation_problem(prompt, "reset()")) is not None:
        problems.append(problem.replace("observation", "prompt", 1))
    if not isinstance(info, dict):
        problems.append(f"reset() info must be a dict, got {type(info).__name__}")
    return problems


def step_problems(result: Any, method: str = "step") -> list[str]:
    """What is wrong with a ``step`` result (or a ``call_tool`` one: ``method`` names it); empty
    when it follows the protocol."""
    if not isinstance(result, tuple) or len(result) != 5:
        shape = _shape(result)
        return [f"{method}() must return a 5-tuple (observation, reward, terminated, truncated, info), got {shape}"]
    observation, reward, terminated, truncated, info = result
    problems = []
    if not isinstance(observation, str) and (problem := observation_problem(observation, f"{method}()")) is not None:
        problems.append(problem)
    problem = reward_problem(reward)
    if problem is not None:
        problems.append(f"{method}() reward {problem}")
    for name, value in (("terminated", terminated), ("truncated", truncated)):
        if not _is_bool(value):
            problems.append(f"{method}() {name} must be a bool, got {value!r}")
    if not isinstance(info, dict):
        problems.append(f"{method}() info must be a dict, got {type(info).__name__}")
    return problems


def check_reset_result(result: Any, env_name: str) -> tuple[str, dict[str, Any]]:
    """``result`` as ``(prompt, info)`` (info copied), or ``EnvProtocolError`` naming every problem."""
    if type(result) is tuple and len(result) == 2 and type(result[0]) is str and type(result[1]) is dict:
        return valid_text(result[0]), dict(result[1])  # the common case, at the cost of a few type()s
    problems = reset_problems(result)
    if problems:
        raise _broken(env_name, "reset", result, problems)
    return _observation(result[0], env_name, "reset"), dict(result[1])


def check_step_result(result: Any, env_name: str, method: str = "step") -> StepResult:
    """``result`` with plain ``float``/``bool`` values (info copied), or ``EnvProtocolError`` naming
    every problem and the method that returned it (``step``, ``call_tool``)."""
    if (
        type(result) is tuple
        and len(result) == 5
        and type(text := result[0]) is str
        and type(result[1]) is float
        and -MAX_ABS_REWARD <= result[1] <= MAX_ABS_REWARD  # false for NaN and the infinities too
        and type(result[2]) is bool
        and type(result[3]) is bool
        and type(result[4]) is dict
    ):  # the common case, on every served step: ASCII text is valid as it is (no valid_text call)
        return (text if text.isascii() else valid_text(text)), result[1], result[2], result[3], dict(result[4])
    problems = step_problems(result, method)
    if problems:
        raise _broken(env_name, method, result, problems)
    observation, reward, terminated, truncated, info = result
    observation = _observation(observation, env_name, method)
    return observation, float(reward), bool(terminated), bool(truncated), dict(info)


def _observation(value: Any, env_name: str, method: str) -> str | ImageObservation:
    """A checked observation as the protocol's value: valid text, or text and images."""
    if isinstance(value, str):
        return valid_text(value)
    return valid_text(observation_from(value, f"{env_name}.{method}()"))


def read_state(env: Any) -> Any:
    """The env's ``state``: called when it is a method (its result may be awaitable), else as is."""
    state = getattr(env, "state", None)
    return state() if callable(state) else state


def state_dict(state: Any) -> dict[str, Any]:
    """A state as a dict: a pydantic model is dumped; anything that is not a mapping is ``{}``."""
    if hasattr(state, "model_dump"):
        state = state.model_dump()
    return dict(state) if isinstance(state, dict) else {}


def close_env(env: Any) -> None:
    """Close an env if it has a ``close`` method."""
    close = getattr(env, "close", None)
    if callable(close):
        close()


def _is_bool(value: Any) -> bool:
    # numpy's bool is not a bool subclass; check its type by name rather than import numpy
    return isinstance(value, bool) or (type(value).__name__ in ("bool_", "bool") and type(value).__module__ == "numpy")


def _short_repr(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _shape(value: Any) -> str:
    if isinstance(value, tuple):
        return f"a {len(value)}-tuple"
    return type(value).__name__


def _broken(env_name: str, method: str, result: Any, problems: list[str]) -> EnvProtocolError:
    if inspect.isawaitable(result):
        if hasattr(result, "close"):
            result.close()  # never awaited: close it so Python does not warn about it
        problems = [f"{method}() is async def: await the client's a{method}() instead of calling {method}()"]
    return EnvProtocolError("; ".join(f"{env_name}.{p}" for p in problems))
