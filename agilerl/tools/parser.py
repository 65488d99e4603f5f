"""The base of every tool-call parser: generated token ids (or text) split at a family's markers.

Where a family's markers are single tokens of the tokenizer (Qwen's ``<tool_call>``, Mistral's
``[TOOL_CALLS]``, Harmony's ``<|call|>``), the ids are split at those ids: a tag the model spells
out of ordinary tokens, or an env writes as text, is then never a call. Where they are not (a
tokenizer without them, or text from an OpenAI-compatible endpoint), the text is split at the
marker strings instead and spans count characters.

A family says its markers and how to read one call's body; the state machine here handles
reasoning (calls drafted inside it are never run), unclosed calls and the content between.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from agilerl.tools.calls import CallStatus, ParsedCompletion, ToolCall, ToolSet
from agilerl.tools.jsonvalue import MAX_DEPTH, depth_problem

__all__ = ["Segment", "ToolParser", "BodyCall", "marker_ids", "THINK_TAGS"]

THINK_TAGS = ("<think>", "</think>")
"""The reasoning markers of the families that think in ``<think>`` blocks (Qwen3, DeepSeek R1)."""


@dataclass(frozen=True)
class Segment:
    """A run of plain units (``marker`` None) or one marker, ``[start, end)`` in units."""

    marker: str | None
    start: int
    end: int


@dataclass(frozen=True)
class BodyCall:
    """What a family read from one call's body."""

    name: str | None
    arguments: Any = None
    status: CallStatus = "ok"
    error: str | None = None


def marker_ids(tokenizer: Any, markers: Sequence[str]) -> dict[int, str] | None:
    """Each marker's token id, when every marker is one added (or special) token; else None."""
    if tokenizer is None:
        return None
    try:
        added = tokenizer.get_added_vocab()
    except Exception:  # noqa: BLE001 - a tokenizer without added tokens has no marker ids
        return None
    found: dict[int, str] = {}
    for marker in markers:
        token_id = added.get(marker)
        if token_id is None:
            return None
        found[token_id] = marker
    return found


