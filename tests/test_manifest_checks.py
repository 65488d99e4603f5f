"""`agilerl manifest validate` catches what `train` would reject, with a "did you mean"."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GUESS_ENV = Path(__file__).resolve().parents[1] / "agilerl" / "builtins" / "guess.py"


def _validate(tmp_path: Path, body: str, *flags: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "guess_env.py").write_text(GUESS_ENV.read_text())
    path = tmp_path / "m.yaml"
    path.write_text(body)
    return subprocess.run(
        [sys.executable, "-m", "agilerl", "manifest", "validate", str(path), *flags],
        capture_output=True, text=True, timeout=120,
    )


@pytest.mark.parametrize("offline", [False, True], ids=["imports", "offline"])
def test_misspelt_registered_names_are_errors_with_the_closest_names(tmp_path, offline):
    result = _validate(
        tmp_path,
        "environment: {env_type: rollout, entrypoint: gem/wordle-eazy}\nalgorithm: {name: grop}\n",
        *(["--offline"] if offline else []),
    )
    assert result.returncode == 2
    assert "environment.entrypoint: no env named 'gem/wordle-eazy' is registered. Did you mean 'gem/wordle-easy'" in result.stderr
    assert "algorithm.name: no algorithm named 'grop' is registered. Did you mean 'grpo'?" in result.stderr
    entry_line = next(line for line in result.stderr.splitlines() if "gem/wordle-eazy" in line)
    assert entry_line.count("'gem/") <= 6  # the name itself and at most five suggestions


def test_a_missing_file_and_an_unknown_algorithm_option_are_errors(tmp_path):
    missing = _validate(tmp_path, "environment: {env_type: rollout, entrypoint: nonexistent.py:Env}\n")
    assert missing.returncode == 2 and "environment.entrypoint: file not found:" in missing.stderr
    option = _validate(
        tmp_path, "environment: {env_type: rollout, entrypoint: guess_env.py:GuessEnv}\nalgorithm: {name: grpo, betaa: 0.1}\n"
    )
    assert option.returncode == 2
    assert "algorithm.betaa: Extra inputs are not permitted" in option.stderr and "beta" in option.stderr
    offline = _validate(
        tmp_path, "environment: {env_type: rollout, entrypoint: guess_env.py:GuessEnv}\nalgorithm: {name: grpo, betaa: 0.1}\n",
        "--offline",
    )
    assert offline.returncode == 0  # offline imports no algorithm code, so options are not checked


def test_a_typo_in_an_environment_key_warns_with_did_you_mean_even_beside_an_error(tmp_path):
    result = _validate(
        tmp_path, "environment: {env_type: rollout, entrypoint: guess_env.py:GuessEnv, max_turn: 3, sytem_prompt: hi}\nalgorithm: {name: grop}\n"
    )
    assert result.returncode == 2
    assert "max_turn (did you mean 'max_turns'?)" in result.stderr
    assert "sytem_prompt (did you mean 'env_config: {system_prompt: ...}'?)" in result.stderr


def test_env_check_on_a_bare_file_suggests_the_file_class_form(tmp_path):
    (tmp_path / "guess_env.py").write_text(GUESS_ENV.read_text())
    result = subprocess.run(
        [sys.executable, "-m", "agilerl", "env", "check", "guess_env.py"], capture_output=True, text=True,
        timeout=120, cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "name the env in it as 'guess_env.py:GuessEnv'" in result.stderr
    wrong = subprocess.run(
        [sys.executable, "-m", "agilerl", "env", "check", "guess_env.py:Guess"], capture_output=True, text=True,
        timeout=120, cwd=tmp_path,
    )
    assert wrong.returncode == 2 and "guess_env.py' has no attribute 'Guess'" in wrong.stderr
    assert "_agilerl_file_" not in result.stderr + wrong.stderr
