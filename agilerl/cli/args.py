"""Argument types shared by several commands."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

__all__ = ["json_object", "positive_float", "positive_int"]


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
