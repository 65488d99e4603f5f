"""A ``tool_parser`` setting (a registered name, ``auto``, ``module:attr``, a class or a parser)
turned into a parser for one tokenizer."""

from __future__ import annotations

from typing import Any

from agilerl.errors import InvalidArgument
from agilerl.tools.auto import detect_family
from agilerl.tools.parser import ToolParser

__all__ = ["AUTO", "resolve_tool_parser"]

AUTO = "auto"


def resolve_tool_parser(setting: Any, tokenizer: Any, *, base_dir: Any = None) -> ToolParser:
    """The parser ``setting`` names, built for ``tokenizer``; ``auto`` picks the family from the
    tokenizer, and an error lists the registered parsers when it cannot."""
    if isinstance(setting, ToolParser):
        return setting
    own = getattr(tokenizer, "tool_call_parser", None)
    if isinstance(setting, str) and callable(own):
        # an OpenAI-compatible endpoint parses the model's format itself (vLLM's
        # --tool-call-parser): its structured tool_calls are read, whichever family is named
        return own()
    if isinstance(setting, str):
        from agilerl.registry import get_registry
        from agilerl.registry.resolver import resolve

        if setting == AUTO:
            family = detect_family(tokenizer)
            if family is None:
                choices = ", ".join(get_registry().names("tool_parser"))
                raise InvalidArgument(
                    "tool_parser 'auto' cannot tell which format this tokenizer's model writes tool "
                    "calls in (no known special tokens or chat-template markers); set "
                    f"environment.tool_parser to one of: {choices}"
                )
            setting = family
        target = resolve("tool_parser", setting, base_dir=base_dir)
    else:
        target = setting
    parser = target(tokenizer) if isinstance(target, type) or not isinstance(target, ToolParser) else target
    if not isinstance(parser, ToolParser):
        raise InvalidArgument(
            f"tool_parser {setting!r} gave {type(parser).__name__}, not a ToolParser "
            "(agilerl.tools.ToolParser: a class built with the tokenizer)"
        )
    return parser
