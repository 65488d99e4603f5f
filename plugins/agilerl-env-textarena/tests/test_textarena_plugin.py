"""TextArena through agilerl: the adapter's protocol, registered names, a full episode."""

from __future__ import annotations

import subprocess
import sys

import pytest
from agilerl_env_textarena.env import TextArenaEnv

from agilerl.train.tiny_model import build_tiny_tokenizer
from agilerl.manifest.spec import parse_env_spec
from agilerl.llm_envs import RolloutHarness
from agilerl.registry import get_registry, reset_registry


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.delenv("AGILERL_PLUGINS", raising=False)
    reset_registry()
    yield
    reset_registry()


def test_the_adapter_speaks_the_text_protocol_and_pays_out_at_the_end():
    env = TextArenaEnv("GuessTheNumber-v0")
    assert env.max_turns == 10
    prompt, info = env.reset(seed=1)
    assert "Guess The Number" in prompt and info == {"env_id": "GuessTheNumber-v0"}
    low, high, results = 1, 20, []
    while not results or not results[-1][2]:
        guess = (low + high) // 2
        results.append(env.step(f"[{guess}]"))
        observation = results[-1][0]
        assert f"[{guess}]" not in observation  # our own move is not echoed back
        if "higher" in observation:
            low = guess + 1
        elif "lower" in observation:
            high = guess - 1
    assert [r[1] for r in results[:-1]] == [0.0] * (len(results) - 1)
    observation, reward, terminated, truncated, info = results[-1]
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert "Congratulations" in observation and info["turn_count"] == len(results)


def test_the_plugin_registers_single_player_games_without_importing_textarena():
    code = (
        "import sys\nfrom agilerl.registry import get_registry\n"
        "assert 'textarena/sudoku' in get_registry().names('env')\n"
        "assert 'textarena' not in sys.modules, 'listing imported textarena'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    plugin = next(p for p in get_registry().plugins if p.name == "textarena")
    assert (plugin.distribution, plugin.status) == ("agilerl-env-textarena", "ok")


@pytest.mark.parametrize(
    "environment",
    [
        {"entrypoint": "textarena/guess-the-number"},
        {"entrypoint": "textarena", "env_config": {"env_id": "GuessTheNumber-v0"}},
    ],
)
def test_a_manifest_plays_a_game_through_the_harness(environment):
    tokenizer = build_tiny_tokenizer("chatml")
    harness = RolloutHarness.from_spec(parse_env_spec({"env_type": "rollout", **environment}), tokenizer)
    assert harness.max_turns == 10
    harness.reset(seed=1)
    for guess in range(1, 11):  # seed 1 hides 5: counting up finds it within the budget
        _, reward, terminated, _, _ = harness.step(f"[{guess}]")
        if terminated:
            break
    assert (guess, reward, terminated) == (5, 1.0, True)
    assert harness.trajectory.rewards == [0.0, 0.0, 0.0, 0.0, 1.0]
    harness.close()
