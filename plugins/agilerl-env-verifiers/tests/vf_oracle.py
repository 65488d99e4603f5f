"""The Guess task's Toolset in a module of its own: verifiers serves a Toolset over MCP by
running its module as ``__main__`` (bridge mode); score-only mode registers it in process."""

from __future__ import annotations

import verifiers.v1 as vf


class OracleConfig(vf.ToolsetConfig):
    target: int = 0


class Oracle(vf.Toolset[OracleConfig]):
    @vf.tool
    async def check(self, n: int) -> str:
        """Say whether n is the secret number, or whether the secret is higher or lower."""
        target = self.config.target
        return "correct" if n == target else ("higher" if target > n else "lower")


if __name__ == "__main__":
    Oracle.run()
