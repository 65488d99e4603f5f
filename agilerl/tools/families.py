"""The built-in tool-call parsers, one class per model family's own format.

Each says its markers and how to read one call; ``ToolParser`` does the rest. Formats:

- ``hermes``: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5, Qwen3, Hermes);
- ``qwen3_coder``: its own module (``agilerl.tools.qwen3_coder``): an XML-like format whose values are text;
- ``llama3_json``: the completion is ``{"name": ..., "parameters": {...}}`` (``;``-separated), after
  an optional ``<|python_tag|>``;
- ``mistral``: ``[TOOL_CALLS][{...}, ...]``, or ``[TOOL_CALLS]NAME[ARGS]{...}`` (v11 tokenizers);
- ``granite``: ``<|tool_call|>[{"name": ..., "arguments": {...}}]``;
- ``gemma``: ``<|tool_call>call:NAME{key:value,...}<tool_call|>``, strings in ``<|"|>`` (Gemma 4);
- ``harmony``: GPT-OSS's channels: ``to=functions.NAME ... <|message|>{...}<|call|>``;
- ``deepseek``: ``<｜tool▁call▁begin｜>...<｜tool▁sep｜>...<｜tool▁call▁end｜>`` (V3, R1 and V3.1).
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from agilerl.tools.calls import ParsedCompletion, ToolCall
from agilerl.tools.jsonvalue import first_value, loads
from agilerl.tools.parser import THINK_TAGS, BodyCall, Segment, ToolParser

__all__ = [
    "HermesParser",
    "Llama3JsonParser",
    "MistralParser",
    "GraniteParser",
    "GemmaParser",
    "HarmonyParser",
    "DeepSeekParser",
]


def _json_call(obj: Any, names: tuple[str, ...] = ("arguments", "parameters")) -> BodyCall:
    """A ``{"name": ..., "arguments": {...}}`` object (arguments may be a JSON string)."""
    if not isinstance(obj, dict):
        return BodyCall(None, None, "invalid_json", f"a call is a JSON object, got {type(obj).__name__}")
    name = obj.get("name")
    arguments = next((obj[key] for key in names if key in obj), {})
    if isinstance(arguments, str):
        arguments, problem = loads(arguments) if arguments.strip() else ({}, None)
        if problem is not None:
            return BodyCall(name if isinstance(name, str) else None, None, "invalid_json", f"arguments: {problem}")
    if not isinstance(name, str) or not name:
        return BodyCall(None, arguments, "missing_name", 'the call has no "name"')
    return BodyCall(name, arguments)


def _json_calls(text: str, *, first: bool = False) -> list[BodyCall]:
    """A JSON list of call objects, or one object (``first``: the text's first JSON value)."""
    value, _, problem = first_value(text, whole=not first)
    if problem is not None:
        return [BodyCall(None, None, "invalid_json", problem)]
    return [_json_call(item) for item in value] if isinstance(value, list) else [_json_call(value)]


class HermesParser(ToolParser):
    name = "hermes"
    call_start = "<tool_call>"
    call_end = "</tool_call>"
    reasoning = THINK_TAGS
    unclosed_at_end = True

    def read_body(self, body: str) -> list[BodyCall]:
        value, problem = loads(body.strip())
        if problem is not None:
            return [BodyCall(None, None, "invalid_json", problem)]
        return [_json_call(value)]

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class Llama3JsonParser(ToolParser):
    """A completion that is JSON (after an optional ``<|python_tag|>``) is a call; other text is
    an answer. Several calls are separated by ``;``."""

    name = "llama3_json"
    required_markers = ("<|python_tag|>",)

    def extra_markers(self) -> tuple[str, ...]:
        return ("<|python_tag|>",)

    def _parse_segments(self, segments: list[Segment], text_of: Any, unit: str) -> ParsedCompletion:
        tagged = any(seg.marker == "<|python_tag|>" for seg in segments)
        body = [seg for seg in segments if seg.marker is None]
        text = "".join(text_of.one(seg) for seg in body)
        if not body or not (tagged or text.lstrip().startswith("{")):
            return ParsedCompletion(content=text, unit=unit, text=text_of)  # type: ignore[arg-type]
        span = (body[0].start, body[-1].end)
        calls = []
        rest = text.strip()
        while rest:
            value, end, problem = first_value(rest)
            if problem is not None:
                status = "unclosed" if "nest" not in problem and rest.count("{") > rest.count("}") else "invalid_json"
                item = BodyCall(None, None, status, problem)  # type: ignore[arg-type]
                calls.append(_record(item, span, rest, len(calls)))
                break
            calls.append(_record(_json_call(value), span, rest[:end], len(calls)))
            rest = rest[end:].lstrip().removeprefix(";").lstrip()
        return ParsedCompletion(content="", calls=tuple(calls), unit=unit, text=text_of)  # type: ignore[arg-type]

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return json.dumps({"name": name, "parameters": arguments})


def _record(item: BodyCall, span: tuple[int, int], raw: str, index: int) -> ToolCall:
    from agilerl.tools.parser import _call

    return _call(item, span, raw, index)


class MistralParser(ToolParser):
    name = "mistral"
    call_start = "[TOOL_CALLS]"
    reasoning = ("[THINK]", "[/THINK]")

    def extra_markers(self) -> tuple[str, ...]:
        return ("[ARGS]", "[CALL_ID]")

    def read_body(self, body: str) -> list[BodyCall]:
        """As vLLM reads it: the first JSON value after the marker (text after it is not the
        call's), and before a list of calls, whatever precedes its ``[{``."""
        body = body.strip()
        if "[ARGS]" in body:
            name, _, arguments = body.partition("[ARGS]")
            name = name.partition("[CALL_ID]")[0].strip()
            value, _, problem = first_value(arguments)
            if problem is not None:
                return [BodyCall(name or None, None, "invalid_json", problem)]
            return [BodyCall(name or None, value)]
        if not body.startswith(("[", "{")) and (start := body.find("[{")) > 0:
            body = body[start:]  # junk before the list
        return _json_calls(body, first=True)

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return "[TOOL_CALLS]" + json.dumps([{"name": name, "arguments": arguments}])


class GraniteParser(ToolParser):
    name = "granite"
    call_start = "<|tool_call|>"
    reasoning = THINK_TAGS

    def read_body(self, body: str) -> list[BodyCall]:
        return _json_calls(body, first=True)

    def _parse_segments(self, segments: list[Segment], text_of: Any, unit: str) -> ParsedCompletion:
        """As vLLM reads Granite: an answer that opens with the plain text ``<tool_call>`` (not the
        ``<|tool_call|>`` token) followed by calls that read whole is calls too."""
        parsed = super()._parse_segments(segments, text_of, unit)
        opened = parsed.content.lstrip()
        if parsed.calls or parsed.reasoning is not None or not opened.startswith(_PLAIN_CALL):
            return parsed
        raw = opened[len(_PLAIN_CALL) :]
        found = self._read(raw)
        if not all(item.status == "ok" for item in found):
            return parsed  # prose that happens to start with the tag
        span = (segments[0].start, segments[-1].end)
        calls = tuple(_record(item, span, raw, i) for i, item in enumerate(found))
        return ParsedCompletion(content="", calls=calls, unit=unit, text=text_of)  # type: ignore[arg-type]

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return "<|tool_call|>" + json.dumps([{"name": name, "arguments": arguments}])


_PLAIN_CALL = "<tool_call>"


_QUOTE = '<|"|>'
_NUMBER = re.compile(r"-?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")
_INTEGER = re.compile(r"-?\d+")


class GemmaParser(ToolParser):
    name = "gemma"
    calls_end = "<tool_call|>"
    call_start = "<|tool_call>"
    call_end = "<tool_call|>"
    reasoning = ("<|channel>", "<channel|>")

    def read_body(self, body: str) -> list[BodyCall]:
        body = body.strip()
        if not body.startswith("call:"):
            return [BodyCall(None, None, "missing_name", "a call starts with call:NAME")]
        brace = body.find("{")
        name = body[5 : brace if brace >= 0 else len(body)].strip()
        if brace < 0:
            return [BodyCall(name or None, {})]
        try:
            value, end = _GemmaValue(body, brace).object()
        except ValueError as exc:
            return [BodyCall(name or None, None, "invalid_json", str(exc))]
        if body[end:].strip():
            return [BodyCall(name or None, None, "invalid_json", f"text after the arguments: {body[end:]!r:.40}")]
        return [BodyCall(name or None, value)]

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"<|tool_call>call:{name}{_gemma_value(arguments, top=True)}<tool_call|>"


def _gemma_value(value: Any, top: bool = False) -> str:
    if isinstance(value, str):
        return _QUOTE + value + _QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        items = (f"{key}:{_gemma_value(value[key])}" for key in sorted(value))
        return "{" + ",".join(items) + "}"
    if isinstance(value, list):
        return "[" + ",".join(_gemma_value(v) for v in value) + "]"
    return "null" if value is None else str(value)


class _GemmaValue:
    """A reader for Gemma 4's argument syntax: JSON-like, bare keys, strings in ``<|"|>``."""

    def __init__(self, text: str, at: int) -> None:
        self.text = text
        self.at = at

    def object(self) -> tuple[dict[str, Any], int]:
        value = self.value()
        if not isinstance(value, dict):
            raise ValueError("the arguments are not an object")
        return value, self.at

    def value(self) -> Any:
        text = self.text
        self._skip()
        if text.startswith(_QUOTE, self.at):
            end = text.find(_QUOTE, self.at + len(_QUOTE))
            if end < 0:
                raise ValueError("an unclosed <|\"|> string")
            value = text[self.at + len(_QUOTE) : end]
            self.at = end + len(_QUOTE)
            return value
        if text.startswith("{", self.at):
            return self._items("}", keyed=True)
        if text.startswith("[", self.at):
            return self._items("]", keyed=False)
        match = re.compile(r"[^,}\]]*").match(text, self.at)
        assert match is not None
        self.at = match.end()
        word = match.group().strip()
        if not word:
            raise ValueError(f"a value is missing at {self.at}")
        literal = {"true": True, "false": False, "null": None}
        if word in literal:
            return literal[word]
        if _NUMBER.fullmatch(word):  # as vLLM reads Gemma's numbers: 108. and .5 are numbers too
            return int(word) if _INTEGER.fullmatch(word) else float(word)
        try:
            return json.loads(word)
        except ValueError:
            return word

    def _items(self, close: str, *, keyed: bool) -> Any:
        self.at += 1
        items: Any = {} if keyed else []
        while True:
            self._skip()
            if self.text.startswith(close, self.at):
                self.at += 1
                return items
            if keyed:
                if self.text.startswith(_QUOTE, self.at):
                    key = self.value()
                    colon = self.text.find(":", self.at)
                else:
                    colon = self.text.find(":", self.at)
                    key = self.text[self.at : colon].strip() if colon >= 0 else ""
                if colon < 0 or not key:
                    raise ValueError(f"a key without a value at {self.at}")
                self.at = colon + 1
                items[key] = self.value()
            else:
                items.append(self.value())
            self._skip()
            if self.text.startswith(",", self.at):
                self.at += 1
            elif not self.text.startswith(close, self.at):
                raise ValueError(f"expected ',' or {close!r} at {self.at}")

    def _skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at].isspace():
            self.at += 1


