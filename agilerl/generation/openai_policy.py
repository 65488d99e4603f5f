"""A policy behind any OpenAI-compatible ``/v1/chat/completions`` endpoint (``vllm serve``,
llama.cpp's server, hosted APIs), over aiohttp.

The collector speaks token ids and a chat endpoint speaks messages. ``MessageTokenizer`` bridges
the two without the model's own tokenizer: its "tokens" are Unicode code points and its chat
template frames every message with reserved noncharacters, so the conversation the harness
builds decodes back to exactly the messages the env produced. The endpoint renders them with
the model's real template. Completions come back as text, encoded the same way, closed with the
end-of-turn marker when the model stopped.

    policy = OpenAIChatPolicy("http://127.0.0.1:8000/v1", model="Qwen/Qwen3-0.6B")
    with RolloutCollector(factory, policy.tokenizer, batch_size=8, group_size=1) as collector:
        batch = collector.collect(policy)
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from agilerl.concurrency import shared_loop
from agilerl.errors import ChatTemplateError, EndpointError, InvalidArgument, ReplyTooLarge
from agilerl.generation.policy import FinishReason, Generation, SamplingParams
from agilerl.peers import DEFAULT_MAX_REPLY_BYTES, clean_secret, read_capped_text, redact
from agilerl.tools import ParsedCompletion, ToolCall, ToolParser, ToolSet

if TYPE_CHECKING:
    import aiohttp

__all__ = ["MessageTokenizer", "OpenAIChatPolicy", "EndpointToolCalls"]

_MESSAGE = "\ufdd0"  # opens a message: role, then _CONTENT
_CONTENT = "\ufdd1"  # separates a message's header from its content
_END = "\ufdd2"  # closes a message (the end-of-turn token)
_TOOLS = "\ufdd3"  # opens the tools block (JSON), closed by _END
_FIELDS = "\ufdd4"  # in a header: the message's other fields follow, as JSON
_MARKERS = frozenset(_MESSAGE + _CONTENT + _END + _TOOLS + _FIELDS)
_RETRIED_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})


class MessageTokenizer:
    """Code points as token ids and a chat template that keeps every message recoverable.

    Just the surface ``ChatRenderer`` and the collector use (``apply_chat_template``,
    ``encode``, ``decode``, ``eos_token_id``); ``messages(ids)`` inverts a rendered prompt.
    """

    chat_template = "agilerl message frames"  # rendered in Python below; never a jinja template
    takes_image_parts = True  # an image observation travels as image_url parts: the endpoint reads them
    clean_up_tokenization_spaces = False
    eos_token_id = ord(_END)
    pad_token_id = ord(_END)
    all_special_tokens = sorted(_MARKERS)

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        *,
        tokenize: bool = False,
        add_generation_prompt: bool = False,
        tools: list[dict[str, Any]] | None = None,
        **_template_kwargs: Any,
    ) -> str | list[int]:
        """Frame ``messages`` (and ``tools``); template kwargs belong to the endpoint's template."""
        text = _TOOLS + _json(tools) + _END if tools else ""
        text += "".join(_frame(message) for message in messages)
        if add_generation_prompt:
            text += _MESSAGE + "assistant" + _CONTENT
        return self.encode(text) if tokenize else text

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids``; with ``skip_special_tokens`` (what a text env receives), an
        answer's structured tool calls read as one JSON line each, as the env had them before
        tool parsers."""
        text = "".join(chr(i) for i in ids)
        if not skip_special_tokens:
            return text
        content, fields, calls = text.partition(_FIELDS)
        if fields:
            lines = [_json({"name": c.get("function", {}).get("name"), "arguments": c.get("function", {}).get("arguments")})
                     for c in _calls_of(calls.rstrip(_END))]
            content = "\n".join([content.strip(_END)] * bool(content.strip(_END)) + lines)
        return "".join(c for c in content if c not in _MARKERS)

    def tool_call_parser(self) -> EndpointToolCalls:
        """The parser of answers' structured ``tool_calls`` (``tool_parser`` with an endpoint)."""
        return EndpointToolCalls(self)

    def messages(self, prompt: Sequence[int]) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
        """The messages (and tools) of a rendered prompt, less its trailing generation prompt."""
        text = self.decode(prompt)
        opening = _MESSAGE + "assistant" + _CONTENT
        if not text.endswith(opening):
            raise InvalidArgument("the prompt does not end with an assistant turn's opening: not a MessageTokenizer prompt")
        text = text[: -len(opening)]
        tools = None
        if text.startswith(_TOOLS):
            block, _, text = text[1:].partition(_END)
            tools = json.loads(block)
        messages = []
        for framed in text.split(_MESSAGE)[1:]:
            header, _, content = framed.removesuffix(_END).partition(_CONTENT)
            role, fields, extra = header.partition(_FIELDS)
            if fields:
                messages.append({"role": role, **json.loads(extra)})
            elif _FIELDS in content:  # a generated answer with tool calls: sent back structured
                content, _, calls = content.partition(_FIELDS)
                messages.append({"role": role, "content": content or None, "tool_calls": _calls_of(calls)})
            else:
                messages.append({"role": role, "content": content})
        return messages, tools


