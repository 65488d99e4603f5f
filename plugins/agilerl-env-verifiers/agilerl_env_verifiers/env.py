"""A verifiers v1 ``Taskset`` as an agilerl text env, scored by its tasks' own ``Task.score()``.

``verifiers_env`` (the registered ``verifiers`` name) picks the mode: ``score`` (here) or
``bridge`` (``bridge.py``: the env's own ``Env.run`` against our policy).

Score-only: our policy's turns are committed to a verifiers ``Trace`` message by message and,
when the episode ends, the task's ``@vf.reward``/``@vf.metric`` functions score that trace. No
harness program and no model endpoint run, so this fits single-agent tasksets whose rewards read
the trace (the common case). Tools: the task's and taskset's ``vf.Toolset`` servers are
registered in process into MCP servers; the model sees their schemas (reset's ``info["tools"]``).
Tool calls reach the env already parsed, in the model's own format, by agilerl's tool parser
(``environment.tool_parser: hermes``, or ``auto``): each runs through ``call_tool(name,
arguments)`` and its result comes back in the ``tool`` role. A reply without a call reaches
``step``: it is the answer, and the episode ends and is scored. An episode that reaches
``max_turns`` first is scored too, on the trace so far (``truncated``).

verifiers keeps class-wide asyncio locks (``SubprocessRuntime``), so every env in a process
runs its coroutines on one event loop: agilerl's shared loop thread.
"""

from __future__ import annotations

import importlib
import json
import uuid
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.graph import MessageNode
from verifiers.v1.trace import AgentInfo, Trace, TraceTask

from agilerl.concurrency import shared_loop
from agilerl.errors import EnvError, InvalidArgument


class VerifiersEnv:
    """One verifiers taskset's tasks, one per reset (``row_index``, else ``seed`` modulo)."""

    def __init__(self, taskset: str, taskset_config: dict[str, Any] | None = None, max_turns: int = 4) -> None:
        """``taskset``: ``module:attr`` of a ``vf.Taskset`` subclass (or of a function returning
        a taskset), or an installed taskset's id; ``taskset_config`` its config's fields."""
        self.taskset = _load_taskset(taskset, taskset_config or {})
        if not self.taskset.bounded:
            raise InvalidArgument(f"taskset {taskset!r} is infinite: bound it (take/include) in the function you name")
        self.tasks = list(self.taskset)
        if not self.tasks:
            raise InvalidArgument(f"taskset {taskset!r} yielded no tasks")
        self.dataset_size = len(self.tasks)
        self.max_turns = max_turns
        self._shared_toolsets = list(type(self.taskset).toolsets(self.taskset.config))
        self._episode: _Episode | None = None

    def reset(self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None):
        task = self.tasks[row_index if row_index is not None else (seed or 0) % self.dataset_size]
        self._episode = _Episode(task, self._shared_toolsets)
        return shared_loop().run(self._episode.open())

    def step(self, action: str):
        """The answer (a reply without a tool call): the episode ends and is scored."""
        if self._episode is None:
            raise EnvError("step() before reset()")
        return shared_loop().run(self._episode.answer(action))

    def call_tool(self, name: str, arguments: dict[str, Any]):
        """One parsed tool call, run on the task's MCP server; its result in the ``tool`` role."""
        if self._episode is None:
            raise EnvError("call_tool() before reset()")
        return shared_loop().run(self._episode.call(name, arguments, self.max_turns))


