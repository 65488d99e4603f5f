"""verifiers v1 tasksets through agilerl, in the plugin's own venv (verifiers pins openai < 3, the
dev env has 3): ``<repo>/.venv-verifiers``, built by tests/extra_venvs.py on first use (the suite's site
packages plus verifiers and this plugin; in the background while other tests run), reused after. Each test runs one script there and reads its JSON."""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.extra_venvs import VENVS

pytestmark = pytest.mark.slow  # builds .venv-verifiers on first use, then runs verifiers in it

PLUGIN = Path(__file__).resolve().parent.parent
ROOT = PLUGIN.parent.parent


@pytest.fixture(scope="session")
def vf_python() -> Path:
    return VENVS["verifiers"].ensure()


def run(vf_python: Path, code: str, *args: str) -> object:
    """Run ``code`` in the venv (tests/ on the path); it prints one JSON value last."""
    result = subprocess.run(
        [str(vf_python), "-c", textwrap.dedent(code), *args], capture_output=True, text=True, timeout=300,
        cwd=PLUGIN / "tests", env={**os.environ, "PYTHONPATH": str(PLUGIN / "tests"), "AGILERL_PLUGINS": "agilerl,verifiers"},
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


PLAY = """
import contextlib, io, json, sys
from agilerl.train.tiny_model import build_tiny_tokenizer
from agilerl.cli.main import main
from agilerl.llm_envs import RolloutHarness
from agilerl.manifest.spec import parse_env_spec

tokenizer = build_tiny_tokenizer("chatml")
out = {}
for name, (env_config, episodes) in json.loads(sys.argv[1]).items():
    spec = parse_env_spec({"env_type": "rollout", "entrypoint": "verifiers", "env_config": env_config,
                           **({} if env_config.get("mode") == "bridge" else {"tool_parser": "hermes"})})
    out[name] = []
    for replies in episodes:
        with RolloutHarness.from_spec(spec, tokenizer) as harness:
            harness.reset(seed=0)
            rewards, infos = [], []
            for reply in replies:
                _, reward, terminated, truncated, info = harness.step(reply)
                rewards.append(reward)
                infos.append(info)
                if harness.done:
                    break
            out[name].append({"rewards": rewards, "terminated": terminated, "truncated": truncated,
                              "infos": infos, "text": tokenizer.decode(harness.trajectory.token_ids)})
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    code = main(["env", "check", "verifiers", "--env-config", '{"taskset": "vf_tasks:Reverse"}',
                 "--actions", "desserts", "--episodes", "3", "--json"])
out["env check"] = {"exit": code, **json.loads(printed.getvalue())}
import importlib.util
bench = importlib.util.spec_from_file_location("verifiers_turns", sys.argv[2])
module = importlib.util.module_from_spec(bench)
bench.loader.exec_module(module)
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    module.main(["--episodes", "1", "--bridge-episodes", "0"])
out["bench"] = printed.getvalue()
print(json.dumps(out))
"""
CALL = '<tool_call>{{"name": "oracle_check", "arguments": {{"n": {}}}}}</tool_call>'
ADD = '<tool_call>{"name": "adder_add", "arguments": {"a": 2, "b": 3}}</tool_call>'
EPISODES = {
    "reverse": ({"taskset": "vf_tasks:Reverse"}, [["desserts"], ["dessert"]]),
    "guess": ({"taskset": "vf_tasks:Guess"}, [[CALL.format(5), CALL.format(8), CALL.format(7), "7"]]),
    "guess cut short": ({"taskset": "vf_tasks:Guess", "max_turns": 2}, [[CALL.format(7)] * 3]),
    "sums": ({"taskset": "vf_tasks:Sums"}, [[ADD, "5"], ["5"]]),
    # bridge: the env's own Env.run (null harness program, the Toolset served over MCP)
    "bridge reverse": ({"taskset": "vf_bridge_reverse", "mode": "bridge"}, [["desserts"]]),
    "bridge guess": ({"taskset": "vf_bridge_guess", "mode": "bridge"}, [[CALL.format(5), CALL.format(7), "7"]]),
    "bridge cut short": ({"taskset": "vf_bridge_guess", "mode": "bridge", "max_turns": 2}, [[CALL.format(7)] * 3]),
}


@pytest.fixture(scope="module")
def played(vf_python):
    """Every episode below, played in one process of the venv (importing verifiers takes seconds)."""
    return run(vf_python, PLAY, json.dumps(EPISODES), str(ROOT / "bench" / "verifiers_turns.py"))


def test_a_single_turn_taskset_is_scored_by_its_own_reward(played):
    exact, partial = played["reverse"]
    assert exact["rewards"] == [1.0] and exact["terminated"]
    assert partial["rewards"] == [pytest.approx(7 / 8)]
    assert exact["infos"][0]["rewards"] == {"lcs": 1.0}
    assert "<|im_start|>system\nReply with the text only.<|im_end|>\n<|im_start|>user\nReverse: stressed" in exact["text"]


def test_a_multi_turn_task_with_a_toolset_answers_tool_calls_in_the_tool_role(played):
    (episode,) = played["guess"]
    assert episode["rewards"] == [0.0, 0.0, 0.0, 1.0] and episode["terminated"]
    assert '"name": "oracle_check"' in episode["text"].split("<|im_end|>")[0]  # the tool's schema in the system turn
    for answer in ("higher", "lower", "correct"):
        assert f"<|im_start|>tool\n{answer}<|im_end|>" in episode["text"]


def test_an_episode_cut_short_by_max_turns_is_still_scored(played):
    (episode,) = played["guess cut short"]
    assert episode["truncated"] and not episode["terminated"] and len(episode["rewards"]) == 2
    assert episode["infos"][-1]["rewards"] == {"found": 0.0}  # scored on the trace so far


def test_a_taskset_wide_toolset_runs_in_process(played):
    with_tool, without = played["sums"]
    assert with_tool["rewards"] == [0.0, 1.0] and "<|im_start|>tool\n5<|im_end|>" in with_tool["text"]
    assert without["rewards"] == [0.5]


def test_env_check_plays_a_taskset_named_on_the_command_line(played):
    summary = played["env check"]
    assert summary["exit"] == 0 and summary["problems"] == [] and summary["episodes"] == 3
    # "desserts" against stressed, drawer, agilerl reversed: the taskset's LCS reward, row by row
    assert summary["rewards"] == [1.0, pytest.approx(2 / 6), pytest.approx(1 / 7)]


def test_the_bench_reports_score_only_against_a_plain_env(played):
    """bench/verifiers_turns.py still runs (at its smallest size) and prints its ratio line."""
    assert re.search(r"^score-only / plain: reset \d+\.\d+x, turn \d+\.\d+x$", played["bench"], re.M), played["bench"]


def test_bridge_mode_runs_the_envs_own_episode_against_our_replies(played):
    (reverse,) = played["bridge reverse"]
    assert reverse["rewards"] == [1.0] and reverse["terminated"] and reverse["infos"][0]["rewards"] == {"lcs": 1.0}
    assert "<|im_start|>system\nReply with the text only.<|im_end|>\n<|im_start|>user\nReverse: stressed" in reverse["text"]
    (guess,) = played["bridge guess"]
    assert guess["rewards"] == [0.0, 0.0, 1.0] and guess["terminated"]
    assert [i.get("observation_role") for i in guess["infos"][:2]] == ["tool", "tool"]
    assert "<|im_start|>tool\nhigher<|im_end|>" in guess["text"] and "<|im_start|>tool\ncorrect<|im_end|>" in guess["text"]


def test_bridge_mode_scores_an_episode_cut_short(played):
    (episode,) = played["bridge cut short"]
    assert episode["truncated"] and len(episode["rewards"]) == 2
    assert episode["infos"][-1]["rewards"] == {"found": 0.0}
