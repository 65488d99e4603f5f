"""The policy served as an OpenAI-compatible endpoint, on loopback, for agent programs.

``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``, non-streaming or streamed
(SSE). Each episode gets its own API key; a call is routed to its episode by that key, so any
other key (or one whose episode has ended) gets 401. Every call generates with the run's policy
and sampling settings; a request's ``max_tokens`` is honoured up to ``max_new_tokens`` and the
other sampling fields the run overrides are named once in a warning. Calls of all live
episodes wait in one queue in front of ``policy.generate``: one thread generates every call
waiting in one batch while the next ones queue (``_Batcher``); a ``VersionedPolicy`` stamps
each token with its weights' version. The episode's bookkeeping (``agilerl.agents.episodes``)
records the exact tokens of every call.

What the endpoint refuses: a body over ``max_request_bytes`` (413), more than
``max_concurrent_calls`` calls of one episode at once (429), ``n`` other than 1 and image parts
for a text model (400), and calls past the episode's call budget (400). A vision policy (a
processor) sees ``image_url`` parts (``data:`` URLs) through its processor.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import secrets
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agilerl.agents.episodes import CallPlan, Episode, normalize_messages
from agilerl.chat import ChatRenderer
from agilerl.concurrency import LoopThread
from agilerl.errors import AgileRLError, AgileRLWarning, InvalidArgument
from agilerl.generation.policy import Generation, Policy, SamplingParams
from agilerl.tools.calls import ToolSet

__all__ = ["AgentEndpoint", "ChatRequest", "CompletionRequest"]

log = logging.getLogger(__name__)

_OVERRIDDEN = ("temperature", "top_p", "top_k", "min_p", "stop", "seed", "presence_penalty",
               "frequency_penalty", "repetition_penalty", "logit_bias", "reasoning_effort")
"""Sampling fields a request may send that the run's own settings decide."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=1, description="One completion per call: a sample is one stream of tokens.")

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


