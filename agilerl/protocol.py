"""The text-env protocol: the one shape every environment is reached through, and its rules.

Every user of an env (the in-process client, the env server, ``check_env``) checks what the env
returns with the functions here, so they all accept and refuse the same things: ``reset`` returns
``(str, dict)``; ``step`` returns ``(str, finite real number, bool, bool, dict)`` (a bool is not a
reward; numpy's bool counts as a bool); a turn budget is an int >= 1.
"""

from __future__ import annotations

import inspect
import math
import numbers
from typing import Any, Protocol, runtime_checkable

from agilerl.errors import EnvProtocolError, InvalidArgument

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
        except Exception:
            value = None
        described[name] = value if has_member_type(name, value) else None
    return described


def has_member_type(name: str, value: Any) -> bool:
    """Whether ``value`` is usable as the optional member ``name`` (a bool is not a number)."""
    return isinstance(value, DESCRIBED_MEMBERS[name]) and not isinstance(value, bool)


def reset_kwargs(row_index: int | None = None, evaluation: bool | None = None) -> dict[str, Any]:
    """The keywords ``reset`` gets besides ``seed``: ``row_index``/``evaluation`` only when set, so
    plain envs (which take only ``seed``) and dataset envs are reset the same way."""
    kwargs: dict[str, Any] = {}
    if row_index is not None:
        kwargs["row_index"] = row_index
    if evaluation is not None:
        kwargs["evaluation"] = evaluation
    return kwargs


def reset_problems(result: Any) -> list[str]:
    """What is wrong with a ``reset`` result; empty when it is a ``(prompt: str, info: dict)`` tuple."""
    if not isinstance(result, tuple) or len(result) != 2:
        return [f"reset() must return a 2-tuple (prompt, info), got {_shape(result)}"]
    prompt, info = result
    problems = []
    if not isinstance(prompt, str):
        problems.append(f"reset() prompt must be str, got {type(prompt).__name__}")
    if not isinstance(info, dict):
        problems.append(f"reset() info must be a dict, got {type(info).__name__}")
    return problems


def step_problems(result: Any) -> list[str]:
    """What is wrong with a ``step`` result; empty when it follows the protocol."""
    if not isinstance(result, tuple) or len(result) != 5:
        shape = _shape(result)
        return [f"step() must return a 5-tuple (observation, reward, terminated, truncated, info), got {shape}"]
    observation, reward, terminated, truncated, info = result
    problems = []
    if not isinstance(observation, str):
        problems.append(f"step() observation must be str, got {type(observation).__name__}")
    if not isinstance(reward, numbers.Real) or _is_bool(reward):
        problems.append(f"step() reward must be a number (int or float), got {reward!r}")
    elif not math.isfinite(reward):
        problems.append(f"step() reward must be finite, got {reward!r}")
    for name, value in (("terminated", terminated), ("truncated", truncated)):
        if not _is_bool(value):
            problems.append(f"step() {name} must be a bool, got {value!r}")
    if not isinstance(info, dict):
        problems.append(f"step() info must be a dict, got {type(info).__name__}")
    return problems


def check_reset_result(result: Any, env_name: str) -> tuple[str, dict[str, Any]]:
    """``result`` as ``(prompt, info)`` (info copied), or ``EnvProtocolError`` naming every problem."""
    if type(result) is tuple and len(result) == 2 and type(result[0]) is str and type(result[1]) is dict:
        return result[0], dict(result[1])  # the common case, checked at the cost of a few type()s
    problems = reset_problems(result)
    if problems:
        raise _broken(env_name, "reset", result, problems)
    return result[0], dict(result[1])


def check_step_result(result: Any, env_name: str) -> StepResult:
    """``result`` with plain ``float``/``bool`` values (info copied), or ``EnvProtocolError`` naming
    every problem."""
    if (
        type(result) is tuple
        and len(result) == 5
        and type(result[0]) is str
        and type(result[1]) is float
        and math.isfinite(result[1])
        and type(result[2]) is bool
        and type(result[3]) is bool
        and type(result[4]) is dict
    ):
        return result[0], result[1], result[2], result[3], dict(result[4])  # the common case
    problems = step_problems(result)
    if problems:
        raise _broken(env_name, "step", result, problems)
    observation, reward, terminated, truncated, info = result
    return observation, float(reward), bool(terminated), bool(truncated), dict(info)


def max_turns_problem(value: Any) -> str | None:
    """Why ``value`` cannot be a turn budget (it must be an int >= 1, not a bool); None when it can."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return None
    return f"max_turns must be an int >= 1, got {value!r}"


def require_max_turns(value: Any, fix: str = "") -> int:
    """``value`` when it is a usable turn budget, else ``InvalidArgument`` (with ``fix`` appended)."""
    problem = max_turns_problem(value)
    if problem is not None:
        raise InvalidArgument(f"{problem}; {fix}" if fix else problem)
    return value


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