_RECIPIENT = re.compile(r"to=([^\s<]+)")
_CHANNEL = re.compile(r"<\|channel\|>\s*([A-Za-z_]+)")


class HarmonyParser(ToolParser):
    """GPT-OSS: a completion is messages ``[header]<|message|>body<|end|>|<|call|>|<|return|>``.
    The analysis channel is reasoning; a message addressed ``to=functions.NAME`` is a call; the
    final channel (and commentary to no one) is content."""

    name = "harmony"
    calls_end = "<|call|>"
    required_markers = ("<|channel|>", "<|message|>", "<|call|>")
    _TERMINATORS: ClassVar[tuple[str, ...]] = ("<|end|>", "<|call|>", "<|return|>")

    def extra_markers(self) -> tuple[str, ...]:
        return ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", *self._TERMINATORS)

    def _parse_segments(self, segments: list[Segment], text_of: Any, unit: str) -> ParsedCompletion:
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        header: list[Segment] = []
        body: list[Segment] = []
        in_body = False
        begin = segments[0].start if segments else 0

        def finish(end: int, closed: bool) -> None:
            head = text_of.segments(header, keep_special=True)
            channel_match = _CHANNEL.search(head)
            channel = channel_match.group(1) if channel_match else ""
            recipient_match = _RECIPIENT.search(head)
            text = "".join(text_of.one(seg) for seg in body if seg.marker is None)
            if recipient_match:
                name = recipient_match.group(1).removeprefix("functions.")
                if not closed:
                    item = BodyCall(name, None, "unclosed", "the call has no <|call|>")
                else:
                    value, problem = loads(text.strip() or "{}")
                    item = BodyCall(name, None, "invalid_json", problem) if problem else BodyCall(name, value)
                calls.append(_record(item, (begin, end), text, len(calls)))
            elif channel == "analysis":
                reasoning.append(text)
            else:
                content.append(text)

        for seg in segments:
            if not in_body:
                if seg.marker == "<|message|>":
                    in_body, body = True, []
                elif seg.marker == "<|start|>":
                    header, begin = [], seg.start
                else:
                    header.append(seg)
                continue
            if seg.marker in self._TERMINATORS or seg.marker == "<|start|>":
                finish(seg.end if seg.marker != "<|start|>" else seg.start, seg.marker != "<|start|>")
                in_body, header, begin = False, [], seg.end
                if seg.marker == "<|start|>":
                    begin = seg.start
            else:
                body.append(seg)
        if in_body:
            finish(segments[-1].end, False)
        elif header and not calls and not content and not reasoning:
            content.append("".join(text_of.one(seg) for seg in header if seg.marker is None))
        return ParsedCompletion(
            content="".join(content),
            reasoning="".join(reasoning) if reasoning else None,
            calls=tuple(calls),
            unit=unit,  # type: ignore[arg-type]
            text=text_of,  # type: ignore[arg-type]
        )

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return f"<|channel|>commentary to=functions.{name} <|constrain|>json<|message|>{json.dumps(arguments)}<|call|>"