class _Episode:
    """One task's conversation as a verifiers ``Trace``, and its tools' MCP servers."""

    def __init__(self, task: vf.Task, shared_toolsets: list[Any]) -> None:
        self.task = task
        self.toolsets = [*shared_toolsets, *type(task).toolsets(task.config)]
        self.trace = Trace(
            task=TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
            agent=AgentInfo(config=vf.AgentConfig(), name="agilerl", trainable=True),
        )
        self.tools: dict[str, tuple[Any, str]] = {}  # advertised name: (MCP server, its tool)
        self.turns = 0
        self.scored = False

    async def open(self) -> tuple[str, dict[str, Any]]:
        from mcp.server.mcpserver import MCPServer

        schemas = []
        for toolset in self.toolsets:
            server = MCPServer(type(toolset).__name__)
            toolset.register(server)
            await toolset.setup()
            await toolset.setup_task(self.task)
            for tool in await server.list_tools():
                # advertised as verifiers does: prefixed with the server's name (TOOL_PREFIX)
                name = f"{toolset.server_name}_{tool.name}" if toolset.server_name else tool.name
                self.tools[name] = (server, tool.name)
                schemas.append({"type": "function", "function": {
                    "name": name, "description": tool.description or "", "parameters": tool.input_schema,
                }})
        data = self.task.data
        messages: list[dict[str, Any]] = []
        if data.system_prompt:
            messages.append({"role": "system", "content": data.system_prompt})
        if isinstance(data.prompt, str) or data.prompt is None:
            messages.append({"role": "user", "content": data.prompt or ""})
        else:
            messages += [m.model_dump(exclude_none=True) for m in data.prompt]
        for message in messages:
            self._commit(vf.SystemMessage(**message) if message["role"] == "system" else vf.UserMessage(**message))
        info: dict[str, Any] = {"task_idx": data.idx, "task_key": self.task.key}
        if data.system_prompt:
            info["system_prompt"] = data.system_prompt
        if schemas:
            info["tools"] = schemas
        if not isinstance(data.prompt, str) and data.prompt is not None:
            info["messages"] = messages  # the task's own conversation, as it gave it
        return data.prompt_text, info

    async def answer(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.scored:
            raise EnvError("the episode has ended: reset() first")
        self.turns += 1
        self._commit(vf.AssistantMessage(content=action), sampled=True)
        return "", await self._score(), True, False, {"rewards": self._rewards()}

    async def call(self, name: str, arguments: dict[str, Any], max_turns: int) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.scored:
            raise EnvError("the episode has ended: reset() first")
        if name not in self.tools:  # the harness checks names first; a direct caller may not
            return f"Error: unknown tool {name!r}", 0.0, False, False, {}
        self.turns += 1
        call_id = f"call_{uuid.uuid4().hex[:12]}"
        self._commit(vf.AssistantMessage(content="", tool_calls=[
            vf.ToolCall(id=call_id, name=name, arguments=json.dumps(arguments))
        ]), sampled=True)
        server, tool_name = self.tools[name]
        result = await server.call_tool(tool_name, arguments)
        text = "\n".join(getattr(part, "text", "") for part in result.content)
        self._commit(vf.ToolMessage(tool_call_id=call_id, name=name, content=text))
        if self.turns >= max_turns:  # cut short here: still scored, on the trace so far
            return text, await self._score(), False, True, {"rewards": self._rewards()}
        return text, 0.0, False, False, {}

    async def _score(self) -> float:
        self.scored = True
        self.trace.is_completed = True
        await self.task.score(self.trace)
        return float(self.trace.reward)

    def _rewards(self) -> dict[str, float | None]:
        return {name: (r.score if r is not None else None) for name, r in self.trace.rewards.items()}

    def _commit(self, message: Any, sampled: bool = False) -> None:
        parent = len(self.trace.nodes) - 1 if self.trace.nodes else None
        self.trace.nodes.append(MessageNode(parent=parent, message=message, sampled=sampled))


def _load_taskset(source: str, fields: dict[str, Any]) -> vf.Taskset:
    """The taskset ``source`` names, built with its own config type from ``fields``."""
    from verifiers.v1.configs.taskset import TasksetConfig
    from verifiers.v1.utils.generic import concrete_type

    if ":" not in source:
        config_type = vf.taskset_config_type(source)
        return vf.load_taskset(config_type(id=source, **fields))
    module_name, _, attr = source.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidArgument(f"taskset {source!r} cannot be imported: {exc}") from None
    if isinstance(target, type) and issubclass(target, vf.Taskset):
        config_type = concrete_type(target, TasksetConfig, origin=vf.Taskset) or TasksetConfig
        return target(config_type(**{"id": source, **fields}))
    taskset = target(**fields)
    if not isinstance(taskset, vf.Taskset):
        raise InvalidArgument(f"taskset {source!r} returned {type(taskset).__name__}, not a verifiers Taskset")
    return taskset


def verifiers_env(taskset: str, *, mode: str = "score", **options: Any) -> Any:
    """The registered ``verifiers`` env: ``mode`` ``"score"`` (``VerifiersEnv``, the default) or
    ``"bridge"`` (``VerifiersBridgeEnv``: the env's own ``Env.run`` against our policy)."""
    if mode == "score":
        return VerifiersEnv(taskset, **options)
    if mode == "bridge":
        from agilerl_env_verifiers.bridge import VerifiersBridgeEnv

        return VerifiersBridgeEnv(taskset, **options)
    raise InvalidArgument(f"env_config.mode must be 'score' or 'bridge', got {mode!r}")
