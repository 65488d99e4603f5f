"""The docs' GuessEnv: guess a number, told "higher" or "lower" each turn."""

import random


class GuessEnv:
    max_turns = 5

    def __init__(self, low: int = 1, high: int = 10, target: int | None = None):
        self.low, self.high, self.fixed_target = low, high, target

    def reset(self, seed=None):
        rng = random.Random(seed)
        self.target = self.fixed_target if self.fixed_target is not None else rng.randint(self.low, self.high)
        return f"Guess a number between {self.low} and {self.high}.", {}

    def step(self, action):
        try:
            guess = int(action.strip())
        except ValueError:
            return "Reply with a number only.", 0.0, False, False, {}
        if guess == self.target:
            return "Correct!", 1.0, True, False, {}
        hint = "Too high!" if guess > self.target else "Too low!"
        return hint, 0.0, False, False, {}
