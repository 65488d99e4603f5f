"""Per-turn cost of a verifiers taskset played through plugins/agilerl-env-verifiers, score-only
and bridged, against a plain text env of the same shape, all through RolloutHarness in one process.

The episode: three tool calls answered "higher"/"lower"/"correct" in the tool role, then the
answer, scored. The plain env does that in Python; the verifiers env commits every message to a
Trace, runs the Toolset's tool through MCP's server and scores with ``Task.score()``, all on
agilerl's shared loop thread. The bridge runs the env's own ``Env.run``: the null harness
program, the Toolset as an MCP server subprocess, each request streamed from our endpoint. Needs
verifiers, so run it with the plugin's venv:
``.venv-verifiers/bin/python bench/verifiers_turns.py [--episodes N] [--bridge-episodes M]``
from ``plugins/agilerl-env-verifiers/tests`` with it on ``PYTHONPATH`` (the venv the plugin's
tests create). Prints ms per turn and per reset for each side and the ratios.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from agilerl.train.tiny_model import build_tiny_tokenizer
from agilerl.rollout.harness import RolloutHarness

TESTS = Path(__file__).resolve().parent.parent / "plugins" / "agilerl-env-verifiers" / "tests"
CALLS = [f'<tool_call>{{"name": "oracle_check", "arguments": {{"n": {n}}}}}</tool_call>' for n in (5, 8, 7)]
REPLIES = [*CALLS, "7"]


class PlainGuess:
    """The same episode as vf_tasks.Guess, as a plain text env."""

    max_turns = 4
    tools = [{"type": "function", "function": {"name": "oracle_check", "parameters": {"type": "object"}}}]

    def reset(self, seed=None):
        self.target = 7
        return "Find the secret number from 1 to 10 with the check tool, then answer it.", {}

    def step(self, action):
        return "", float(action.strip() == str(self.target)), True, False, {}

    def call_tool(self, name, arguments):
        n = arguments["n"]
        return "correct" if n == self.target else ("higher" if self.target > n else "lower"), 0.0, False, False, {}


def measure(make_env, tokenizer, episodes: int) -> tuple[float, float]:
    """Median ms per reset and per turn over ``episodes`` episodes (one warm-up first)."""
    resets, turns = [], []
    for episode in range(episodes + 1):
        harness = RolloutHarness.local(make_env(), tokenizer, max_turns=4, tool_parser="hermes")
        t0 = time.perf_counter()
        harness.reset(seed=0)
        t1 = time.perf_counter()
        for reply in REPLIES:
            harness.step(reply)
        t2 = time.perf_counter()
        assert harness.trajectory.total_reward == 1.0
        if episode:
            resets.append((t1 - t0) * 1e3)
            turns.append((t2 - t1) * 1e3 / len(REPLIES))
    return statistics.median(resets), statistics.median(turns)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--bridge-episodes", type=int, default=3, help="0 skips the bridge (seconds an episode)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(TESTS))
    from agilerl_env_verifiers.env import VerifiersEnv

    tokenizer = build_tiny_tokenizer("chatml")
    plain = measure(PlainGuess, tokenizer, args.episodes)
    scored = measure(lambda: VerifiersEnv("vf_tasks:Guess"), tokenizer, args.episodes)
    print(f"plain text env: reset {plain[0]:.2f} ms, turn {plain[1]:.2f} ms")
    print(f"verifiers score-only: reset {scored[0]:.2f} ms, turn {scored[1]:.2f} ms")
    print(f"score-only / plain: reset {scored[0] / plain[0]:.2f}x, turn {scored[1] / plain[1]:.2f}x")
    if args.bridge_episodes:
        from agilerl_env_verifiers.bridge import VerifiersBridgeEnv

        bridged = measure(lambda: VerifiersBridgeEnv("vf_bridge_guess"), tokenizer, args.bridge_episodes)
        print(f"verifiers bridge: reset {bridged[0]:.2f} ms, turn {bridged[1]:.2f} ms")
        print(f"bridge / plain: reset {bridged[0] / plain[0]:.2f}x, turn {bridged[1] / plain[1]:.2f}x")


if __name__ == "__main__":
    main()
