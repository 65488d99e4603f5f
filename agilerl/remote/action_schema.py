"""The model's text as a served env's Action, read by the Action's JSON Schema (``GET /schema``).

Our server reads a text into any Action field itself (``envs/action_text.py``). OpenEnv's own
server validates the fields as sent, so a ``list[float]`` field given ``"[0.5, -0.5]"`` fails
there. The client therefore fills the fields by the same rules, from the schema the server
publishes:

- a ``string`` field, or one whose schema says nothing, takes the text as it is (a string enum
  also takes a value written in another case, or quoted as JSON);
- any other field takes the text read as JSON (``[0.5, -0.5]``, ``{"x": 1}``, ``3``, ``true``);
- an Action without the field takes a JSON object of its own fields as the whole Action
  (``{"throttle": 0.5}``, ``{"name": "move", "arguments": {...}}``).

Text that fits no reading goes as it is, so the server's own validation error names the problem.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["ActionFields"]

_NOT_JSON = object()


class ActionFields:
    """How a text fills ``field`` of the Action that ``schema`` (``/schema``'s ``action``) describes."""

    def __init__(self, schema: dict[str, Any], field: str) -> None:
        self.field = field
        properties = schema.get("properties")
        self.known = isinstance(properties, dict)  # a schema of named fields (else: send the text as is)
        self.has_field = self.known and field in properties
        types: set[str] = set()
        values: list[Any] = []
        if self.has_field:
            defs = schema.get("$defs") or schema.get("definitions") or {}
            _collect(properties[field], defs if isinstance(defs, dict) else {}, types, values, depth=0)
        self.verbatim = not types or "string" in types
        self.choices = [v for v in values if isinstance(v, str)]

    def data(self, text: str) -> dict[str, Any]:
        """The step's ``data`` for ``text``."""
        if not self.known:
            return {self.field: text}
        if not self.has_field:
            value = _json(text)
            return value if isinstance(value, dict) else {self.field: text}
        if self.verbatim:
            return {self.field: self._choice(text) if self.choices else text}
        value = _json(text)
        return {self.field: text if value is _NOT_JSON else value}

    def _choice(self, text: str) -> str:
        quoted = _json(text)
        for candidate in (text, quoted if isinstance(quoted, str) else None):
            if candidate is None:
                continue
            found = next((c for c in self.choices if c.lower() == candidate.strip().lower()), None)
            if found is not None:
                return found
        return text


def _collect(schema: Any, defs: dict[str, Any], types: set[str], values: list[Any], depth: int) -> None:
    """The JSON types and enum values a field's schema allows, through ``$ref`` and unions."""
    if not isinstance(schema, dict) or depth > 8:
        return
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.rsplit("/", 1)[-1] in defs:
        _collect(defs[ref.rsplit("/", 1)[-1]], defs, types, values, depth + 1)
    kind = schema.get("type")
    types.update(k for k in ([kind] if isinstance(kind, str) else kind or []) if isinstance(k, str) and k != "null")
    if isinstance(schema.get("enum"), list):
        values.extend(schema["enum"])
        types.update(_json_type(v) for v in schema["enum"] if v is not None)
    if "const" in schema:
        values.append(schema["const"])
        if schema["const"] is not None:
            types.add(_json_type(schema["const"]))
    for key in ("anyOf", "oneOf", "allOf"):
        for part in schema.get(key) or []:
            _collect(part, defs, types, values, depth + 1)


def _json_type(value: Any) -> str:
    return "string" if isinstance(value, str) else "value"


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _NOT_JSON
