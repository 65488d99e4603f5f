"""The CLI refuses bad input up front, with one line and exit 2, and never prints a traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

GUESS = Path(__file__).resolve().parents[1] / "agilerl" / "builtins" / "guess.py"


def _agilerl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "agilerl", *args], capture_output=True, text=True, timeout=120)


def test_serve_with_an_env_config_the_env_refuses_exits_before_serving():
    result = _agilerl("serve", f"{GUESS}:GuessEnv", "--env-config", '{"nope": 1}', "--port", "0")
    assert result.returncode == 2
    assert "cannot be built with --env-config {\"nope\": 1}: TypeError" in result.stderr
    assert "serving" not in result.stdout and "Traceback" not in result.stderr


@pytest.mark.parametrize("token", ["", "  "])
def test_serve_refuses_an_empty_token_instead_of_turning_auth_off(token):
    result = _agilerl("serve", f"{GUESS}:GuessEnv", "--token", token, "--port", "0")
    assert result.returncode == 2
    assert "--token is blank" in result.stderr


def test_serve_refuses_an_unknown_event_loop_before_building_the_env():
    result = _agilerl("serve", "no_such_module:Env", "--loop", "trio", "--port", "0")
    assert result.returncode == 2
    assert "event loop 'trio' (from --loop) is not one of auto, uvloop, asyncio" in result.stderr
    assert "no_such_module" not in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("value", ["1048577", "10000000000"])
def test_eval_refuses_max_new_tokens_past_the_manifests_bound(value):
    from agilerl.manifest.settings import MAX_NEW_TOKENS

    result = _agilerl("eval", f"{GUESS}:GuessEnv", "--model", "tiny", "--max-new-tokens", value)
    assert result.returncode == 2
    assert f"argument --max-new-tokens: must be at most {MAX_NEW_TOKENS}" in result.stderr
    assert f"got {value}" in result.stderr and "Traceback" not in result.stderr


def test_no_command_prints_usage_and_exits_2():
    result = _agilerl()
    assert result.returncode == 2
    assert "usage: agilerl" in result.stderr


def test_a_reader_that_stops_early_is_not_an_error():
    # 2,000 transcripts are far more than a pipe buffers, so the writer meets the closed pipe
    result = subprocess.run(
        f"{sys.executable} -m agilerl env check {GUESS}:GuessEnv --actions 5 --episodes 2000 | head -c 12",
        shell=True, capture_output=True, text=True, timeout=120,
    )
    assert result.stdout == "=== episode "
    assert "BrokenPipe" not in result.stderr and "error" not in result.stderr
