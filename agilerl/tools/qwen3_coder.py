"""The ``qwen3_coder`` tool-call parser: ``<tool_call><function=NAME><parameter=P>value</parameter>
</function></tool_call>`` (Qwen3-Coder). Values are text, read in linear time however they nest;
the tool's schema says what each is (``agilerl.tools.schema``)."""

from __future__ import annotations

import json
import re
from bisect import bisect_left
from typing import Any

from agilerl.tools.parser import THINK_TAGS, BodyCall, ToolParser

__all__ = ["Qwen3CoderParser"]


class Qwen3CoderParser(ToolParser):
    """Every value is text; the tool's schema says what it is (``"3"`` for an integer is 3).

    A value may hold the format's own tags (code that writes ``</parameter>``): as vLLM reads it,
    a ``</parameter>`` ends the value only where the next parameter, the ``</function>`` or the
    end of the call follows it, and a ``</function>`` ends the call only before another
    ``<function=`` or the end."""

    name = "qwen3_coder"
    call_start = "<tool_call>"
    call_end = "</tool_call>"
    reasoning = THINK_TAGS

    def read_body(self, body: str) -> list[BodyCall]:
        calls = []
        for name, inner, closed in _functions(body):
            arguments = dict(_parameters(inner))
            if not closed:
                calls.append(BodyCall(name or None, arguments, "unclosed", "the call has no </function>"))
            else:
                calls.append(BodyCall(name or None, arguments))
        return calls or [BodyCall(None, None, "missing_name", "the call has no <function=NAME>")]

    def format_call(self, name: str, arguments: dict[str, Any]) -> str:
        params = "".join(
            f"<parameter={key}>\n{value if isinstance(value, str) else json.dumps(value)}\n</parameter>\n"
            for key, value in arguments.items()
        )
        return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


_FUNCTION_OPEN, _FUNCTION_CLOSE = "<function=", "</function>"
_PARAMETER_OPEN, _PARAMETER_CLOSE = "<parameter=", "</parameter>"


def _functions(body: str) -> list[tuple[str, str, bool]]:
    """Each ``<function=NAME>inner</function>`` of a Qwen3-Coder call: (name, inner, closed)."""
    found = []
    at = body.find(_FUNCTION_OPEN)
    while at >= 0:
        head = body.find(">", at)
        if head < 0:
            found.append((body[at + len(_FUNCTION_OPEN) :].strip(), "", False))
            break
        name = body[at + len(_FUNCTION_OPEN) : head].strip()
        end = _closing(body, _FUNCTION_CLOSE, head + 1, _FUNCTION_FOLLOWS)
        if end < 0:
            found.append((name, body[head + 1 :], False))
            break
        found.append((name, body[head + 1 : end], True))
        at = body.find(_FUNCTION_OPEN, end + len(_FUNCTION_CLOSE))
    return found


def _parameters(inner: str) -> list[tuple[str, str]]:
    """Each ``<parameter=NAME>value</parameter>`` of one function; a value's newline margins are
    the template's, not the value's."""
    found = []
    marks: tuple[list[int], list[int]] | None = None
    close = inner.find(_PARAMETER_CLOSE)  # the next close, found once as the walk passes it
    at = inner.find(_PARAMETER_OPEN)
    while at >= 0:
        head = inner.find(">", at)
        if head < 0:
            break
        if 0 <= close <= head:
            close = inner.find(_PARAMETER_CLOSE, head + 1)
        end = close
        if end < 0 or inner.find(_LINE_PARAMETER, head + 1, end) >= 0 or not _PARAMETER_FOLLOWS.match(
            inner, end + len(_PARAMETER_CLOSE)
        ):  # not the plain case (its first close ends it): find every mark once, walk them
            if marks is None:
                marks = [m.start() for m in _CLOSES.finditer(inner)], [m.start() + 1 for m in _LINE_OPENS.finditer(inner)]
            end = _value_end(inner, head + 1, *marks)
        if end < 0:  # no close: the value runs to the next parameter on a line of its own
            nxt = inner.find(_LINE_PARAMETER, head + 1)
            end = nxt + 1 if nxt >= 0 else len(inner)
            after = end
        else:
            after = end + len(_PARAMETER_CLOSE)
        value = inner[head + 1 : end]
        value = value[1:] if value.startswith("\n") else value
        found.append((inner[at + len(_PARAMETER_OPEN) : head].strip(), value[:-1] if value.endswith("\n") else value))
        at = inner.find(_PARAMETER_OPEN, after)
    return found


def _value_end(inner: str, start: int, closes: list[int], opens: list[int]) -> int:
    """Where a parameter's value ends: the first ``</parameter>`` followed by the next parameter
    or the end, past the pairs a value holds (a ``<parameter=`` on a line of its own and its
    close, nested at most ``_MAX_NESTED`` deep); -1 when its close is missing. ``closes`` and
    ``opens`` are where every close and line-opening parameter are (found once per function)."""
    depth, at = 0, start
    c, o = bisect_left(closes, at), bisect_left(opens, at)
    while c < len(closes):
        if o < len(opens) and opens[o] < closes[c]:
            depth += 1
            if depth > _MAX_NESTED:
                return -1
            o += 1
            continue
        close = closes[c]
        c += 1
        o = bisect_left(opens, close, o)
        if depth:
            depth -= 1
        elif _PARAMETER_FOLLOWS.match(inner, close + len(_PARAMETER_CLOSE)):
            return close
    return -1


def _closing(text: str, close: str, start: int, follows: re.Pattern[str]) -> int:
    """Where ``close`` closes what opened before ``start``: the first one that ``follows``
    matches after (whitespace, then the end or the next opening); -1 when none is."""
    at = text.find(close, start)
    while at >= 0:
        if follows.match(text, at + len(close)):
            return at
        at = text.find(close, at + len(close))
    return -1


_MAX_NESTED = 8
_LINE_PARAMETER = "\n" + _PARAMETER_OPEN
_PARAMETER_FOLLOWS = re.compile(r"\s*(?:<parameter=|\Z)")
_CLOSES, _LINE_OPENS = re.compile(re.escape(_PARAMETER_CLOSE)), re.compile(re.escape(_LINE_PARAMETER))
_FUNCTION_FOLLOWS = re.compile(r"\s*(?:<function=|\Z)")
