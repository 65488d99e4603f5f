"""The built-in ``colors`` env: a square of one colour, and the question "which colour is this?".

The smallest env that needs the picture: the text is the same every episode, so only a model that
looks at the image can beat chance. Each colour is answered with its digit (one token in most
vocabularies, so even a tiny model can learn it): ``1`` red, ``2`` green, ``3`` blue, ``4``
yellow, and so on for ``num_colors`` colours. A reply whose first digit is the colour's scores 1
and ends the episode; a reply holding a digit, but the wrong one, scores ``format_reward`` (so a
randomly initialised model finds a signal before it finds the colour); anything else scores 0.
With turns left, a wrong reply is told to try again.

``noise`` (0-255) jitters every pixel, so no two pictures of one colour are the same bytes.
"""

from __future__ import annotations

import random
import re
from typing import Any

__all__ = ["ColorsEnv", "COLORS"]

COLORS: list[tuple[str, tuple[int, int, int]]] = [
    ("red", (220, 30, 30)),
    ("green", (30, 200, 40)),
    ("blue", (30, 60, 220)),
    ("yellow", (240, 220, 30)),
    ("purple", (140, 40, 180)),
    ("orange", (250, 140, 20)),
    ("white", (245, 245, 245)),
    ("black", (10, 10, 10)),
]


class ColorsEnv:
    """Which colour is the square? Reply with its digit."""

    max_reward = 1.0

    def __init__(
        self, num_colors: int = 4, size: int = 32, noise: int = 0, max_turns: int = 1, format_reward: float = 0.0
    ) -> None:
        if not 2 <= num_colors <= len(COLORS):
            raise ValueError(f"num_colors must be 2 to {len(COLORS)}, got {num_colors}")
        if not 1 <= size <= 2048 or not 0 <= noise <= 255:
            raise ValueError(f"size must be 1-2048 and noise 0-255, got size={size}, noise={noise}")
        self.num_colors, self.size, self.noise, self.max_turns = num_colors, size, noise, max_turns
        self.format_reward = format_reward
        self.answer = 1

    @property
    def question(self) -> str:
        choices = ", ".join(f"{i + 1} {name}" for i, (name, _) in enumerate(COLORS[: self.num_colors]))
        return f"Which colour is this square? Reply with its digit: {choices}."

    def picture(self, index: int, rng: random.Random) -> Any:
        """The square of colour ``index`` (an HxWx3 uint8 array)."""
        import numpy as np

        pixels = np.empty((self.size, self.size, 3), dtype=np.int16)
        pixels[:] = COLORS[index][1]
        if self.noise:
            generator = np.random.default_rng(rng.getrandbits(32))
            pixels += generator.integers(-self.noise, self.noise + 1, size=pixels.shape, dtype=np.int16)
        return pixels.clip(0, 255).astype(np.uint8)

    def reset(self, seed: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        rng = random.Random(seed)
        index = rng.randrange(self.num_colors)
        self.answer = index + 1
        return {"text": self.question, "image": self.picture(index, rng)}, {"answer": self.answer}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        found = re.search(r"\d", action)
        if found is not None and int(found.group()) == self.answer:
            return "Correct!", 1.0, True, False, {}
        return f"No. {self.question}", self.format_reward if found is not None else 0.0, False, False, {}
