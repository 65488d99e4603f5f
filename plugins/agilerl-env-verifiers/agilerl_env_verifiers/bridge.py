"""Bridge mode: a verifiers v1 env runs its own ``Env.run`` (harness program, tools, scoring),
and each model request it makes is answered by our policy's next ``step(text)``.

A local OpenAI-compatible endpoint (``/v1/chat/completions`` on 127.0.0.1, one per process)
holds each request until ``step`` supplies the reply, streamed back as the harness expects.
``reset`` starts the episode and returns the conversation of its first request (messages and
tools, through reset's info); ``step`` replies and returns what the next request added (a tool's
result in the ``tool`` role) or, when the episode ends, its reward. An episode that reaches
``max_turns`` with a request still coming is cut there and scored on its trace so far with the
task's own ``Task.score()``. Every coroutine runs on agilerl's shared loop: one event loop per
process, as verifiers' class-wide asyncio locks require.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import uuid
from typing import Any

import verifiers.v1 as vf
from verifiers.v1.clients import ModelContext

from agilerl.concurrency import shared_loop
from agilerl.errors import EnvError, InvalidArgument
from agilerl.tools import ToolSet, resolve_tool_parser

_KEY_VAR = "AGILERL_VERIFIERS_BRIDGE_KEY"
_episodes = itertools.count()


class VerifiersBridgeEnv:
    """One verifiers env's tasks, each played by its own ``Env.run`` against our policy."""

    def __init__(self, taskset: str, env: str = "", env_settings: dict[str, Any] | None = None,
                 max_turns: int = 4, turn_timeout_s: float = 300.0) -> None:
        """``taskset``: an installed taskset id (a package exporting its ``Taskset``); ``env``: a
        verifiers env id (default: the taskset's own, else single-agent); ``env_settings``: the
        env config's fields (``agent`` defaults to the tool-less ``null`` harness in a subprocess)."""
        if ":" in taskset:
            raise InvalidArgument(
                f"bridge mode loads tasksets as verifiers does, by package id, got {taskset!r}: "
                "export the Taskset from a package's __all__ and name the package"
            )
        settings = {"agent": {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}, **(env_settings or {})}
        config = vf.resolve_env_config({**settings, "id": env, "taskset": {"id": taskset, **settings.get("taskset", {})}})
        self.env = vf.load_environment(config)
        self.tasks = list(self.env.taskset)
        self.dataset_size = len(self.tasks)
        self.max_turns = max_turns
        self.turn_timeout_s = turn_timeout_s
        self._episode: _BridgedEpisode | None = None

    def reset(self, seed: int | None = None, *, row_index: int | None = None, evaluation: bool | None = None):
        self.close_episode()
        task = self.tasks[row_index if row_index is not None else (seed or 0) % self.dataset_size]
        self._episode = _BridgedEpisode(self.env, task, self.turn_timeout_s)
        return shared_loop().run(self._episode.open())

    def step(self, action: str):
        if self._episode is None:
            raise EnvError("step() before reset()")
        return shared_loop().run(self._episode.turn(action, self.max_turns))

    def close_episode(self) -> None:
        if self._episode is not None:
            shared_loop().run(self._episode.cancel())
            self._episode = None

    def close(self) -> None:
        self.close_episode()


