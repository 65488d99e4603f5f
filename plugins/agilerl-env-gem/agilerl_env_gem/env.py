"""A GEM env in agilerl's text protocol.

GEM already speaks it (``reset(seed) -> (text, info)``, ``step(text) -> 5-tuple``); the adapter
adds GEM's per-turn instruction (``info["suffix"]``, e.g. "Enter your next guess.") to each
observation, as GEM's own observation wrappers do, and exposes ``max_turns``.
"""

from __future__ import annotations

from typing import Any

_DIFFICULTIES = ("easy", "hard", "random")
_GAMES = {  # our name -> GEM's game id prefix
    "guess-the-number": "GuessTheNumber",
    "mastermind": "Mastermind",
    "minesweeper": "Minesweeper",
    "wordle": "Wordle",
    "fifteen-puzzle": "FifteenPuzzle",
    "hangman": "Hangman",
    "sudoku": "Sudoku",
    "tower-of-hanoi": "TowerofHanoi",
    "game-2048": "Game2048",
    "sokoban": "Sokoban",
    "crosswords": "Crosswords",
    "word-search": "WordSearch",
}
GAMES: dict[str, str] = {
    f"gem/{name}-{difficulty}": f"game:{game}-v0-{difficulty}"
    for name, game in _GAMES.items()
    for difficulty in _DIFFICULTIES
}
"""Registered name (``gem/wordle-easy``) -> GEM env id (``game:Wordle-v0-easy``)."""


class GemEnv:
    """One GEM env, built with ``gem.make(env_id, **kwargs)``."""

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        import gem

        self.env_id = env_id
        self._env = gem.make(env_id, **kwargs)
        self.max_turns: int | None = getattr(self._env, "max_turns", None)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        return self._env.reset(seed=seed)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        observation, reward, terminated, truncated, info = self._env.step(action)
        suffix = info.get("suffix") if isinstance(info, dict) else None
        if suffix and not (terminated or truncated):
            observation = f"{observation}\n{suffix}"
        return observation, float(reward), bool(terminated), bool(truncated), info

    def close(self) -> None:
        close = getattr(self._env, "close", None)
        if callable(close):
            close()
