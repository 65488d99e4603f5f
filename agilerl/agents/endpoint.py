"""The policy served as an OpenAI-compatible endpoint, on loopback, for agent programs.

``/v1/chat/completions``, ``/v1/completions`` and ``/v1/models``, non-streaming or streamed
(SSE). Each episode gets its own API key; a call is routed to its episode by that key, so any
other key (or one whose episode has ended) gets 401. Every call generates with the run's policy
and sampling settings; a request's ``max_tokens`` is honoured up to ``max_new_tokens`` and the
other sampling fields the run overrides are named once in a warning. Each connection is served
on a thread of its own (``agilerl.agents.http_server``). Calls of all live episodes that wait
meanwhile are generated in one batch, by the first waiting call's own thread (``_Batcher``); a
``VersionedPolicy`` stamps each token with its weights' version. The episode's bookkeeping
(``agilerl.agents.episodes``) records the exact tokens of every call.

What the endpoint refuses: a body over ``max_request_bytes`` (413), more than
``max_concurrent_calls`` calls of one episode at once (429), ``n`` other than 1 and image parts
for a text model (400), and calls past the episode's call budget (400). A vision policy (a
processor) sees ``image_url`` parts (``data:`` URLs) through its processor.
"""

from __future__ import annotations

import itertools
import json
import logging
import secrets
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agilerl.agents.episodes import CallPlan, Episode, normalize_messages
from agilerl.agents.http_server import HTTPServer, Request, Response
from agilerl.chat import ChatRenderer
from agilerl.errors import AgileRLError, AgileRLWarning, InvalidArgument
from agilerl.generation.policy import Generation, Policy, SamplingParams
from agilerl.tools.calls import ToolSet

__all__ = ["AgentEndpoint", "ChatRequest", "CompletionRequest"]

log = logging.getLogger(__name__)

_OVERRIDDEN = ("temperature", "top_p", "top_k", "min_p", "stop", "seed", "presence_penalty",
               "frequency_penalty", "repetition_penalty", "logit_bias", "reasoning_effort", "response_format")
"""Fields a request may send that shape what is sampled, which the run's own settings decide
(``response_format``: no constrained decoding, the policy samples freely)."""

_UNREADABLE = ("invalid_json", "unclosed", "missing_name")
"""Call statuses with no name or arguments to hand a program: the completion is answered as text
(a call to an unknown tool, or one that breaks its schema, is the program's to answer)."""


