"""Argument types shared by several commands."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

__all__ = [
    "json_object", "positive_float", "positive_int", "new_tokens", "ADAPTER_FLAGS", "add_adapter_flags",
    "adapter_options",
]


def json_object(text: str) -> dict[str, Any]:
    """``--env-config`` and friends: a JSON object, or a usage error that says what is wrong."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _above_zero(convert: Callable[[str], float], noun: str) -> Callable[[str], Any]:
    """An argument type for amounts that must be above zero: a usage error otherwise."""

    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun}") from None
        if not value > 0:  # also rejects nan
            raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
        return value

    return parse


positive_float = _above_zero(float, "a number")
positive_int = _above_zero(int, "a whole number")


def new_tokens(text: str) -> int:
    """``--max-new-tokens``: from 1 to the manifest's own bound (``MAX_NEW_TOKENS``), read only
    when the flag is given, so ``--help`` never imports the manifest (and pydantic)."""
    from agilerl.manifest.settings import MAX_NEW_TOKENS

    value = positive_int(text)
    if value > MAX_NEW_TOKENS:
        raise argparse.ArgumentTypeError(
            f"must be at most {MAX_NEW_TOKENS} (training.max_new_tokens' bound: no model's context "
            f"holds more), got {text}"
        )
    return value


ADAPTER_FLAGS = (
    ("action_field", "the Action field (or MCP tool argument) the text fills"),
    ("observation_field", "dotted path of the observation's text"),
    ("observation_processor", "a processor (registered, module:attr, file.py:attr) making the text"),
    ("image_field", "dotted path of the observation's image (screenshot, screen)"),
    ("mcp_tool", "an MCP env's tool each step calls"),
    ("action_type", "module:attr of the env's Action class, when nothing names it"),
)
"""An OpenEnv env's adapter options as flags (``--action-field`` ...): the manifest's environment
fields of the same names (``agilerl.envs.openenv_native.ADAPTER_OPTIONS``), for env check and serve."""


def add_adapter_flags(group: Any) -> None:
    """Add :data:`ADAPTER_FLAGS` to an argument group."""
    for option, meaning in ADAPTER_FLAGS:
        group.add_argument(f"--{option.replace('_', '-')}", dest=option, metavar="VALUE", help=meaning)


def adapter_options(args: argparse.Namespace) -> dict[str, Any]:
    """The adapter flags given on the command line."""
    return {option: getattr(args, option) for option, _ in ADAPTER_FLAGS if getattr(args, option, None) is not None}