class ChatRequest(_Request):
    """A ``/v1/chat/completions`` body (the fields the endpoint reads; the rest are ignored)."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None
    logprobs: bool = False


class CompletionRequest(_Request):
    """A ``/v1/completions`` body."""

    prompt: str | list[str]
    logprobs: int | None = None


@dataclass
class _Route:
    """Where an episode's calls go: its bookkeeping and the run's generator."""

    episode: Episode
    policy: Policy
    params: SamplingParams


class _Refused(Exception):
    def __init__(self, status: int, message: str, code: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.code = status, code


class AgentEndpoint:
    """The endpoint (see the module doc); ``base_url`` ends in ``/v1`` as OpenAI clients expect.

        endpoint = AgentEndpoint(tokenizer, model_name="tiny")
        episode = endpoint.open_episode("ep-1", policy, sampling)
        # a program calls endpoint.base_url with api_key=episode.key ...
        endpoint.close_episode(episode)
        endpoint.close()
    """

    def __init__(
        self,
        tokenizer: Any,
        *,
        model_name: str = "agilerl-policy",
        tool_parser: Any = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        max_request_bytes: int = 8 * 1024 * 1024,
        max_concurrent_calls: int = 8,
        batch_wait_s: float = 0.005,
        renderer: ChatRenderer | None = None,
    ) -> None:
        if max_request_bytes < 1024 or max_concurrent_calls < 1:
            raise InvalidArgument(
                f"max_request_bytes must be >= 1024 and max_concurrent_calls >= 1, got {max_request_bytes} "
                f"and {max_concurrent_calls}"
            )
        from agilerl.rollout.vision import VisionTurns
        from agilerl.tools import resolve_tool_parser

        self.vision = VisionTurns.of(tokenizer)
        """A vision policy's image turns (a processor given, or carried by the tokenizer); None: text."""
        tokenizer = tokenizer if self.vision is None else self.vision.tokenizer
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.renderer = renderer or ChatRenderer(tokenizer, chat_template_kwargs=chat_template_kwargs)
        self.tool_parser = None if tool_parser is None else resolve_tool_parser(tool_parser, tokenizer)
        self.max_request_bytes = max_request_bytes
        self.max_concurrent_calls = max_concurrent_calls
        self._routes: dict[str, _Route] = {}
        self.generation_error: BaseException | None = None
        """The first error the policy (or the bookkeeping) raised on a call: the run's to report,
        not the programs' (they got a 500)."""
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._batcher = _Batcher(self._idle_episodes, batch_wait_s)
        self._thread = LoopThread("agilerl-agent-endpoint")
        self._runner, port = self._thread.run(self._start())
        self.base_url = f"http://127.0.0.1:{port}/v1"

    # -- episodes ---------------------------------------------------------------------------------

    def open_episode(
        self, episode_id: str, policy: Policy, params: SamplingParams, *, max_calls: int | None = None
    ) -> Episode:
        """A new episode with its own key; its calls generate with ``policy`` and ``params``."""
        key = "agilerl-" + secrets.token_urlsafe(24)
        episode = Episode(episode_id, key, self.renderer, max_calls=max_calls, vision=self.vision)
        with self._lock:
            self._routes[key] = _Route(episode, policy, params)
        return episode

    def _idle_episodes(self) -> int:
        """Live episodes with no call waiting or generating (their programs are between calls)."""
        return sum(1 for route in tuple(self._routes.values()) if route.episode.in_flight == 0)

    def close_episode(self, episode: Episode) -> None:
        """Revoke the episode's key: its program's later calls get 401."""
        with self._lock:
            self._routes.pop(episode.key, None)

    def close(self) -> None:
        """Stop serving (idempotent)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            try:
                self._thread.run(runner.cleanup())
            finally:
                self._thread.stop()
                self._batcher.close()

    # -- the server -------------------------------------------------------------------------------

    async def _start(self) -> tuple[Any, int]:
        from aiohttp import web

        app = web.Application(client_max_size=self.max_request_bytes)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/completions", self._completions)
        runner = web.AppRunner(app, shutdown_timeout=1, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return runner, runner.addresses[0][1]

    def _route(self, request: Any) -> _Route:
        header = request.headers.get("Authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else ""
        route = self._routes.get(key)
        if route is None:
            raise _Refused(401, "invalid API key: each agent episode has its own key (OPENAI_API_KEY), "
                           "valid while its episode runs", "invalid_api_key")
        return route

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        try:
            self._route(request)
        except _Refused as exc:
            return _error(exc)
        return web.json_response({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "agilerl"}
        ]})

    async def _chat(self, request: Any) -> Any:
        return await self._serve(request, ChatRequest, self._plan_chat, self._chat_reply)

    async def _completions(self, request: Any) -> Any:
        return await self._serve(request, CompletionRequest, self._plan_text, self._text_reply)

    async def _serve(self, request: Any, model: type[_Request], plan_of: Callable[..., Any], reply_of: Callable[..., Any]) -> Any:
        """One call: authenticate, parse, plan the prompt, generate off the loop, record, answer."""
        from aiohttp import web

        try:
            route = self._route(request)
            try:
                body = model.model_validate(await request.json())
            except (ValidationError, ValueError) as exc:
                raise _Refused(400, f"invalid request body: {exc}") from None
            episode = route.episode
            if episode.in_flight >= self.max_concurrent_calls:
                raise _Refused(429, f"this episode already has {episode.in_flight} calls running "
                               f"(max_concurrent_calls {self.max_concurrent_calls})", "rate_limit_exceeded")
            try:
                episode.check_budget()
                plan = plan_of(route, body)
            except AgileRLError as exc:  # what the request asked for cannot be rendered or shown
                raise _Refused(400, str(exc)) from None
            self._warn_overrides(body, route.params)
        except _Refused as exc:
            return _error(exc)
        episode.in_flight += 1
        try:
            t0 = time.perf_counter()
            limit = min(body.token_limit or route.params.max_new_tokens, route.params.max_new_tokens)
            generation = await asyncio.wrap_future(self._batcher.submit(route, plan.prompt, limit))
            generation = episode.cut_at_placeholder(plan, generation)
            reply, payload = reply_of(body, plan, generation)
            episode.record(plan, generation, reply, time.perf_counter() - t0)
        except Exception as exc:  # the run's generator failed: the program sees a 500; the run is told
            self.generation_error = self.generation_error or exc
            log.warning("agent call of episode %s failed: %s", episode.id, exc, exc_info=True)
            return _error(_Refused(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error"))
        finally:
            episode.in_flight -= 1
        if body.stream:
            return await _stream(request, payload, chat=isinstance(body, ChatRequest),
                                 usage=bool((body.stream_options or {}).get("include_usage")))
        return web.json_response(payload)

    def _warn_overrides(self, body: _Request, params: SamplingParams) -> None:
        """Name, once each, the sampling fields a request sent that the run's settings decide."""
        extra = body.model_extra or {}
        given = [k for k in _OVERRIDDEN if extra.get(k) is not None and k not in self._warned
                 and not (k == "temperature" and extra[k] == params.temperature)
                 and not (k == "top_p" and extra[k] == params.top_p)]
        if given:
            self._warned.update(given)
            warnings.warn(
                f"agent programs sent {', '.join(given)}: the run's own sampling settings (temperature "
                f"{params.temperature}, top_p {params.top_p}, top_k {params.top_k}) decide what is trained on, so "
                "these request fields are ignored",
                AgileRLWarning,
                stacklevel=2,
            )

    # -- chat ------------------------------------------------------------------------------------

    def _plan_chat(self, route: _Route, body: ChatRequest) -> CallPlan:
        messages = normalize_messages(body.messages)
        calls_end = self.tool_parser.calls_end if self.tool_parser is not None else None
        return route.episode.plan_chat(messages, body.tools, calls_end)

    def _chat_reply(self, body: ChatRequest, plan: CallPlan, generation: Generation) -> tuple[dict[str, Any], dict[str, Any]]:
        ids = generation.token_ids
        tool_calls: list[dict[str, Any]] = []
        if self.tool_parser is not None and body.tools and body.tool_choice != "none":
            parsed = self.tool_parser.parse(ids, ToolSet(body.tools))
            content = parsed.content
            for call in parsed.calls:
                if call.name is None or call.status in ("malformed", "unclosed"):
                    continue
                tool_calls.append({
                    "id": call.id or f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": call.name, "arguments": json.dumps(call.arguments or {})},
                })
        else:
            content = self.renderer.decode(_without_stop(ids, self.renderer.end_of_turn_id))
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not tool_calls else None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = "tool_calls" if tool_calls else _finish(generation)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if body.logprobs:
            choice["logprobs"] = {"content": self._token_logprobs(generation)}
        payload = _envelope("chat.completion", self.model_name, choice, len(plan.prompt_ids), len(ids))
        return normalize_messages([message])[0], payload

    # -- completions -----------------------------------------------------------------------------

    def _plan_text(self, route: _Route, body: CompletionRequest) -> CallPlan:
        prompt = body.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidArgument("one prompt per call: a sample is one stream of tokens")
            prompt = prompt[0]
        return route.episode.plan_text(prompt)

    def _text_reply(self, body: CompletionRequest, plan: CallPlan, generation: Generation) -> tuple[str, dict[str, Any]]:
        ids = generation.token_ids
        text = self.renderer.decode(list(ids))
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": _finish(generation), "logprobs": None}
        if body.logprobs is not None:
            tokens = self._token_logprobs(generation)
            choice["logprobs"] = {
                "tokens": [t["token"] for t in tokens],
                "token_logprobs": [t["logprob"] for t in tokens],
                "top_logprobs": None,
                "text_offset": None,
            }
        payload = _envelope("text_completion", self.model_name, choice, len(plan.prompt_ids), len(ids))
        return text, payload

    def _token_logprobs(self, generation: Generation) -> list[dict[str, Any]]:
        """OpenAI's per-token log-probs (the sampled token's; no alternatives)."""
        logprobs = generation.logprobs or [0.0] * len(generation.token_ids)
        tokens = self.tokenizer.convert_ids_to_tokens(list(generation.token_ids))
        return [
            {"token": str(token), "logprob": float(lp), "bytes": None, "top_logprobs": []}
            for token, lp in zip(tokens, logprobs)
        ]


