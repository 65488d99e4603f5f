"""The URL form of RolloutHarness takes every RemoteEnvClient option, as a manifest's env_url does."""

from __future__ import annotations

from typing import Any

import pytest

from agilerl.llm_envs import RolloutHarness
from tests.test_remote_client import foreign_server  # noqa: F401 - a fixture


def _connect4(frame: dict[str, Any]) -> dict[str, Any]:
    """An OpenEnv connect4-shaped server: the action is ``{"column": int}``, the board a grid."""
    if frame["type"] == "reset":
        return {"observation": {"board": [[0, 0], [0, 0]], "legal_actions": [0, 1]}, "reward": 0.0, "done": False}
    column = int(frame["data"]["column"])
    board = [[0, 0], [1 if column == 0 else 0, 1 if column == 1 else 0]]
    return {"observation": {"board": board, "legal_actions": [0, 1]}, "reward": 1.0, "done": True}


def test_a_url_harness_fills_the_envs_own_action_field(foreign_server, chatml_tokenizer):  # noqa: F811
    url, received = foreign_server(_connect4)
    harness = RolloutHarness(url, chatml_tokenizer, max_turns=8, action_field="column", request_timeout_s=30)
    harness.reset(seed=0)
    observation, reward, terminated, _, _ = harness.step("1")
    harness.close()
    assert received[1]["data"] == {"column": "1"}
    assert (reward, terminated) == (1.0, True)
    assert "board:\n[0,0]\n[0,1]\nlegal_actions: [0,1]" in chatml_tokenizer.decode(harness.trajectory.token_ids)


def test_client_options_with_an_env_object_say_where_they_go(chatml_tokenizer):
    class Local:
        def reset(self, seed=None):
            return "p", {}

        def step(self, action):
            return "o", 0.0, True, False, {}

    with pytest.raises(ValueError, match="action_field='column' applies to an env given as a URL"):
        RolloutHarness(Local(), chatml_tokenizer, max_turns=1, action_field="column")
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        RolloutHarness("ws://127.0.0.1:9/ws", chatml_tokenizer, max_turns=1, colour="red")
