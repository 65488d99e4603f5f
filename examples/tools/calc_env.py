"""An OpenEnv MCP env with three tools, for the tool-calling example (README in manifest.yaml).

The task is fixed: what is 2 + 3? ``add`` and ``multiply`` answer and pay a little (a
well-formed call), ``submit`` ends the episode and pays 1.0 for 5 (0.3 for another number).
Serve it from a Python environment with openenv-core (``pip install agilerl-envlayer[openenv]``):

    agilerl serve examples/tools/calc_env.py:CalcToolsEnv --port 8123
"""

from __future__ import annotations

from typing import Any

from fastmcp import FastMCP
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.types import Observation, State

PROMPT = "What is 2 + 3? Use the tools, then submit the answer."
TARGET = 5


class TaskObservation(Observation):
    """The reset's observation: the task as text."""

    prompt: str = ""


class CalcToolsEnv(MCPEnvironment):
    """add, multiply and submit as MCP tools; the reward comes with each call's observation."""

    SUPPORTS_CONCURRENT_SESSIONS = True  # each session has its own env and its own MCP server

    def __init__(self) -> None:
        mcp = FastMCP("calc")
        env = self

        @mcp.tool
        def add(a: int, b: int) -> int:
            """Add two integers."""
            return a + b

        @mcp.tool
        def multiply(a: int, b: int) -> int:
            """Multiply two integers."""
            return a * b

        @mcp.tool
        def submit(answer: int) -> str:
            """Submit the final answer; the episode ends."""
            env.submitted = answer
            return "correct" if answer == TARGET else "wrong"

        super().__init__(mcp)
        self.submitted: int | None = None
        self._state = State(step_count=0)

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> TaskObservation:
        self.submitted = None
        self._state = State(step_count=0)
        return TaskObservation(done=False, prompt=PROMPT)

    def step(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._scored(action, super().step(action, timeout_s=timeout_s, **kwargs))

    async def step_async(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return self._scored(action, await super().step_async(action, timeout_s=timeout_s, **kwargs))

    def _scored(self, action: Any, observation: Observation) -> Observation:
        """A call's reward: 1.0 for submitting 5, 0.3 for another number, 0.1 for add/multiply."""
        name = getattr(action, "tool_name", None)
        if name is None or getattr(observation, "error", None) is not None:
            return observation
        self._state.step_count += 1
        if name == "submit":
            observation.reward = 1.0 if self.submitted == TARGET else 0.3
            observation.done = True
        else:
            observation.reward = 0.1
        return observation

    def _step_impl(self, action: Any, timeout_s: float | None = None, **kwargs: Any) -> Observation:
        return Observation(done=False, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
