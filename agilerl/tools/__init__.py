"""Tool calls in each model family's own format: parsers (a registry kind), the calls they find,
and the check of each call against the tool's JSON Schema. See docs/tools.md."""

from agilerl.tools.auto import detect_family
from agilerl.tools.calls import (
    CALL_STATUSES,
    REFUSED_INFO,
    CallStatus,
    ParsedCompletion,
    ToolCall,
    ToolSet,
    function_tool,
)
from agilerl.tools.parser import BodyCall, ToolParser
from agilerl.tools.resolve import AUTO, resolve_tool_parser
from agilerl.tools.schema import check_arguments

__all__ = [
    "AUTO",
    "CALL_STATUSES",
    "REFUSED_INFO",
    "BodyCall",
    "CallStatus",
    "ParsedCompletion",
    "ToolCall",
    "ToolParser",
    "ToolSet",
    "check_arguments",
    "detect_family",
    "function_tool",
    "resolve_tool_parser",
]
