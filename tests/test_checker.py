"""check_env tells an env author exactly what is wrong."""

from __future__ import annotations

import random

import pytest

from agilerl.errors import EnvCheckError
from agilerl.envs.checker import check_env


class Good:
    max_turns = 3

    def reset(self, seed=None):
        return f"target {random.Random(seed).randint(0, 9)}", {}

    def step(self, action):
        return "ok", 1, True, False, {}


def _problems(env):
    return check_env(env, raise_on_error=False).problems


def test_a_good_env_passes():
    report = check_env(Good())
    assert report.ok and report.notes == []


def test_wrong_step_arity_and_types():
    class Bad(Good):
        def step(self, action):
            return "ok", 1.0, True, {}

    assert _problems(Bad()) == [
        "step() must return a 5-tuple (observation, reward, terminated, truncated, info), got a 4-tuple"
    ]

    class Types(Good):
        def step(self, action):
            return 3, "1.0", 1, None, []

    assert _problems(Types()) == [
        "step() observation must be str, got int",
        "step() reward must be a number (int or float), got '1.0'",
        "step() terminated must be a bool, got 1",
        "step() truncated must be a bool, got None",
        "step() info must be a dict, got list",
    ]


def test_reward_must_be_finite_and_not_bool():
    class Nan(Good):
        def step(self, action):
            return "ok", float("nan"), True, False, {}

    class Flag(Good):
        def step(self, action):
            return "ok", True, True, False, {}

    assert _problems(Nan()) == ["step() reward must be finite, got nan"]
    assert _problems(Flag()) == ["step() reward must be a number (int or float), got True"]


def test_reset_not_reproducible():
    class Unseeded(Good):
        counter = 0

        def reset(self, seed=None):
            Unseeded.counter += 1
            return f"p{Unseeded.counter}", {}

    [problem] = _problems(Unseeded())
    assert problem.startswith("reset(seed=0) is not reproducible") and "seed your random generator" in problem


def test_exceptions_are_reported_not_raised_through():
    class Raises(Good):
        def step(self, action):
            raise KeyError("boom")

    assert _problems(Raises()) == ["step('1') raised KeyError: 'boom'"]


def test_optional_members_are_checked():
    class Optional(Good):
        tools = [{"type": "function", "function": {"description": "no name"}}]
        dataset_size = -1
        max_turns = 0

    assert _problems(Optional()) == [
        "max_turns must be an int >= 1, got 0",
        "dataset_size must be an int >= 0, got -1",
        "tools[0] has no 'name' (nor function.name)",
        "env has dataset_size, so reset() must accept row_index, evaluation as keywords",
    ]


def test_missing_methods_and_raise_mode():
    with pytest.raises(EnvCheckError, match="missing method step"):
        check_env(object())