class _Endpoint:
    """The process's OpenAI-compatible endpoint: each request waits in its episode's queue."""

    instance: _Endpoint | None = None

    def __init__(self) -> None:
        self.queues: dict[str, asyncio.Queue[tuple[dict[str, Any], asyncio.Future[str]]]] = {}
        self.url = ""
        self.parser = resolve_tool_parser("hermes", None)  # the format our tiny and Qwen models write

    @classmethod
    async def get(cls) -> _Endpoint:
        if cls.instance is None:
            endpoint = cls()
            await endpoint._start()
            cls.instance = endpoint
        return cls.instance

    async def _start(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.url = f"http://127.0.0.1:{port}/v1"

    async def _chat(self, request: Any) -> Any:
        from aiohttp import web

        body = await request.json()
        queue = self.queues.get(body.get("model", ""))
        if queue is None:
            return web.json_response({"error": {"message": "no such episode"}}, status=404)
        reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        await queue.put((body, reply))
        text = await reply
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        base = {"id": "agilerl", "object": "chat.completion.chunk", "created": 0, "model": body["model"]}
        delta: dict[str, Any] = {"role": "assistant", "content": text}
        # the policy's tool calls, read by agilerl's parser of the model's format, as the OpenAI
        # wire carries them (the program runs them and answers in the tool role)
        parsed = self.parser.parse_text(text, ToolSet(body.get("tools") or []))
        calls = [c for c in parsed.calls if c.ok]
        call = bool(calls)
        if calls:
            delta["content"] = parsed.content
            delta["tool_calls"] = [
                {"index": i, "id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for i, c in enumerate(calls)
            ]
        for chunk in (
            {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls" if call else "stop"}]},
            {**base, "choices": [], "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}},
        ):
            await stream.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await stream.write(b"data: [DONE]\n\n")
        await stream.write_eof()
        return stream


class _BridgedEpisode:
    """One ``Env.run_episode`` in flight, and the request it is waiting on."""

    def __init__(self, env: Any, task: Any, timeout_s: float) -> None:
        self.env, self.task, self.timeout_s = env, task, timeout_s
        self.name = f"agilerl/{os.getpid()}/{next(_episodes)}"
        self.queue: asyncio.Queue[tuple[dict[str, Any], asyncio.Future[str]]] = asyncio.Queue()
        self.traces: list[Any] = []
        self.pending: tuple[dict[str, Any], asyncio.Future[str]] | None = None
        self.seen = 0  # messages of the conversation already shown to the policy
        self.turns = 0
        self.run: asyncio.Task[Any] | None = None
        self.serving: Any = None

    async def open(self) -> tuple[str, dict[str, Any]]:
        endpoint = await _Endpoint.get()
        endpoint.queues[self.name] = self.queue
        os.environ.setdefault(_KEY_VAR, "agilerl")
        ctx = ModelContext(model=self.name, client=vf.EvalClientConfig(base_url=endpoint.url, api_key_var=_KEY_VAR))
        self.serving = self.env.serving()
        await self.serving.__aenter__()
        self.run = asyncio.ensure_future(self.env.run_episode(self.task, ctx, on_trace=self.traces.append))
        request = await self._next()
        if request is None:
            raise EnvError(f"the verifiers episode ended before its first model request: {self._errors()}")
        messages = request["messages"]
        self.seen = len(messages)
        info: dict[str, Any] = {"messages": messages, "task_idx": self.task.data.idx}
        if request.get("tools"):
            info["tools"] = request["tools"]
        users = [m for m in messages if m.get("role") == "user"]
        return (str(users[-1].get("content", "")) if users else ""), info

    async def turn(self, action: str, max_turns: int) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.pending is None:
            raise EnvError("the episode has ended: reset() first")
        self.turns += 1
        self.pending[1].set_result(action)
        self.pending = None
        request = await self._next()
        if request is None:  # the env's run finished: its own reward
            episode = self.run.result()  # type: ignore[union-attr]
            rewards = [t.reward for t in episode.traces if t.agent.trainable]
            if episode.errors:
                raise EnvError(f"the verifiers episode failed: {self._errors()}")
            return "", float(sum(rewards)), True, False, {"rewards": _named(episode.traces)}
        added = request["messages"][self.seen + 1 :]  # after our own reply
        self.seen = len(request["messages"])
        role = "tool" if added and all(m.get("role") == "tool" for m in added) else "user"
        text = "\n".join(str(m.get("content", "")) for m in added)
        if self.turns >= max_turns:  # cut short: scored on the trace so far
            trace = self.traces[-1]
            await self.cancel()
            await self.task.score(trace)
            return text, float(trace.reward), False, True, {"observation_role": role, "rewards": _named([trace])}
        return text, 0.0, False, False, {"observation_role": role}

    async def _next(self) -> dict[str, Any] | None:
        """The next model request, or None when the episode's run ends first."""
        getter = asyncio.ensure_future(self.queue.get())
        done, _ = await asyncio.wait({getter, self.run}, timeout=self.timeout_s, return_when=asyncio.FIRST_COMPLETED)
        if getter in done:
            self.pending = getter.result()
            return self.pending[0]
        getter.cancel()
        if not done:
            raise EnvError(f"no model request nor end of episode within {self.timeout_s:g} s")
        await self._leave()
        return None

    async def cancel(self) -> None:
        if self.pending is not None and not self.pending[1].done():
            self.pending[1].cancel()
        if self.run is not None and not self.run.done():
            self.run.cancel()
            await asyncio.gather(self.run, return_exceptions=True)
        await self._leave()

    async def _leave(self) -> None:
        if _Endpoint.instance is not None:
            _Endpoint.instance.queues.pop(self.name, None)
        if self.serving is not None:
            serving, self.serving = self.serving, None
            await serving.__aexit__(None, None, None)

    def _errors(self) -> str:
        episode = self.run.result() if self.run is not None and self.run.done() and not self.run.cancelled() else None
        errors = [e.message for e in episode.errors] if episode else []
        errors += [e.message for t in self.traces for e in t.errors]
        return "; ".join(errors) or "no error recorded"


def _named(traces: list[Any]) -> dict[str, float | None]:
    return {name: (r.score if r is not None else None) for t in traces for name, r in t.rewards.items()}
