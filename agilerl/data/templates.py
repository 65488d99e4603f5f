"""``prompt_template``: chat pieces such as ``system_0``, ``user_1``, ``assistant_2`` with
``{column}`` placeholders, rendered per row into chat messages.

Checked against the table's columns when the dataset loads, so a typo fails before training.
"""

from __future__ import annotations

import re
import string
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agilerl.errors import TemplateError

__all__ = ["Message", "PromptTemplate", "user_text", "with_system_prompt"]

_PIECE = re.compile(r"^(system|user|assistant)_(\d+)$")

Message = dict[str, str]


@dataclass(frozen=True)
class PromptTemplate:
    """Ordered ``(role, text)`` pieces; ``render(row)`` fills each ``{column}``."""

    pieces: tuple[tuple[str, str], ...]
    label: str = "prompt_template"  # how errors name this template

    @classmethod
    def parse(cls, template: Mapping[str, str]) -> PromptTemplate:
        """Order ``<role>_<index>`` keys by index; reject unknown keys and repeated indexes."""
        if not template:
            raise TemplateError("prompt_template is empty; give at least one 'user_<n>' piece.")
        indexed: dict[int, tuple[str, str]] = {}
        for key, text in template.items():
            match = _PIECE.match(str(key))
            if match is None:
                raise TemplateError(
                    f"prompt_template: key {key!r} is not '<role>_<index>' with role system, "
                    "user or assistant (e.g. system_0, user_1)."
                )
            role, index = match.group(1), int(match.group(2))
            if index in indexed:
                raise TemplateError(
                    f"prompt_template: {key!r} and '{indexed[index][0]}_{index}' share index "
                    f"{index}; give each piece its own index."
                )
            if not isinstance(text, str):
                raise TemplateError(f"prompt_template: {key!r} must be a string, got {text!r}.")
            indexed[index] = (role, text)
        pieces = tuple(indexed[i] for i in sorted(indexed))
        if pieces[-1][0] != "user":
            raise TemplateError(
                "prompt_template: the last piece (highest index) must be a 'user_<n>' piece: "
                f"it is the message the model answers (got {pieces[-1][0]!r})."
            )
        template_obj = cls(pieces)
        template_obj.placeholders()  # reject malformed placeholders now
        return template_obj

    @classmethod
    def single_user(cls, column: str) -> PromptTemplate:
        """The default: the row's ``column`` as the one user message."""
        return cls((("user", "{" + column + "}"),), label="the default prompt (no prompt_template)")

    def placeholders(self) -> list[str]:
        """The column names the pieces use, in order of first use."""
        names: list[str] = []
        for role, text in self.pieces:
            try:
                fields = [f for _, f, _, _ in string.Formatter().parse(text) if f is not None]
            except ValueError as exc:
                raise TemplateError(
                    f"{self.label} {role} piece {text!r}: {exc}; write literal braces as "
                    "'{{' and '}}'."
                ) from None
            for field in fields:
                if not field.isidentifier():
                    raise TemplateError(
                        f"{self.label} {role} piece: placeholder {{{field}}} must be a plain "
                        "column name (no indexing, attributes or empty braces)."
                    )
                if field not in names:
                    names.append(field)
        return names

    def check_columns(self, columns: Iterable[str]) -> None:
        """Fail naming each placeholder without a column, and the columns that exist."""
        existing = list(columns)
        missing = [name for name in self.placeholders() if name not in existing]
        if missing:
            raise TemplateError(
                f"{self.label} uses {', '.join('{' + m + '}' for m in missing)} but the "
                f"dataset has no such column; its columns are: {', '.join(existing)}. Rename a "
                "column with 'columns: {source: " + missing[0] + "}' or fix the template."
            )

    def render(self, row: Mapping[str, Any]) -> list[Message]:
        """The chat messages for one row."""
        return [{"role": role, "content": text.format_map(row)} for role, text in self.pieces]


def user_text(messages: list[Message]) -> str:
    """The user-facing prompt: the last user message's content."""
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def with_system_prompt(messages: list[Message], system_prompt: str | None) -> list[Message]:
    """Prepend ``system_prompt`` unless it is empty or the template has its own system piece."""
    if not system_prompt or any(m["role"] == "system" for m in messages):
        return messages
    return [{"role": "system", "content": system_prompt}, *messages]
