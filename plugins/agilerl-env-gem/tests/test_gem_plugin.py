"""GEM's games through agilerl: registered names, a full episode, and gem.make without the plugin."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from agilerl.train.tiny_model import build_tiny_tokenizer
from agilerl.manifest.spec import parse_env_spec
from agilerl.llm_envs import RolloutHarness
from agilerl.registry import get_registry, reset_registry


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer("chatml")


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch):
    monkeypatch.delenv("AGILERL_PLUGINS", raising=False)
    reset_registry()
    yield
    reset_registry()


def play_binary_search(harness, tokenizer) -> list[float]:
    """Guess the number with feedback, the way a good policy would; returns the rewards."""
    low, high, rewards = 1, 10, []
    prompt, _ = harness.reset(seed=3)
    seen = len(prompt)
    while not harness.done:
        guess = (low + high) // 2
        ids, reward, _, _, _ = harness.step(f"My guess: \\boxed{{{guess}}}")
        rewards.append(reward)
        feedback = tokenizer.decode(list(ids[seen:]))
        seen = len(ids)
        if "higher" in feedback:
            low = guess + 1
        elif "lower" in feedback:
            high = guess - 1
    return rewards


def test_the_plugin_registers_every_game_without_importing_gem():
    code = (
        "import sys\nfrom agilerl.registry import get_registry\n"
        "r = get_registry()\nassert 'gem/guess-the-number-easy' in r.names('env')\n"
        "assert 'gem' not in sys.modules, 'listing imported gem'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    plugin = next(p for p in get_registry().plugins if p.name == "gem")
    assert (plugin.distribution, plugin.status) == ("agilerl-env-gem", "ok")
    assert {"gem", "gem/wordle-easy", "gem/sudoku-hard"} <= set(plugin.provides["env"])
    entry = get_registry().get("env", "gem/guess-the-number-easy")
    assert entry.target_ref == "agilerl_env_gem.env:GemEnv('game:GuessTheNumber-v0-easy')"


def test_a_registered_game_plays_to_a_win_through_the_harness(tokenizer):
    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "gem/guess-the-number-easy"})
    harness = RolloutHarness.from_spec(spec, tokenizer)
    rewards = play_binary_search(harness, tokenizer)
    assert rewards[-1] > 0 and len(rewards) <= 4
    assert harness.trajectory.rewards == rewards
    harness.close()


def test_the_generic_name_takes_env_id_in_env_config(tokenizer):
    spec = parse_env_spec(
        {"env_type": "rollout", "entrypoint": "gem", "env_config": {"env_id": "game:GuessTheNumber-v0-easy"}}
    )
    harness = RolloutHarness.from_spec(spec, tokenizer)
    assert play_binary_search(harness, tokenizer)[-1] > 0


def test_gem_make_works_as_an_entrypoint_without_the_plugin(tokenizer, monkeypatch):
    monkeypatch.setenv("AGILERL_PLUGINS", "")
    reset_registry()
    assert "gem" not in {p.name for p in get_registry().plugins}
    spec = parse_env_spec(
        {"env_type": "rollout", "entrypoint": "gem:make", "env_config": {"env_id": "game:GuessTheNumber-v0-easy"}}
    )
    harness = RolloutHarness.from_spec(spec, tokenizer)
    assert harness.max_turns == 4
    prompt, _ = harness.reset(seed=3)
    assert re.search("Guess The Number", tokenizer.decode(list(prompt)))
    harness.close()
