"""Small verifiers v1 tasksets the plugin's tests play: single-turn, multi-turn with a task's
Toolset, and a taskset-wide Toolset. Imported in the verifiers venv only."""

from __future__ import annotations

import verifiers.v1 as vf
from vf_oracle import Oracle, OracleConfig


def _lcs(a: str, b: str) -> int:
    rows = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            rows[i + 1][j + 1] = rows[i][j] + 1 if x == y else max(rows[i][j + 1], rows[i + 1][j])
    return rows[-1][-1]


class ReverseData(vf.TaskData):
    answer: str


class ReverseTask(vf.Task[ReverseData]):
    @vf.reward
    async def lcs(self, task, trace) -> float:
        """The reply's longest common subsequence with the reversed text, as a share of it."""
        return _lcs(trace.last_reply.strip(), task.answer) / len(task.answer)


class Reverse(vf.Taskset[ReverseTask]):
    def load(self):
        for word in ("stressed", "drawer", "agilerl"):
            yield ReverseTask(ReverseData(prompt=f"Reverse: {word}", system_prompt="Reply with the text only.",
                                          answer=word[::-1]), self.config.task)


class GuessData(vf.TaskData):
    target: int


class GuessTask(vf.Task[GuessData]):
    @classmethod
    def toolsets(cls, config):
        return [Oracle(OracleConfig(target=7))]

    @vf.reward
    async def found(self, task, trace) -> float:
        """1 when the final answer names the target."""
        return float(trace.last_reply.strip() == str(task.target))

    @vf.metric
    async def checks(self, trace) -> float:
        return float(len(trace.tool_messages))


class Guess(vf.Taskset[GuessTask]):
    def load(self):
        yield GuessTask(GuessData(prompt="Find the secret number from 1 to 10 with the check tool, then answer it.",
                                  target=7), self.config.task)


class Adder(vf.Toolset):
    @vf.tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b


class SumData(vf.TaskData):
    answer: int


class SumTask(vf.Task[SumData]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        used_tool = any("5" in str(m.content) for m in trace.tool_messages)
        return float(trace.last_reply.strip() == str(task.answer)) * (1.0 if used_tool else 0.5)


class Sums(vf.Taskset[SumTask]):
    @classmethod
    def toolsets(cls, config):
        return [Adder(vf.ToolsetConfig())]

    def load(self):
        yield SumTask(SumData(prompt="What is 2 + 3? Use the add tool.", answer=5), self.config.task)