class _Request(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    n: int = Field(1, ge=1, le=1, description="One completion per call: a sample is one stream of tokens.")
    return_token_ids: bool = False
    """vLLM's field: the answer also carries the prompt's and the completion's token ids, exactly
    the ids the run trains on (a program that keeps tokens sends them back as a completions prompt)."""

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
    """A ``/v1/completions`` body: the prompt as text, or as token ids (as vLLM takes them)."""

    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = None


@dataclass
class _Route:
    """Where an episode's calls go: its bookkeeping and the run's generator."""

    episode: Episode
    policy: Policy
    params: SamplingParams


_ROUTES = {
    "/v1/models": ("GET", "_models"),
    "/v1/chat/completions": ("POST", "_chat"),
    "/v1/completions": ("POST", "_completions"),
}


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
        self._vocab = len(tokenizer)
        self._toolsets: dict[str, ToolSet] = {}
        self._routes: dict[str, _Route] = {}
        self.generation_error: BaseException | None = None
        """The first error the policy (or the bookkeeping) raised on a call: the run's to report,
        not the programs' (they got a 500)."""
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._ids = itertools.count()
        self._id_prefix = secrets.token_hex(6)  # ids unique across endpoints, counted within one
        self._batcher = _Batcher(self._idle_episodes, batch_wait_s)
        self._server = HTTPServer(self._handle, name="agilerl-agent-endpoint", max_body_bytes=max_request_bytes)
        self.base_url = f"http://127.0.0.1:{self._server.port}/v1"

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

    def _new_id(self, kind: str) -> str:
        return f"{kind}{self._id_prefix}{next(self._ids):08x}"

    def _idle_episodes(self) -> int:
        """Live episodes with no call waiting or generating (their programs are between calls)."""
        return sum(1 for route in tuple(self._routes.values()) if route.episode.in_flight == 0)

    def close_episode(self, episode: Episode) -> None:
        """Revoke the episode's key: its program's later calls get 401."""
        with self._lock:
            self._routes.pop(episode.key, None)

    def close(self) -> None:
        """Stop serving (idempotent)."""
        self._server.close()

    # -- the server -------------------------------------------------------------------------------

    def _handle(self, request: Request) -> Response:
        """Route one request (on its connection's thread, see ``agilerl.agents.http_server``)."""
        route = _ROUTES.get(request.path)
        if route is None:
            return _error(_Refused(404, f"no route {request.path!r}: the endpoint serves /v1/chat/completions, "
                                   "/v1/completions and /v1/models", "not_found"))
        method, name = route
        if request.method != method:
            response = _error(_Refused(405, f"{request.path} takes {method}, not {request.method}", "method_not_allowed"))
            response.headers["Allow"] = method
            return response
        return getattr(self, name)(request)

    def _route(self, request: Request) -> _Route:
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else ""
        route = self._routes.get(key)
        if route is None:
            raise _Refused(401, "invalid API key: each agent episode has its own key (OPENAI_API_KEY), "
                           "valid while its episode runs", "invalid_api_key")
        return route

    def _models(self, request: Request) -> Response:
        try:
            self._route(request)
        except _Refused as exc:
            return _error(exc)
        return Response.json({"object": "list", "data": [
            {"id": self.model_name, "object": "model", "created": 0, "owned_by": "agilerl"}
        ]})

    def _chat(self, request: Request) -> Response:
        return self._serve(request, ChatRequest, self._plan_chat, self._chat_reply)

    def _completions(self, request: Request) -> Response:
        return self._serve(request, CompletionRequest, self._plan_text, self._text_reply)

    def _serve(self, request: Request, model: type[_Request], plan_of: Callable[..., Any], reply_of: Callable[..., Any]) -> Response:
        """One call: authenticate, parse, plan the prompt, generate, record, answer. The
        bookkeeping (planning, recording, the reply) holds the endpoint's lock; generating does not."""
        try:
            route = self._route(request)
            try:
                body = model.model_validate_json(request.body)
            except ValidationError as exc:
                raise _Refused(400, f"invalid request body: {exc}") from None
            episode = route.episode
            with self._lock:
                if episode.in_flight >= self.max_concurrent_calls:
                    raise _Refused(429, f"this episode already has {episode.in_flight} calls running "
                                   f"(max_concurrent_calls {self.max_concurrent_calls})", "rate_limit_exceeded")
                try:
                    episode.check_budget()
                    plan = plan_of(route, body)
                    if not plan.prompt_ids:
                        raise InvalidArgument("the prompt is empty: there is nothing to generate from")
                except AgileRLError as exc:  # what the request asked for cannot be rendered or shown
                    raise _Refused(400, str(exc)) from None
                self._warn_overrides(body, route.params)
                episode.in_flight += 1
        except _Refused as exc:
            return _error(exc)
        try:
            t0 = time.perf_counter()
            limit = min(body.token_limit or route.params.max_new_tokens, route.params.max_new_tokens)
            generation = self._batcher.generate(route, plan.prompt, limit)
            with self._lock:
                generation = episode.cut_at_placeholder(plan, generation)
                reply, payload = reply_of(body, plan, generation)
                episode.record(plan, generation, reply, time.perf_counter() - t0)
        except Exception as exc:  # the run's generator failed: the program sees a 500; the run is told
            self.generation_error = self.generation_error or exc
            log.warning("agent call of episode %s failed: %s", episode.id, exc, exc_info=True)
            return _error(_Refused(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error"))
        finally:
            with self._lock:
                episode.in_flight -= 1
        if body.stream:
            return _stream(payload, chat=isinstance(body, ChatRequest),
                           usage=bool((body.stream_options or {}).get("include_usage")))
        return Response.json(payload)

    def _warn_overrides(self, body: _Request, params: SamplingParams) -> None:
        """Name, once each, the sampling fields a request sent that the run's settings decide."""
        extra = body.model_extra
        if not extra:
            return
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
        self._toolset(body.tools)  # checked before anything renders or generates
        calls_end = self.tool_parser.calls_end if self.tool_parser is not None else None
        return route.episode.plan_chat(body.messages, body.tools, calls_end)

    def _toolset(self, tools: list[dict[str, Any]] | None, key: str | None = None) -> ToolSet:
        """A request's tools, checked: a malformed one is the request's 400 at planning, never an
        error after generating (which would stop the run). Memoised by their JSON (``key``, as
        the plan keeps it): a program sends the same tools on every call (under the endpoint's lock)."""
        if key is None:
            key = json.dumps(tools, sort_keys=True) if tools else ""
        toolset = self._toolsets.get(key)
        if toolset is None:
            try:
                toolset = ToolSet(tools)
            except AgileRLError as exc:
                raise InvalidArgument(f"invalid tools: {exc}") from None
            if len(self._toolsets) >= 64:
                self._toolsets.clear()
            self._toolsets[key] = toolset
        return toolset

    def _chat_reply(self, body: ChatRequest, plan: CallPlan, generation: Generation) -> tuple[dict[str, Any], dict[str, Any]]:
        ids = generation.token_ids
        tool_calls: list[dict[str, Any]] = []
        parsed = None
        if self.tool_parser is not None and body.tools and body.tool_choice != "none":
            parsed = self.tool_parser.parse(ids, self._toolset(body.tools, plan.tools))
        if parsed is not None and all(call.name is not None and call.status not in _UNREADABLE for call in parsed.calls):
            content = parsed.content
            tool_calls = [
                {"id": call.id or self._new_id("call_"), "type": "function",
                 "function": {"name": call.name, "arguments": json.dumps(call.arguments or {})}}
                for call in parsed.calls
            ]
        else:  # no tools; or a call that cannot be read: the text as written, as vLLM answers it
            content = self.renderer.decode(_without_stop(ids, self.renderer.end_of_turn_id))
        message: dict[str, Any] = {"role": "assistant", "content": content if content or not tool_calls else None}
        if tool_calls:
            message["tool_calls"] = tool_calls
        finish = "tool_calls" if tool_calls else _finish(generation)
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if body.logprobs:
            choice["logprobs"] = {"content": self._token_logprobs(generation)}
        if body.return_token_ids:
            choice["token_ids"] = list(ids)
        payload = _envelope(self._new_id("chatcmpl-"), "chat.completion", self.model_name, choice,
                            len(plan.prompt_ids), len(ids))
        if body.return_token_ids:
            payload["prompt_token_ids"] = list(plan.prompt_ids)
        return normalize_messages([message])[0], payload

    # -- completions -----------------------------------------------------------------------------

    def _plan_text(self, route: _Route, body: CompletionRequest) -> CallPlan:
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
            if len(prompt) != 1:
                raise InvalidArgument("one prompt per call: a sample is one stream of tokens")
            prompt = prompt[0]
        if isinstance(prompt, str):
            return route.episode.plan_text(prompt)
        if self.vision is not None:
            raise InvalidArgument("a prompt of token ids cannot show images: send a vision policy text or chat messages")
        bad = next((t for t in prompt if not 0 <= t < self._vocab), None)
        if bad is not None:
            raise InvalidArgument(f"prompt token id {bad} is not in the tokenizer's vocabulary (ids 0 to {self._vocab - 1})")
        return route.episode.plan_tokens(prompt)

    def _text_reply(
        self, body: CompletionRequest, plan: CallPlan, generation: Generation
    ) -> tuple[str | tuple[int, ...], dict[str, Any]]:
        ids = generation.token_ids
        text = self.renderer.decode(list(ids))
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": _finish(generation), "logprobs": None}
        if body.return_token_ids:
            choice["prompt_token_ids"], choice["token_ids"] = list(plan.prompt_ids), list(ids)
        if body.logprobs is not None:
            tokens = self._token_logprobs(generation)
            choice["logprobs"] = {
                "tokens": [t["token"] for t in tokens],
                "token_logprobs": [t["logprob"] for t in tokens],
                "top_logprobs": None,
                "text_offset": None,
            }
        payload = _envelope(self._new_id("cmpl-"), "text_completion", self.model_name, choice,
                            len(plan.prompt_ids), len(ids))
        return (tuple(ids) if isinstance(plan.history, tuple) else text), payload  # what the next prompt extends

    def _token_logprobs(self, generation: Generation) -> list[dict[str, Any]]:
        """OpenAI's per-token log-probs (the sampled token's; no alternatives)."""
        logprobs = generation.logprobs or [0.0] * len(generation.token_ids)
        tokens = self.tokenizer.convert_ids_to_tokens(list(generation.token_ids))
        return [
            {"token": str(token), "logprob": float(lp), "bytes": None, "top_logprobs": []}
            for token, lp in zip(tokens, logprobs)
        ]


@dataclass(eq=False)
class _Call:
    """A call waiting for its batch: its route, prompt and token limit; then its outcome."""

    route: _Route
    prompt: Sequence[int]
    limit: int
    generation: Generation | None = None
    error: BaseException | None = None
    done: bool = False

    def outcome(self) -> Generation:
        if self.error is not None:
            raise self.error
        assert self.generation is not None
        return self.generation


class _Batcher:
    """The batching in front of ``policy.generate``: calls of all live episodes that wait meanwhile
    are generated in one batch per policy and sampling settings, one batch at a time (as the
    collector batches the turns of its live episodes). The first waiting call's own thread
    generates the batch (no hand-off to a generating thread and back); the others wait for it.

    Programs answer a finished batch at slightly different moments (and their answers go out one
    by one), so a batch started on the first call back would leave the rest waiting a whole
    generate call for the next one, and the two halves would then alternate for good. A batch
    therefore waits for every live episode to have a call waiting, or until no call came for
    ``wait_s`` (at most ``4 * wait_s`` in all), whichever comes first (one live episode: no wait)."""

    def __init__(self, idle_episodes: Callable[[], int], wait_s: float) -> None:
        self._idle_episodes = idle_episodes
        self._wait_s = wait_s
        self._cond = threading.Condition()
        self._waiting: list[_Call] = []
        self._busy = False  # a thread is gathering or generating a batch

    def generate(self, route: _Route, prompt: Sequence[int], limit: int) -> Generation:
        call = _Call(route, prompt, limit)
        with self._cond:
            self._waiting.append(call)
            if self._busy:
                self._cond.notify_all()  # a gathering batch may now have every live episode's call
                while self._busy and not call.done:
                    self._cond.wait()  # the running batch ends (its own bound: the generator's)
                if call.done:
                    return call.outcome()
            self._busy = True
            start = time.monotonic()
            deadline, waiting = start + self._wait_s, len(self._waiting)
            while self._idle_episodes() > 0 and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
                if len(self._waiting) > waiting:  # calls still coming in: give the rest as long again
                    deadline, waiting = min(time.monotonic() + self._wait_s, start + 4 * self._wait_s), len(self._waiting)
            calls, self._waiting = self._waiting, []
        try:
            batches: dict[tuple[int, SamplingParams], list[_Call]] = {}
            for each in calls:
                batches.setdefault((id(each.route.policy), each.route.params), []).append(each)
            for batch in batches.values():
                _generate(batch)
                if len(batch) < len(calls):  # other batches follow: these calls go on meanwhile
                    with self._cond:
                        for each in batch:
                            each.done = True
                        self._cond.notify_all()
        finally:
            with self._cond:
                for each in calls:
                    if each.generation is None and each.error is None:  # an error outside generate: never a hang
                        each.error = RuntimeError("the batch ended before generating this call")
                    each.done = True
                self._busy = False
                self._cond.notify_all()
        return call.outcome()


def _generate(batch: list[_Call]) -> None:
    route = batch[0].route
    try:
        generations = route.policy.generate([each.prompt for each in batch], route.params)
        if len(generations) != len(batch):
            raise ValueError(f"{type(route.policy).__name__}.generate returned {len(generations)} completions for {len(batch)} prompts")
    except BaseException as exc:  # noqa: BLE001 - every call of the batch gets the error
        for each in batch:
            each.error = exc
        return
    for each, generation in zip(batch, generations):
        each.generation = _cut(each.route, generation, each.limit)


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


def _envelope(id_: str, kind: str, model: str, choice: dict[str, Any], prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "id": id_,
        "object": kind,
        "created": int(time.time()),
        "model": model,
        "choices": [choice],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    }


def _error(exc: _Refused) -> Response:
    kind = "authentication_error" if exc.status == 401 else "invalid_request_error" if exc.status < 500 else "server_error"
    return Response.json({"error": {"message": str(exc), "type": kind, "param": None, "code": exc.code}}, exc.status)


def _stream(payload: dict[str, Any], *, chat: bool, usage: bool) -> Response:
    """The finished call as server-sent events: the whole reply in one delta, then its finish
    (sent in one response body: the call has ended when it is answered)."""
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
    for key in ("prompt_token_ids", "token_ids"):  # return_token_ids: with the first chunk, as vLLM sends them
        if key in choice:
            chunks[0][key] = choice[key]
    events = [{**head, "object": kind, "choices": [c]} for c in chunks]
    if "prompt_token_ids" in payload:
        events[0]["prompt_token_ids"] = payload["prompt_token_ids"]
    if usage:
        events.append({**head, "object": kind, "choices": [], "usage": payload["usage"]})
    body = b"".join(b"data: " + json.dumps(event).encode() + b"\n\n" for event in events) + b"data: [DONE]\n\n"
    return Response(200, body, "text/event-stream", {"Cache-Control": "no-cache"})