class ToolParser:
    """Turns one completion into a ``ParsedCompletion``. Subclasses set the markers and
    ``read_body``; Harmony and Llama's JSON override ``_parse_segments`` / ``parse_text``.

    Build one per tokenizer (``ToolParser(tokenizer)``): it learns the markers' token ids once.
    """

    name: ClassVar[str] = ""
    call_start: ClassVar[str | None] = None
    call_end: ClassVar[str | None] = None
    """None: a call runs to the next ``call_start`` or the end of the completion."""
    reasoning: ClassVar[tuple[str, str] | None] = None
    ignored: ClassVar[tuple[str, ...]] = ()
    """Markers that only frame the calls (DeepSeek's outer begin/end): dropped from the content."""
    calls_end: ClassVar[str | None] = None
    """What ends a turn of calls when the model writes it as its stop token (Harmony's
    ``<|call|>``, Gemma's ``<tool_call|>``); None: the chat template's close of an answer."""
    required_markers: ClassVar[tuple[str, ...] | None] = None
    """The markers that must be tokens to parse on ids (default: the call markers)."""
    unclosed_at_end: ClassVar[bool] = False
    """Whether a call the completion ends inside runs when its body reads whole (vLLM's hermes
    takes ``<tool_call>{...}`` at the end without ``</tool_call>``); else it is ``unclosed``."""

    def __init__(self, tokenizer: Any = None) -> None:
        self.tokenizer = tokenizer
        call_markers = [m for m in (self.call_start, self.call_end, *self.ignored) if m]
        required = list(self.required_markers if self.required_markers is not None else call_markers)
        self._markers = [*dict.fromkeys([*call_markers, *(self.reasoning or ()), *self.extra_markers()])]
        ids = marker_ids(tokenizer, required) if required else None
        if ids is not None:
            optional = marker_ids(tokenizer, [m for m in self._markers if m not in required]) or {}
            if not optional:  # take each optional marker that is a token on its own
                for marker in self._markers:
                    one = marker_ids(tokenizer, [marker])
                    if one:
                        optional.update(one)
            ids = {**optional, **ids}
        self._ids = ids
        """marker token id -> marker; None: parse text."""
        specials = set(getattr(tokenizer, "all_special_ids", None) or ())
        self._trailing = specials - set(ids or ())
        # the Rust tokenizer's own decode: the same text without the Python wrapper's cost
        backend = getattr(tokenizer, "backend_tokenizer", None)
        clean = bool(getattr(tokenizer, "clean_up_tokenization_spaces", False))
        self._backend = backend if backend is not None and not clean else None
        pattern = "|".join(re.escape(m) for m in sorted(self._markers, key=len, reverse=True))
        self._pattern = re.compile(pattern) if pattern else None

    def extra_markers(self) -> tuple[str, ...]:
        """Further markers a family's state machine needs as segments."""
        return ()

    @property
    def on_ids(self) -> bool:
        """Whether this parser splits token ids at marker tokens (else text at marker strings)."""
        return self._ids is not None

    # -- entry points ---------------------------------------------------------------------------

    def parse(self, ids: Sequence[int], tools: ToolSet | None = None) -> ParsedCompletion:
        """The generated ``ids`` (the end-of-turn token may be included) as content, reasoning
        and calls, each call checked against ``tools`` when given."""
        if self._ids is None:
            ids = list(ids)
            while ids and ids[-1] in self._trailing:
                ids.pop()
            return self.parse_text(self._decode(ids, keep_special=True), tools)
        ids = list(ids)
        while ids and ids[-1] in self._trailing:
            ids.pop()  # the end-of-turn token closes the completion, it is no part of a call
        hits = []  # (position, marker): each marker id counted and found by scans in C
        for token, marker in self._ids.items():
            at = -1
            for _ in range(ids.count(token)):
                at = ids.index(token, at + 1)
                hits.append((at, marker))
        hits.sort()
        segments = []
        start = 0
        for i, marker in hits:
            if start < i:
                segments.append(Segment(None, start, i))
            segments.append(Segment(marker, i, i + 1))
            start = i + 1
        if start < len(ids):
            segments.append(Segment(None, start, len(ids)))
        text_of = _IdText(self, ids)
        parsed = self._parse_segments(segments, text_of, "token")
        return parsed.checked(tools)

    def parse_text(self, text: str, tools: ToolSet | None = None) -> ParsedCompletion:
        """A completion known only as text (an OpenAI-compatible endpoint's): spans count chars."""
        segments = []
        start = 0
        for match in self._pattern.finditer(text) if self._pattern else ():
            if start < match.start():
                segments.append(Segment(None, start, match.start()))
            segments.append(Segment(match.group(), match.start(), match.end()))
            start = match.end()
        if start < len(text):
            segments.append(Segment(None, start, len(text)))
        return self._parse_segments(segments, _CharText(text), "char").checked(tools)

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        """The text this family's model writes for one call (for warm-start data and tests)."""
        raise NotImplementedError

    # -- the state machine ----------------------------------------------------------------------

    def read_body(self, body: str) -> list[BodyCall]:
        """The calls in one call block's text (markers removed)."""
        raise NotImplementedError

    def _read(self, body: str) -> list[BodyCall]:
        """``read_body``, with a family's recursion on a depth bomb turned into the call's status."""
        try:
            return self.read_body(body)
        except RecursionError:
            return [BodyCall(None, None, "invalid_json", f"the call nests deeper than {MAX_DEPTH} levels")]

    def _parse_segments(self, segments: list[Segment], text_of: Any, unit: str) -> ParsedCompletion:
        think_open, think_close = self.reasoning or (None, None)
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[ToolCall] = []
        state = "content"
        call_begin = 0
        body: list[Segment] = []
        seen_content = False

        def close_call(end: int, closed: bool) -> None:
            raw = text_of.segments(body, keep_special=True)
            found = self._read(raw) if closed or self.call_end is None or self.unclosed_at_end else []
            if not closed and self.call_end is not None and not (found and all(item.status == "ok" for item in found)):
                found = [BodyCall(None, None, "unclosed", f"the call has no {self.call_end}")]
            for item in found or [BodyCall(None, None, "missing_name", "an empty call")]:
                calls.append(_call(item, (call_begin, end), raw, len(calls)))

        for seg in segments:
            marker = seg.marker
            if state == "reasoning":
                if marker == think_close:
                    state = "content"
                else:
                    reasoning.append(text_of.one(seg))
                continue
            if state == "call":
                if marker == self.call_end and self.call_end is not None:
                    close_call(seg.end, True)
                    state = "content"
                elif marker == self.call_start and self.call_end is None:
                    close_call(seg.start, True)
                    call_begin, body = seg.start, []
                else:
                    body.append(seg)
                continue
            if marker is not None and marker == think_open:
                state = "reasoning"
            elif marker is not None and marker == think_close:
                # the prompt opened the reasoning (DeepSeek-R1, QwQ): all before it was reasoning
                if not calls and not reasoning:
                    reasoning, content = content, []
            elif marker is not None and marker == self.call_start:
                state, call_begin, body = "call", seg.start, []
            elif marker in self.ignored:
                continue
            else:
                text = text_of.one(seg)
                seen_content = seen_content or bool(text.strip())
                content.append(text)
        if state == "call":
            close_call(segments[-1].end if segments else 0, False)
        return ParsedCompletion(
            content="".join(content).strip() if calls or reasoning or state == "reasoning" else "".join(content),
            reasoning="".join(reasoning) if reasoning or state == "reasoning" else None,
            calls=tuple(calls),
            unit=unit,  # type: ignore[arg-type]
            text=text_of,  # type: ignore[arg-type]
        )

    def _decode(self, ids: list[int], *, keep_special: bool) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=not keep_special)
        if self.tokenizer is None:
            raise ValueError(f"the {self.name} parser was built without a tokenizer: use parse_text(text)")
        return self.tokenizer.decode(ids, skip_special_tokens=not keep_special)


