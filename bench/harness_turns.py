"""Per-turn cost of RolloutHarness.step at the first and the last turn, against a raw baseline.

The raw baseline is what any harness must do at least: ``env.step`` plus ``tokenizer.encode`` of the
observation. Run: ``python bench/harness_turns.py``. Prints one line per episode length.
"""

from __future__ import annotations

import statistics
import time

from agilerl.train.tiny_model import build_tiny_tokenizer
from agilerl.rollout.harness import RolloutHarness

OBSERVATION = "Too high! Your guess was above the target, try a lower number."


class CountingEnv:
    """Never ends by itself: the harness's turn budget ends every episode.

    Every observation is new text (it carries a counter), so the harness's memo of repeated
    observations never hits: this measures the full per-turn work.
    """

    def __init__(self) -> None:
        self.count = 0

    def reset(self, seed=None):
        return "Guess a number between 1 and 100.", {}

    def step(self, action):
        self.count += 1
        return f"{OBSERVATION} ({self.count})", 0.0, False, False, {}


def raw_step_us(tokenizer, steps: int) -> float:
    env = CountingEnv()
    env.reset()
    start = time.perf_counter()
    for _ in range(steps):
        obs, *_ = env.step("42")
        tokenizer.encode(obs, add_special_tokens=False)
    return (time.perf_counter() - start) / steps * 1e6


def harness_turn_us(tokenizer, turns: int, episodes: int) -> tuple[float, float]:
    harness = RolloutHarness.local(CountingEnv(), tokenizer, max_turns=turns)
    completion = tokenizer.encode("42", add_special_tokens=False) + [harness.renderer.end_of_turn_id]
    first, last = [], []
    clock = time.perf_counter
    for _ in range(episodes):
        harness.reset(seed=0)
        for turn in range(turns):
            t0 = clock()
            harness.step(completion)
            dt = clock() - t0
            if turn == 0:
                first.append(dt)
            if turn == turns - 1:
                last.append(dt)
    return statistics.median(first) * 1e6, statistics.median(last) * 1e6


def main() -> None:
    tokenizer = build_tiny_tokenizer("chatml")
    harness_turn_us(tokenizer, 10, 20)  # warm-up
    raw = min(raw_step_us(tokenizer, 5000) for _ in range(3))
    print(f"raw baseline (env.step + tokenizer.encode): {raw:.1f} us/turn")
    for turns in (1, 10, 50, 200):
        episodes = max(20, 4000 // turns)
        first, last = harness_turn_us(tokenizer, turns, episodes)
        print(
            f"{turns:>3} turns: first {first:6.1f} us, last {last:6.1f} us, "
            f"last/first {last / first:4.2f}x, last/raw {last / raw:4.2f}x"
        )


if __name__ == "__main__":
    main()