_CALLS_BEGIN, _CALL_BEGIN, _SEP, _CALL_END, _CALLS_END = (
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁calls▁end｜>",
)
_FENCED = re.compile(r"\A\s*([^\n`]*?)\s*\n?```(?:json)?\s*(.*?)\s*```", re.S)


class DeepSeekParser(ToolParser):
    """V3/R1: ``function<｜tool▁sep｜>NAME`` then fenced JSON; V3.1: ``NAME<｜tool▁sep｜>{json}``."""

    name = "deepseek"
    call_start = _CALL_BEGIN
    call_end = _CALL_END
    ignored = (_CALLS_BEGIN, _CALLS_END)
    reasoning = THINK_TAGS
    required_markers = (_CALL_BEGIN, _CALL_END, _SEP)

    def extra_markers(self) -> tuple[str, ...]:
        return (_SEP,)

    def read_body(self, body: str) -> list[BodyCall]:
        left, found, right = body.partition(_SEP)
        if not found:
            return [BodyCall(None, None, "missing_name", f"the call has no {_SEP}")]
        left = left.strip()
        if left == "function":
            fenced = _FENCED.match(right)
            if fenced is None:
                return [BodyCall(None, None, "invalid_json", "expected NAME and a ```json block")]
            name, arguments = fenced.group(1).strip(), fenced.group(2)
        else:
            name, arguments = left, right
        value, _, problem = first_value(arguments if arguments.strip() else "{}")  # text after it is not the call's
        if problem is not None:
            return [BodyCall(name or None, None, "invalid_json", problem)]
        return [BodyCall(name or None, value)]

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        return (
            f"{_CALLS_BEGIN}{_CALL_BEGIN}function{_SEP}{name}\n```json\n{json.dumps(arguments)}\n```"
            f"{_CALL_END}{_CALLS_END}"
        )
