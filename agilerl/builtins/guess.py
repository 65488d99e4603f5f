"""The built-in ``guess`` env (the docs' GuessEnv): guess a number, told "higher" or "lower" each turn.

Scoring is shaped so that even a randomly initialised model finds some signal:

- replying exactly the target (``"7"``) scores 1.0 and ends the episode;
- any other reply holding a number scores up to 0.5: ``0.5 * closeness * tidiness``, where
  closeness is ``1 - |guess - target| / (high - low)`` for the first number in the reply and
  tidiness is the share of the reply that number takes (``"6"``: 1, ``"6 ok"``: 1/4);
- a reply without a number scores 0.

Each turn pays only what it adds to the episode's best score so far, so an episode's total
reward is its best reply's score, always in [0, 1].
"""

import random
import re

__all__ = ["GuessEnv"]


class GuessEnv:
    max_turns = 5

    def __init__(self, low: int = 1, high: int = 10, target: int | None = None):
        self.low, self.high, self.fixed_target = low, high, target

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.target = self.fixed_target if self.fixed_target is not None else rng.randint(self.low, self.high)
        self.best = 0.0
        return f"Guess a number between {self.low} and {self.high}.", {"target": self.target}

    def score(self, reply: str) -> tuple[float, int | None]:
        """The reply's score and the number it guesses (None when it holds no number)."""
        text = reply.strip()
        found = re.search(r"\d+", text)
        if found is None:
            return 0.0, None
        guess = int(found.group())
        if text == str(self.target):
            return 1.0, guess
        closeness = max(0.0, 1 - abs(guess - self.target) / max(1, self.high - self.low))
        return 0.5 * closeness * len(found.group()) / len(text), guess

    def step(self, action: str):
        score, guess = self.score(action)
        reward, self.best = max(0.0, score - self.best), max(self.best, score)
        if guess is None:
            return "Reply with a number only.", reward, False, False, {}
        if score == 1.0:
            return "Correct!", reward, True, False, {}
        if guess == self.target:
            return "Correct, but reply with the number only.", reward, False, False, {}
        return ("Too high!" if guess > self.target else "Too low!"), reward, False, False, {}
