"""The text-env protocol's rules (agilerl.protocol) hold the same for all three users: the
in-process client, the env server and ``check_env`` accept and refuse the same results."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from agilerl.envs.checker import check_env
from agilerl.envs.client import InProcessEnvClient
from agilerl.errors import EnvProtocolError, InvalidArgument, RemoteEnvError
from agilerl.protocol import EnvInfo, member_problem, reset_kwargs
from agilerl.remote.client import RemoteEnvClient
from agilerl.remote.frames import decode, reset_frame
from agilerl.remote.hosting import resolve_env
from agilerl.rollout.collector import RolloutCollector
from agilerl.rollout.harness import RolloutHarness


class ScriptedEnv:
    """Answers ``reset`` and ``step`` with the class attributes ``RESET`` and ``STEP``."""

    RESET: Any = ("go", {})
    STEP: Any = ("ok", 1.0, True, False, {})
    max_turns = 2

    def reset(self, seed=None):
        return self.RESET

    def step(self, action):
        return self.STEP


def env_class(reset: Any = None, step: Any = None) -> type[ScriptedEnv]:
    attrs = {"RESET": reset} if reset is not None else {}
    if step is not None:
        attrs["STEP"] = step
    return type("ScriptedEnv", (ScriptedEnv,), attrs)


REFUSED = [
    (env_class(reset="go"), "reset() must return a 2-tuple (prompt, info), got str"),
    (env_class(reset=(1, {})), "reset() prompt must be str, got int"),
    (env_class(reset=("go", None)), "reset() info must be a dict, got NoneType"),
    (
        env_class(step=("ok", 1.0, True, {})),
        "step() must return a 5-tuple (observation, reward, terminated, truncated, info), got a 4-tuple",
    ),
    (env_class(step=(7, 1.0, True, False, {})), "step() observation must be str, got int"),
    (env_class(step=("ok", float("nan"), True, False, {})), "step() reward must be finite, got nan"),
    (env_class(step=("ok", True, True, False, {})), "step() reward must be a number (int or float), got True"),
    (env_class(step=("ok", "1", True, False, {})), "step() reward must be a number (int or float), got '1'"),
    (env_class(step=("ok", 1.0, 1, False, {})), "step() terminated must be a bool, got 1"),
    (env_class(step=("ok", 1.0, False, None, {})), "step() truncated must be a bool, got None"),
    (env_class(step=("ok", 1.0, True, False, None)), "step() info must be a dict, got NoneType"),
]


def play(client: Any) -> tuple[Any, Any]:
    first = client.reset(seed=0)
    return first, client.step("1")


@pytest.mark.parametrize(("env_cls", "problem"), REFUSED)
def test_every_user_refuses_a_broken_result_with_the_same_words(env_cls: type, problem: str) -> None:
    assert problem in check_env(env_cls(), raise_on_error=False).problems
    with pytest.raises(EnvProtocolError) as local:
        play(InProcessEnvClient(env_cls()))
    assert f"ScriptedEnv.{problem}" in str(local.value)
    url, server = resolve_env(env_cls)
    with server, RemoteEnvClient(url) as client, pytest.raises(RemoteEnvError) as remote:
        play(client)
    assert remote.value.code == "EXECUTION_ERROR"
    assert f"EnvProtocolError: ScriptedEnv.{problem}" in str(remote.value)


ACCEPTED = [
    (env_class(step=("ok", 2, True, False, {"k": 1})), ("ok", 2.0, True, False, {"k": 1})),
    (env_class(step=("ok", np.float32(0.5), np.bool_(True), np.bool_(False), {})), ("ok", 0.5, True, False, {})),
    (env_class(step=("ok", np.int64(3), False, True, {})), ("ok", 3.0, False, True, {})),
]


@pytest.mark.parametrize(("env_cls", "expected"), ACCEPTED)
def test_every_user_accepts_numbers_and_numpy_bools_and_hands_back_plain_types(env_cls: type, expected: tuple) -> None:
    assert check_env(env_cls()).ok
    _, local = play(InProcessEnvClient(env_cls()))
    assert local == expected
    assert [type(v) for v in local[1:4]] == [float, bool, bool]
    url, server = resolve_env(env_cls)
    with server, RemoteEnvClient(url) as client:
        assert play(client)[1] == expected


@pytest.mark.parametrize("value", [0, -1, True, 2.0, "3"])
def test_one_max_turns_rule_for_the_checker_the_harness_and_the_collector(value: Any, chatml_tokenizer: Any) -> None:
    problem = f"max_turns must be an int >= 1, got {value!r}"
    assert member_problem("max_turns", value) == problem
    declaring = type("E", (ScriptedEnv,), {"max_turns": value})
    assert problem in check_env(declaring(), raise_on_error=False).problems
    with pytest.raises(InvalidArgument, match=re.escape(problem)):
        RolloutHarness(ScriptedEnv(), chatml_tokenizer, max_turns=value)
    with pytest.raises(InvalidArgument, match=re.escape(problem)):
        RolloutCollector(ScriptedEnv, chatml_tokenizer, batch_size=1, group_size=1, max_turns=value)
    # declared by the env, it is ignored with a warning, and then nothing gives a budget
    with pytest.warns(UserWarning, match=re.escape(f"E: {problem}; it is ignored")):
        with pytest.raises(InvalidArgument, match="no turn budget: max_turns is not given and E declares no usable"):
            RolloutCollector(declaring, chatml_tokenizer, batch_size=1, group_size=1)


def test_a_missing_max_turns_is_one_error_naming_the_field_to_set(chatml_tokenizer: Any) -> None:
    bare = type("Bare", (ScriptedEnv,), {"max_turns": None})
    fix = "Set environment.max_turns in the manifest or pass max_turns="
    for build in (
        lambda: RolloutHarness(bare(), chatml_tokenizer),
        lambda: RolloutHarness.local(bare(), chatml_tokenizer),
        lambda: RolloutCollector(bare, chatml_tokenizer, batch_size=1, group_size=1),
    ):
        with pytest.raises(InvalidArgument, match=fix):
            build()
    assert "no max_turns attribute: manifests must set max_turns" in check_env(bare()).notes


class DeclaringEnv(ScriptedEnv):
    """Declares every optional member."""

    max_turns = 4
    tools = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
    system_prompt = "Answer with a number."
    dataset_size = 30
    eval_dataset_size = 5
    max_reward = 2

    def reset(self, seed=None, row_index=None, evaluation=None):
        return self.RESET


class MisdeclaringEnv(ScriptedEnv):
    """Declares every optional member wrongly."""

    max_turns = 0
    tools = {"name": "add"}
    system_prompt = 7
    dataset_size = True
    eval_dataset_size = -1
    max_reward = "lots"


MISDECLARED = {
    "max_turns must be an int >= 1, got 0",
    "tools must be a list of JSON-schema dicts, got {'name': 'add'}",
    "system_prompt must be a str, got 7",
    "dataset_size must be an int >= 0, got True",
    "eval_dataset_size must be an int >= 0, got -1",
    "max_reward must be a finite number, got 'lots'",
}


def test_a_served_env_describes_itself_as_it_does_in_process() -> None:
    local = InProcessEnvClient(DeclaringEnv()).describe()
    assert local == EnvInfo(
        name="DeclaringEnv", max_turns=4, tools=DeclaringEnv.tools, system_prompt="Answer with a number.",
        dataset_size=30, eval_dataset_size=5, max_reward=2.0,
    )
    url, server = resolve_env(DeclaringEnv, max_concurrent_envs=3)
    with server, RemoteEnvClient(url) as client:
        assert client.describe() == replace(local, max_concurrent_envs=3)  # plus the server's session limit


def ignored_members(caught: Any) -> set[str]:
    return {str(w.message).split(": ", 1)[1].split("; it is ignored")[0] for w in caught}


def test_a_misdeclared_member_is_ignored_alike_in_process_and_served() -> None:
    with pytest.warns(UserWarning) as caught:
        assert InProcessEnvClient(MisdeclaringEnv()).describe() == EnvInfo(name="MisdeclaringEnv")
    assert ignored_members(caught) == MISDECLARED
    assert set(check_env(MisdeclaringEnv(), raise_on_error=False).problems) >= MISDECLARED
    url, server = resolve_env(MisdeclaringEnv, max_concurrent_envs=3)
    with server, RemoteEnvClient(url) as client, pytest.warns(UserWarning) as caught:
        assert client.describe() == EnvInfo(name="MisdeclaringEnv", max_concurrent_envs=3)
    assert ignored_members(caught) == MISDECLARED  # the server leaves them out, for the same reasons


@pytest.fixture
def metadata_server() -> Any:
    """A hand-written server whose ``/metadata`` says whatever the test gives it."""
    from aiohttp import web

    from tests.loopback import LoopbackServer

    servers: list[LoopbackServer] = []

    def start(metadata: dict[str, Any]) -> str:
        app = web.Application()
        app.router.add_get("/metadata", lambda request: web.json_response(metadata))
        servers.append(LoopbackServer(app, "metadata-server"))
        return servers[-1].url

    yield start
    for server in servers:
        server.stop()


def test_a_client_refuses_what_a_server_publishes_wrongly_by_the_same_rules(metadata_server: Any) -> None:
    url = metadata_server({
        "name": "odd", "max_turns": 0, "tools": {"name": "add"}, "system_prompt": 7, "dataset_size": True,
        "eval_dataset_size": -1, "max_reward": "lots", "max_concurrent_envs": "many",
    })
    with pytest.warns(UserWarning) as caught:
        assert RemoteEnvClient(url).describe() == EnvInfo(name="odd")
    assert ignored_members(caught) == MISDECLARED | {"max_concurrent_envs must be an int >= 1, got 'many'"}


def test_an_env_info_cannot_hold_what_the_rules_refuse() -> None:
    with pytest.raises(InvalidArgument, match=r"x: max_turns must be an int >= 1, got 0; max_reward must be"):
        EnvInfo(name="x", max_turns=0, max_reward=float("nan"))


class PlainEnv:
    """Takes only ``seed``: reset must never be passed row_index or evaluation it did not ask for."""

    def reset(self, seed=None):
        return f"seed {seed}", {}

    def step(self, action):
        return action, 0.0, True, False, {}


class RowEnv(PlainEnv):
    dataset_size = 10

    def reset(self, seed=None, *, row_index=None, evaluation=None):
        return f"seed {seed} row {row_index} eval {evaluation}", {}


def test_reset_keywords_are_passed_only_when_set_in_process_and_over_the_wire() -> None:
    assert reset_kwargs() == {} and reset_kwargs(0, False) == {"row_index": 0, "evaluation": False}
    assert decode(reset_frame(3)) == {"type": "reset", "data": {"seed": 3}}
    assert InProcessEnvClient(PlainEnv()).reset(3) == ("seed 3", {})
    assert InProcessEnvClient(RowEnv()).reset(3, row_index=0, evaluation=False) == ("seed 3 row 0 eval False", {})
    url, server = resolve_env(PlainEnv)
    with server, RemoteEnvClient(url) as client:
        assert client.reset(3) == ("seed 3", {})
    url, server = resolve_env(RowEnv)
    with server, RemoteEnvClient(url) as client:
        assert client.reset(3, row_index=0, evaluation=False) == ("seed 3 row 0 eval False", {})