def _frame(message: dict[str, Any]) -> str:
    """One message as ``_MESSAGE role _CONTENT content _END``; anything beyond a text content
    (tool calls, content parts) travels as JSON in the header."""
    role = str(message.get("role"))
    content = message.get("content")
    if set(message) <= {"role", "content"} and isinstance(content, str):
        if _MARKERS.intersection(content) or _MARKERS.intersection(role):
            raise ChatTemplateError(
                f"a {role!r} message holds one of the Unicode noncharacters U+FDD0..U+FDD4, which "
                "MessageTokenizer reserves to frame messages; strip them from the env's text"
            )
        return _MESSAGE + role + _CONTENT + content + _END
    rest = {k: v for k, v in message.items() if k != "role"}
    return _MESSAGE + role + _FIELDS + _json(rest) + _CONTENT + _END


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"))


class OpenAIChatPolicy:
    """Generates with ``POST {base_url}/chat/completions``, every prompt of a batch at once.

    ``base_url`` is the API root (``http://host:8000/v1``). ``extra_body`` is merged into each
    request (``chat_template_kwargs`` for vLLM, ``seed``, ...). A request refused because the
    conversation outgrew the model's context ends that episode (``finish_reason="context"``), as
    ``TransformersPolicy`` does; 408/429/5xx and dropped connections are retried ``retries``
    times with backoff; anything else is an ``EndpointError`` naming the status and the fix.
    No log-probs: this policy evaluates, it does not train.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key: str | None = None,
        max_concurrency: int = 32,
        timeout_s: float = 600.0,
        retries: int = 3,
        extra_body: dict[str, Any] | None = None,
        max_reply_bytes: int = DEFAULT_MAX_REPLY_BYTES,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise InvalidArgument(f"base_url must start with http:// or https://, got {redact(base_url)!r}")
        if max_concurrency < 1 or retries < 0 or timeout_s <= 0:
            raise InvalidArgument(
                f"max_concurrency >= 1, retries >= 0 and timeout_s > 0 are needed, got "
                f"{max_concurrency}, {retries} and {timeout_s}"
            )
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = MessageTokenizer()
        self.retries = retries
        api_key = clean_secret(api_key, "the API key (--api-key, $OPENAI_API_KEY)")
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.max_reply_bytes = max_reply_bytes
        self._timeout_s = timeout_s
        self._extra_body = dict(extra_body or {})
        self._max_concurrency = max_concurrency
        self._loop = shared_loop()
        self._session: aiohttp.ClientSession | None = None
        self._limit: asyncio.Semaphore | None = None

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[Generation]:
        requests = [self._request(*self.tokenizer.messages(p), params) for p in prompts]
        return self._loop.run(self._complete_all(requests))

    def close(self) -> None:
        """Close the HTTP session (also done when the process exits)."""
        if self._session is not None:
            session, self._session = self._session, None
            self._loop.run(session.close())

    def _request(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, params: SamplingParams
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
        }
        if params.top_p < 1:
            body["top_p"] = params.top_p
        if params.top_k:
            body["top_k"] = params.top_k  # not OpenAI's own: vLLM, llama.cpp and SGLang take it
        if tools:
            body["tools"] = tools
        return {**body, **self._extra_body}

    async def _complete_all(self, requests: list[dict[str, Any]]) -> list[Generation]:
        if self._session is None:
            import aiohttp

            self._session = aiohttp.ClientSession(
                headers=self._headers, timeout=aiohttp.ClientTimeout(total=self._timeout_s)
            )
            self._limit = asyncio.Semaphore(self._max_concurrency)
            self._loop.at_stop(self._session.close)
        return list(await asyncio.gather(*(self._complete(r) for r in requests)))

    async def _complete(self, body: dict[str, Any]) -> Generation:
        import aiohttp

        assert self._session is not None and self._limit is not None
        url = f"{self.base_url}/chat/completions"
        shown = redact(url)
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                async with self._limit, self._session.post(url, json=body) as response:
                    text = await read_capped_text(response, self.max_reply_bytes, url=url, setting="max_reply_bytes")
                    if response.status == 200:
                        return self._generation(_decode_json(text, shown))
                    if _context_is_full(response.status, text):
                        return Generation([], None, "context")
                    if response.status not in _RETRIED_STATUSES or last:
                        raise EndpointError(_status_message(response.status, shown, text, self.model))
            except ReplyTooLarge as exc:  # the same request gets the same answer: no retry
                raise EndpointError(str(exc)) from None
            except (aiohttp.ClientConnectionError, asyncio.TimeoutError) as exc:
                if last:
                    raise EndpointError(redact(
                        f"cannot reach {url} ({type(exc).__name__}: {exc or 'timed out'}): check that "
                        "the server is running and that --base-url is its API root (ending in /v1)"
                    )) from None
            await asyncio.sleep(min(8.0, 0.5 * 2**attempt))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _generation(self, reply: dict[str, Any]) -> Generation:
        try:
            choice = reply["choices"][0]
            message = choice["message"]
        except (KeyError, IndexError, TypeError):
            raise EndpointError(
                f"{redact(self.base_url)}/chat/completions answered without choices[0].message: "
                f"{str(reply)[:200]}; is it an OpenAI-compatible chat endpoint?"
            ) from None
        text = "".join(c for c in message.get("content") or "" if c not in _MARKERS)
        calls = [_plain_call(call, i) for i, call in enumerate(message.get("tool_calls") or [])]
        if calls:  # kept structured: a tool parser runs them, a text env reads them as JSON lines
            text += _FIELDS + _json(calls)
        ids = self.tokenizer.encode(text)
        finish: FinishReason = "length" if choice.get("finish_reason") == "length" else "stop"
        return Generation(ids + [ord(_END)] if finish == "stop" else ids, None, finish)


def _plain_call(call: Any, index: int) -> dict[str, Any]:
    """An endpoint's tool call as ``{id, type, function: {name, arguments}}`` (arguments as JSON text)."""
    call = call if isinstance(call, dict) else {}
    function = call.get("function") if isinstance(call.get("function"), dict) else {}
    arguments = function.get("arguments")
    if not isinstance(arguments, str):
        arguments = _json(arguments if arguments is not None else {})
    return {"id": str(call.get("id") or f"call{index:05d}"), "type": "function",
            "function": {"name": function.get("name"), "arguments": arguments}}


