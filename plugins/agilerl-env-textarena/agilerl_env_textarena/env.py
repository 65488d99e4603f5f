"""A TextArena game in agilerl's text protocol.

TextArena's API differs: ``reset(num_players, seed)`` returns None and the prompt comes from
``get_observation()``; ``step(action)`` returns ``(done, info)``; rewards arrive only from
``close()`` once the game is over. The adapter plays player 0 of a one-player game, turns each
batch of new game messages into the next observation, and reports the final reward on the
step that ends the game.
"""

from __future__ import annotations

from typing import Any

GAMES: dict[str, str] = {
    f"textarena/{name}": env_id
    for name, env_id in {
        "2048": "2048-v0",
        "bandit": "Bandit-v0",
        "blackjack": "Blackjack-v0",
        "countdown": "Countdown-v0",
        "crosswords": "Crosswords-v0",
        "cryptarithm": "Cryptarithm-v0",
        "fifteen-puzzle": "FifteenPuzzle-v0",
        "frozen-lake": "FrozenLake-v0",
        "guess-the-number": "GuessTheNumber-v0",
        "hangman": "Hangman-v0",
        "lights-out": "LightsOut-v0",
        "logic-puzzle": "LogicPuzzle-v0",
        "mastermind": "Mastermind-v0",
        "minesweeper": "Minesweeper-v0",
        "peg-jump": "PegJump-v0",
        "rush-hour": "RushHour-v0",
        "slitherlink": "Slitherlink-v0",
        "sokoban": "Sokoban-v0",
        "sudoku": "Sudoku-v0",
        "tower-of-hanoi": "TowerOfHanoi-v0",
        "wordle": "Wordle-v0",
    }.items()
}
"""Registered name (``textarena/sudoku``) -> TextArena env id (``Sudoku-v0``)."""

PLAYER = 0


class TextArenaEnv:
    """One single-player TextArena game, built with ``textarena.make(env_id, **kwargs)``."""

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        import textarena

        env = textarena.make(env_id, **kwargs)
        # Default wrappers re-send the whole history each turn; a chat wants only what is new.
        while hasattr(env, "env"):
            env = env.env
        self.env_id = env_id
        self._env = env
        self.max_turns: int | None = getattr(env, "max_turns", None)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self._env.reset(num_players=1, seed=seed)
        return self._new_messages(), {"env_id": self.env_id}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        done, info = self._env.step(action)
        observation = self._new_messages()
        if not done:
            return observation, 0.0, False, False, dict(info or {})
        rewards, game_info = self._env.close()
        outcome = (game_info or {}).get(PLAYER, {})
        reason = outcome.get("reason")
        if reason and reason not in observation:
            observation = f"{observation}\n{reason}".strip()
        reward = float((rewards or {}).get(PLAYER, 0.0))
        return observation, reward, True, False, {**(info or {}), **outcome}

    def _new_messages(self) -> str:
        """The game's messages since the last call, without the echo of our own action."""
        _, messages = self._env.get_observation()
        return "\n".join(text for sender, text, *_ in messages if sender != PLAYER).strip()
