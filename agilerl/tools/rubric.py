"""The built-in ``tool_format`` rubric: pays for well-formed tool calls."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["tool_format"]


def tool_format(completion: str, info: Mapping[str, Any] | None = None) -> float:
    """The share of the completion's tool calls that could run (status ``ok``); 0.0 without a call.

    Reads the calls the harness parsed (``info["tool_calls"]``) when the step has them; else
    parses ``completion`` as text with ``info["tool_parser"]`` (default ``hermes``), checked
    against ``info["tools"]`` when given."""
    records = (info or {}).get("tool_calls")
    if isinstance(records, list):
        statuses = [r.get("status") for r in records if isinstance(r, Mapping)]
    else:
        from agilerl.tools.calls import ToolSet
        from agilerl.tools.resolve import resolve_tool_parser

        parser = resolve_tool_parser((info or {}).get("tool_parser") or "hermes", None)
        tools = (info or {}).get("tools")
        parsed = parser.parse_text(completion, ToolSet(tools) if tools is not None else None)
        statuses = [call.status for call in parsed.calls]
    return sum(status == "ok" for status in statuses) / len(statuses) if statuses else 0.0