def _calls_of(text: str) -> list[dict[str, Any]]:
    try:
        calls = json.loads(text)
    except ValueError:
        return []
    return [c for c in calls if isinstance(c, dict)] if isinstance(calls, list) else []


class EndpointToolCalls(ToolParser):
    """Reads the tool calls an OpenAI-compatible endpoint already parsed (its ``tool_calls``), so
    ``agilerl eval --base-url`` runs the same calls through ``tool_parser`` as a local model."""

    name = "openai"

    def parse(self, ids: Sequence[int], tools: ToolSet | None = None) -> ParsedCompletion:
        return self.parse_text("".join(chr(i) for i in ids), tools)

    def parse_text(self, text: str, tools: ToolSet | None = None) -> ParsedCompletion:
        text = text.removesuffix(_END)
        content, fields, encoded = text.partition(_FIELDS)
        calls = []
        start = len(content) + len(fields)
        for i, call in enumerate(_calls_of(encoded) if fields else []):
            function = call["function"]
            raw = function.get("arguments") or "{}"
            try:
                arguments, status, error = json.loads(raw), "ok", None
            except ValueError as exc:
                arguments, status, error = None, "invalid_json", f"arguments: {exc}"
            if status == "ok" and not isinstance(arguments, dict):
                arguments, status, error = None, "invalid_json", "arguments must be a JSON object"
            if status == "ok" and not function.get("name"):
                status, error = "missing_name", "the call names no tool"
            calls.append(ToolCall(function.get("name"), arguments, status, (start, len(text)), raw, error, call["id"]))
        parsed = ParsedCompletion(content=content.strip() if calls else content, calls=tuple(calls), unit="token", text=content)
        return parsed.checked(tools)


def _decode_json(text: str, url: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        raise EndpointError(f"{url} answered 200 with a body that is not JSON: {text[:200]!r}") from None
    if not isinstance(value, dict):
        raise EndpointError(f"{url} answered 200 with JSON that is not an object: {text[:200]!r}")
    return value


def _context_is_full(status: int, text: str) -> bool:
    """vLLM, llama.cpp and OpenAI refuse an over-long conversation with a 400 that says so."""
    lowered = text.lower()
    return status == 400 and "context" in lowered and any(w in lowered for w in ("length", "exceed", "too long", "size"))


def _status_message(status: int, url: str, text: str, model: str) -> str:
    detail = text.strip().replace("\n", " ")[:300]
    fix = {
        401: "pass the right --api-key (or set OPENAI_API_KEY)",
        403: "pass an --api-key allowed to use this model",
        404: f"check --base-url (the API root, ending in /v1) and --model {model!r} (GET {url.rsplit('/', 2)[0]}/models lists the served names)",
    }.get(status, "see the server's message")
    return f"{url} answered HTTP {status}: {detail}; {fix}"