def _call(item: BodyCall, span: tuple[int, int], raw: str, index: int) -> ToolCall:
    status, error, arguments = item.status, item.error, item.arguments
    if status == "ok" and not item.name:
        status, error = "missing_name", "the call names no tool"
    if status == "ok" and arguments is None:
        arguments = {}
    if status == "ok" and not isinstance(arguments, dict):
        status, error = "invalid_json", f"arguments must be a JSON object, got {type(arguments).__name__}"
    if status == "ok" and (problem := depth_problem(arguments)) is not None:
        status, error, arguments = "invalid_json", problem, None
    return ToolCall(
        name=item.name or None,
        arguments=arguments if isinstance(arguments, dict) else None,
        status=status,
        span=span,
        raw=raw,
        error=error,
        id=f"call{index:05d}",  # 9 characters: what Mistral's templates insist on
    )


class _IdText:
    """Text of id segments: content without special tokens, call bodies with them."""

    def __init__(self, parser: ToolParser, ids: list[int]) -> None:
        self.parser = parser
        self.ids = ids

    def one(self, seg: Segment) -> str:
        return self.parser._decode(self.ids[seg.start : seg.end], keep_special=False)

    def segments(self, segs: list[Segment], *, keep_special: bool) -> str:
        if not segs:
            return ""
        return self.parser._decode(self.ids[segs[0].start : segs[-1].end], keep_special=keep_special)

    def whole(self) -> str:
        return self.parser._decode(self.ids, keep_special=False)


class _CharText:
    def __init__(self, text: str) -> None:
        self.text = text

    def one(self, seg: Segment) -> str:
        return self.text[seg.start : seg.end]

    def segments(self, segs: list[Segment], *, keep_special: bool) -> str:
        return self.text[segs[0].start : segs[-1].end] if segs else ""

    def whole(self) -> str:
        return self.text