_Call = tuple[_Route, Sequence[int], int, "Future[Generation]"]
"""A call waiting for the batcher: its route, prompt, token limit and where its completion goes."""


class _Batcher:
    """The batching queue in front of ``policy.generate``: one thread takes every call waiting
    and generates them in one batch per policy and sampling settings, while the next calls queue
    up (as the collector batches the turns of its live episodes).

    Programs answer a finished batch at slightly different moments, so a batch started on the
    first call back would leave the rest waiting a whole generate call for the next one. A batch
    therefore waits for every live episode to have a call waiting, or ``wait_s`` after its first
    call, whichever comes first (one live episode: no wait)."""

    def __init__(self, idle_episodes: Callable[[], int], wait_s: float) -> None:
        self._idle_episodes = idle_episodes
        self._wait_s = wait_s
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name="agilerl-agent-batcher", daemon=True)
        self._thread.start()

    def submit(self, route: _Route, prompt: Sequence[int], limit: int) -> Future[Generation]:
        future: Future[Generation] = Future()
        self._queue.put((route, prompt, limit, future))
        return future

    def close(self) -> None:
        self._queue.put(None)

    def _work(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            calls = [first]
            deadline = time.monotonic() + self._wait_s
            while True:  # everything waiting joins this batch; live episodes about to call are waited for
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    left = deadline - time.monotonic()
                    if left <= 0 or self._idle_episodes() == 0:
                        break
                    try:
                        item = self._queue.get(timeout=min(left, 0.001))
                    except queue.Empty:
                        continue
                if item is None:
                    self._queue.put(None)  # stop after this batch
                    break
                calls.append(item)
            batches: dict[tuple[int, SamplingParams], list[_Call]] = {}
            for call in calls:
                batches.setdefault((id(call[0].policy), call[0].params), []).append(call)
            for batch in batches.values():
                self._generate(batch)

    @staticmethod
    def _generate(batch: list[_Call]) -> None:
        route = batch[0][0]
        try:
            generations = route.policy.generate([prompt for _, prompt, _, _ in batch], route.params)
            if len(generations) != len(batch):
                raise ValueError(f"{type(route.policy).__name__}.generate returned {len(generations)} completions for {len(batch)} prompts")
        except BaseException as exc:  # noqa: BLE001 - every call of the batch gets the error
            for *_, future in batch:
                future.set_exception(exc)
            return
        for (call_route, _, limit, future), generation in zip(batch, generations):
            future.set_result(_cut(call_route, generation, limit))


def _cut(route: _Route, generation: Generation, limit: int) -> Generation:
    """A completion generated with the run's sampling, cut to the request's ``max_tokens``: calls
    with other limits still share one batch (which generates with the run's params)."""
    if len(generation.token_ids) > limit:
        generation = replace(
            generation,
            token_ids=generation.token_ids[:limit],
            logprobs=None if generation.logprobs is None else generation.logprobs[:limit],
            finish_reason="length",
        )
    return generation


def _without_stop(ids: list[int], stop: int | None) -> list[int]:
    return ids[:-1] if ids and ids[-1] == stop else ids


def _finish(generation: Generation) -> str:
    return "stop" if generation.finish_reason == "stop" else "length"


def _envelope(kind: str, model: str, choice: dict[str, Any], prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def _error(exc: _Refused) -> Any:
    from aiohttp import web

    kind = "authentication_error" if exc.status == 401 else "invalid_request_error" if exc.status < 500 else "server_error"
    return web.json_response(
        {"error": {"message": str(exc), "type": kind, "param": None, "code": exc.code}}, status=exc.status
    )


async def _stream(request: Any, payload: dict[str, Any], *, chat: bool, usage: bool) -> Any:
    """The finished call as server-sent events: the whole reply in one delta, then its finish."""
    from aiohttp import web

    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    choice = payload["choices"][0]
    head = {k: payload[k] for k in ("id", "created", "model")}
    kind = "chat.completion.chunk" if chat else "text_completion"
    chunks = []
    if chat:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        chunks.append({"index": 0, "delta": delta, "logprobs": choice["logprobs"], "finish_reason": None})
        chunks.append({"index": 0, "delta": {}, "logprobs": None, "finish_reason": choice["finish_reason"]})
    else:
        chunks.append({"index": 0, "text": choice["text"], "logprobs": choice["logprobs"], "finish_reason": None})
        chunks.append({"index": 0, "text": "", "logprobs": None, "finish_reason": choice["finish_reason"]})
    events = [{**head, "object": kind, "choices": [c]} for c in chunks]
    if usage:
        events.append({**head, "object": kind, "choices": [], "usage": payload["usage"]})
    for event in events:
        await response.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response
