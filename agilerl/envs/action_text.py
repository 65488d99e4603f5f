"""The model's text as an OpenEnv Action: which text fills which field type.

A ``str`` field takes the text as it is. Any other field reads it as JSON (``[0.5, -0.5]`` a
list, ``{"x": 1}`` a dict, ``3`` a number, ``true``), an Enum also by a member's name (``UP``,
``up``). An Action with no single text field, or one with more fields than the text fills, takes a
JSON object of its own fields (``{"name": "move", "arguments": {"x": 1}}``) as the whole Action.

Every reading is validated by the Action class itself, so its own validators and strictness
decide; the first reading that passes is the action. Text that fits none gets the error of the
reading its shape asked for, with pydantic's own message.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Iterator
from typing import Any

from agilerl.errors import OpenEnvAdapterError, validation_problems

__all__ = ["ActionText", "describe_type"]

_NO_JSON = object()


class ActionText:
    """Text -> one Action class, into ``field`` (None: the text must be a JSON object of the
    Action's fields); ``whole`` also takes such an object where a field is set."""

    def __init__(self, action_type: type, field: str | None, *, whole: bool = False) -> None:
        self.action_type = action_type
        self.field = field
        self.fields = [name for name in getattr(action_type, "model_fields", {}) if name != "metadata"]
        self.whole = whole or field is None
        info = action_type.model_fields.get(field) if field is not None else None  # type: ignore[attr-defined]
        self.annotation: Any = info.annotation if info is not None else None
        self.verbatim = self.annotation is str
        self.enums = list(_enums_in(self.annotation))

    def __call__(self, text: str) -> Any:
        """The Action the text makes, or an :class:`OpenEnvAdapterError` naming the field, the
        text and pydantic's message."""
        from pydantic import ValidationError

        parsed = _json(text)
        last_error: tuple[str, ValidationError] | None = None
        for reading, data in self._readings(text, parsed):
            try:
                return self.action_type.model_validate(data)  # type: ignore[attr-defined]
            except ValidationError as exc:
                last_error = (reading, exc)  # the later readings are the closer ones to the text
        if last_error is None:  # no reading applies: no text field, and not a JSON object of fields
            raise OpenEnvAdapterError(
                f"{self.action_type.__name__} has several fields ({', '.join(self.fields) or 'none'}) and none "
                f"takes the text alone: the text {text!r:.80} must be a JSON object of them "
                f"({{{', '.join(f'{json.dumps(n)}: ...' for n in self.fields[:3])}}}), or set action_field "
                "(the manifest's environment: section; --action-field for agilerl env check and agilerl serve)."
            )
        reading, exc = last_error
        problems = "; ".join(validation_problems(exc))
        if reading == "whole":
            how = f"the text is read as a JSON object of {self.action_type.__name__}'s fields"
        else:
            literal = typing.get_origin(self.annotation) is typing.Literal
            written = "" if self.verbatim or literal else ", written as JSON" + (" or a member's name" if self.enums else "")
            how = f"{self.field!r} takes {describe_type(self.annotation)}{written}"
        raise OpenEnvAdapterError(f"{self.action_type.__name__} rejected the text {text!r:.80}: {problems}; {how}.") from None

    def _readings(self, text: str, parsed: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        """The Action data the text may stand for, in order: a JSON object of the Action's own
        fields is the whole Action and nothing else; the text as it is; its JSON; an Enum's name."""
        if self.whole and isinstance(parsed, dict) and parsed and set(parsed) <= set(self.fields):
            yield "whole", parsed
            return
        if self.field is None:
            return
        yield "field", {self.field: text}
        if self.verbatim:
            return
        if parsed is not _NO_JSON:  # a list, a dict, a number, or a quoted '"UP"'
            yield "field", {self.field: parsed}
        for member in _members_named(self.enums, text.strip()):
            yield "field", {self.field: member}


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack: not a reading
        return _NO_JSON


def _enums_in(annotation: Any) -> Iterator[type[enum.Enum]]:
    """The Enum classes an annotation holds (``Move``, ``Move | None``, ``list[Move]`` excluded)."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        yield annotation
        return
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, typing.Annotated, types.UnionType):
        for arg in typing.get_args(annotation):
            yield from _enums_in(arg)


def _members_named(enums: list[type[enum.Enum]], name: str) -> Iterator[enum.Enum]:
    """Members called ``name``: exactly, else the one whose name matches ignoring case."""
    for klass in enums:
        members = klass.__members__
        if name in members:
            yield members[name]
            continue
        folded = [m for n, m in members.items() if n.lower() == name.lower()]
        if len(folded) == 1:
            yield folded[0]


def describe_type(annotation: Any) -> str:
    """A field's type as a reader writes it: ``list[float]``, ``one of UP, DOWN``, ``one of 'a', 'b'``."""
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return f"{annotation.__name__}: one of {', '.join(annotation.__members__)}"
    if typing.get_origin(annotation) is typing.Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(annotation))
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "")

