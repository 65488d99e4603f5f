"""What a parser finds in a completion: calls with a span and a status, the reasoning, the rest.

A call's status says why it cannot run (``invalid_json``, ``unclosed``, ``missing_name``,
``unknown_tool``, ``schema_violation``) or that it can (``ok``). The parser sets the first three;
``ToolSet.check`` the last two, against the tools the episode offers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from agilerl.errors import EnvProtocolError
from agilerl.tools.jsonvalue import depth_problem
from agilerl.tools.schema import compile_check, schema_problem

__all__ = ["CallStatus", "CALL_STATUSES", "REFUSED_INFO", "ToolCall", "ParsedCompletion", "ToolSet", "function_tool"]

REFUSED_INFO = "tool_refused"
"""The step info key of a call refused before the env's ``call_tool``: its status and error."""

CallStatus = Literal["ok", "invalid_json", "unclosed", "missing_name", "unknown_tool", "schema_violation"]
CALL_STATUSES: tuple[CallStatus, ...] = (
    "ok",
    "invalid_json",
    "unclosed",
    "missing_name",
    "unknown_tool",
    "schema_violation",
)


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote: ``span`` is ``[start, end)`` in the completion's token ids (or in
    its characters when only text was parsed, see ``ParsedCompletion.unit``)."""

    name: str | None
    arguments: dict[str, Any] | None
    status: CallStatus = "ok"
    span: tuple[int, int] = (0, 0)
    raw: str = ""
    error: str | None = None
    id: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def refusal(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The step result that answers a call which cannot run: its error in the ``tool`` role,
        no reward, the episode goes on; the info says why (``REFUSED_INFO``), so a harness that
        sent the call through a server that refused it records the status."""
        return f"Error: {self.error}", 0.0, False, False, {REFUSED_INFO: {"status": self.status, "error": self.error}}

    def as_record(self) -> dict[str, Any]:
        """A JSON-able record (the transcript, ``info["tool_calls"]``, metrics)."""
        return {
            "id": self.id,
            "name": self.name,
            "arguments": self.arguments,
            "status": self.status,
            "span": list(self.span),
            "error": self.error,
        }


@dataclass(frozen=True)
class ParsedCompletion:
    """A completion split into its parts: ``content`` (what a text env receives when there is no
    call; reasoning and call markup removed), ``reasoning`` (None when there is none) and ``calls``
    in the order they were written."""

    content: str
    reasoning: str | None = None
    calls: tuple[ToolCall, ...] = ()
    unit: Literal["token", "char"] = "token"
    """What the calls' spans count."""
    _text: Any = field(default="", repr=False, compare=False)

    def __init__(
        self,
        content: str,
        reasoning: str | None = None,
        calls: tuple[ToolCall, ...] = (),
        unit: Literal["token", "char"] = "token",
        text: Any = "",
    ) -> None:
        object.__setattr__(self, "content", content)
        object.__setattr__(self, "reasoning", reasoning)
        object.__setattr__(self, "calls", calls)
        object.__setattr__(self, "unit", unit)
        object.__setattr__(self, "_text", text)

    @property
    def text(self) -> str:
        """The whole completion as text (reasoning included): what an env that opted in receives;
        decoded only when asked for (``send_reasoning``)."""
        text = self._text
        if not isinstance(text, str):
            text = text.whole()
            object.__setattr__(self, "_text", text)
        return text

    def checked(self, tools: ToolSet | None) -> ParsedCompletion:
        """The same completion with each parsed call checked against ``tools``."""
        if tools is None or not self.calls:
            return self
        return ParsedCompletion(self.content, self.reasoning, tuple(tools.check(c) for c in self.calls), self.unit, self._text)


def function_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool spec as chat templates take it (``{"type": "function", "function": {...}}``) from an
    OpenAI-style spec, a bare function spec, or an MCP tool (``inputSchema``/``input_schema``)."""
    if tool.get("type") == "function" and isinstance(tool.get("function"), Mapping):
        return dict(tool)
    schema = tool.get("parameters") or tool.get("inputSchema") or tool.get("input_schema")
    function: dict[str, Any] = {"name": tool.get("name"), "description": tool.get("description") or ""}
    function["parameters"] = dict(schema) if isinstance(schema, Mapping) else {"type": "object", "properties": {}}
    return {"type": "function", "function": function}


class ToolSet:
    """The tools an episode offers, by name, each with its parameters' JSON Schema."""

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None) -> None:
        for i, tool in enumerate(tools or ()):
            _check_spec(tool, i)
        self.specs = [function_tool(t) for t in tools or ()]
        self.schemas: dict[str, dict[str, Any]] = {
            s["function"]["name"]: s["function"].get("parameters") or {} for s in self.specs
        }
        self._checks = {name: compile_check(schema) for name, schema in self.schemas.items()}

    def call(self, name: Any, arguments: Any) -> ToolCall:
        """One call made by name, as a client sends it (``agilerl serve``'s ``call_tool`` frame):
        checked as a parsed one is."""
        if not isinstance(name, str) or not name:
            return ToolCall(None, None, "missing_name", error=f"the call names no tool (got {name!r:.40})")
        return self.check(ToolCall(name, arguments))

    def __contains__(self, name: object) -> bool:
        return name in self.schemas

    def __bool__(self) -> bool:
        return bool(self.schemas)

    def check(self, call: ToolCall) -> ToolCall:
        """``call`` with status ``unknown_tool`` or ``schema_violation`` where it earns one, and
        its arguments coerced where the schema says so (``"3"`` for an integer is 3)."""
        if call.status != "ok":
            return call
        if call.name not in self.schemas:
            known = ", ".join(sorted(self.schemas)) or "none"
            return replace(call, status="unknown_tool", error=f"unknown tool {call.name!r}; the tools are: {known}")
        if not isinstance(call.arguments, (dict, type(None))):
            error = f"arguments must be a JSON object, got {type(call.arguments).__name__}"
            return replace(call, status="invalid_json", arguments=None, error=error)
        if (problem := depth_problem(call.arguments)) is not None:
            return replace(call, status="invalid_json", arguments=None, error=problem)
        arguments, problem = self._checks[call.name](call.arguments or {})
        if problem is not None:
            return replace(call, status="schema_violation", error=f"{call.name}: {problem}")
        if arguments == call.arguments:
            return call
        return ToolCall(call.name, arguments, call.status, call.span, call.raw, call.error, call.id)


def _check_spec(tool: Any, index: int) -> None:
    """Refuse a tool whose spec the checker cannot read, naming the tool and the keyword."""
    if not isinstance(tool, Mapping):
        raise EnvProtocolError(f"tools[{index}] must be a tool spec (an object), got {type(tool).__name__}")
    function = tool.get("function") if tool.get("type") == "function" else tool
    if not isinstance(function, Mapping):
        raise EnvProtocolError(f"tools[{index}].function must be an object, got {type(function).__name__}")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise EnvProtocolError(f"tools[{index}] has no name (a non-empty string), got {name!r:.40}")
    for key in ("parameters", "inputSchema", "input_schema"):
        if function.get(key) is not None:
            problem = schema_problem(function[key], key)
            if problem is not None:
                raise EnvProtocolError(
                    f"tool {name!r}: {problem}. Its JSON Schema cannot check the model's arguments: fix the "
                    "env's tools (docs/tools.md)"
                )
            break
