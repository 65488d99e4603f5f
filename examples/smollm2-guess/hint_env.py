"""Guess a random number from "too high" / "too low" hints: the model must use the feedback.

The target is drawn per episode (1..15 by default), so no fixed answer can be memorised; with 4
guesses a binary search always wins, a random guesser rarely. Rewards per turn:

- 1.0 for the target (the first number in the reply), which ends the episode;
- 0.1 for a guess inside the range the hints so far leave open (it used the feedback);
- 0 otherwise (no number, out of range, or contradicting a hint).
"""

import random
import re


class HintGuessEnv:
    max_turns = 4

    def __init__(self, low: int = 1, high: int = 15):
        self.low, self.high = low, high

    def reset(self, seed=None):
        self.target = random.Random(seed).randint(self.low, self.high)
        self.open_low, self.open_high = self.low, self.high  # what the hints still allow
        return (
            f"I picked a whole number between {self.low} and {self.high}. Guess it. After each "
            "guess I say 'too high' or 'too low'. Reply with the number only.",
            {"target": self.target},
        )

    def step(self, action: str):
        found = re.search(r"\d+", action)
        if found is None:
            return "Reply with a number only.", 0.0, False, False, {}
        guess = int(found.group())
        if guess == self.target:
            return "Correct!", 1.0, True, False, {"solved": 1.0}
        reward = 0.1 if self.open_low <= guess <= self.open_high else 0.0
        if guess > self.target:
            self.open_high = min(self.open_high, guess - 1)
            return f"{guess} is too high. Guess again.", reward, False, False, {}
        self.open_low = max(self.open_low, guess + 1)
        return f"{guess} is too low. Guess again.", reward, False, False, {}
