"""Arguments checked against a tool's JSON Schema, and coerced where the schema says what a value is.

Models write every value as text in some formats (Qwen3-Coder's XML parameters), and often quote
numbers in JSON ones; a schema that says ``integer`` makes ``"3"`` the number 3. What cannot be
made to fit is a ``schema_violation`` naming the field, the value and what it needs. The subset
covered is what tool schemas use: ``type`` (or a list of types), ``properties``, ``required``,
``additionalProperties``, ``items``, ``enum``, ``const``, bounds, lengths, ``anyOf``/``oneOf``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

__all__ = ["check_arguments", "compile_check"]

_NO_VALUE = object()


class _Violation(Exception):
    pass


def check_arguments(schema: Mapping[str, Any], arguments: Any) -> tuple[Any, str | None]:
    """``(coerced arguments, None)``, or ``(arguments, what is wrong)``."""
    try:
        return _check(schema or {}, arguments, "arguments"), None
    except _Violation as exc:
        return arguments, str(exc)


_BOUNDS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength", "minItems", "maxItems"}
)
_CHOICES = ("anyOf", "oneOf")


_PLAIN_TYPES = {"string": str, "integer": int, "boolean": bool}
_PLAIN_KEYS = frozenset({"type", "description", "title"})


def compile_check(schema: Mapping[str, Any]) -> Any:
    """``check_arguments`` for one schema, with a fast path for the common tool schema (an object
    of plain string/integer/boolean properties): arguments already of the right types are
    accepted by a few dict lookups; anything else takes the full check."""
    plain = _plain_object(schema)
    if plain is None:
        return lambda arguments: check_arguments(schema, arguments)
    types, required, closed = plain

    def check(arguments: Any) -> tuple[Any, str | None]:
        if type(arguments) is dict and required.issubset(arguments) and (not closed or types.keys() >= arguments.keys()):
            for key, value in arguments.items():
                expected = types.get(key)
                if expected is not None and type(value) is not expected:
                    break
            else:
                return arguments, None
        return check_arguments(schema, arguments)

    return check


def _plain_object(schema: Mapping[str, Any]) -> tuple[dict[str, type], frozenset[str], bool] | None:
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        return None
    if set(schema) - {"type", "properties", "required", "additionalProperties", "title", "description"}:
        return None
    properties = schema.get("properties") or {}
    types: dict[str, type] = {}
    for name, spec in properties.items():
        if not isinstance(spec, Mapping) or set(spec) - _PLAIN_KEYS or spec.get("type") not in _PLAIN_TYPES:
            return None
        types[name] = _PLAIN_TYPES[spec["type"]]
    extra = schema.get("additionalProperties", True)
    if extra not in (True, False):
        return None
    return types, frozenset(schema.get("required") or ()), extra is False


def _check(schema: Mapping[str, Any], value: Any, where: str) -> Any:
    if not isinstance(schema, dict):
        if not isinstance(schema, Mapping):
            return value
        schema = dict(schema)
    for key in _CHOICES:
        options = schema.get(key)
        if options and isinstance(options, list):
            problems = []
            for option in options:
                try:
                    return _check(option, value, where)
                except _Violation as exc:
                    problems.append(str(exc))
            raise _Violation(f"{where} matches none of its {key} options ({'; '.join(problems)})")
    types = schema.get("type")
    if types is not None:
        value = _typed(types if isinstance(types, list) else [types], value, where)
    if "enum" in schema and value not in schema["enum"]:
        raise _Violation(f"{where} is {_short(value)}, not one of {schema['enum']!r}")
    if "const" in schema and value != schema["const"]:
        raise _Violation(f"{where} must be {schema['const']!r}, got {_short(value)}")
    if isinstance(value, dict):
        value = _check_object(schema, value, where)
    elif isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        value = [_check(schema["items"], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if not _BOUNDS.isdisjoint(schema):
        _check_bounds(schema, value, where)
    return value


def _check_object(schema: Mapping[str, Any], value: dict[str, Any], where: str) -> dict[str, Any]:
    properties = schema.get("properties") if isinstance(schema.get("properties"), Mapping) else {}
    missing = [name for name in schema.get("required") or () if name not in value]
    if missing:
        raise _Violation(f"{where} lacks required {', '.join(map(repr, missing))}")
    extra = schema.get("additionalProperties", True)
    checked = {}
    for key, item in value.items():
        if key in properties:
            checked[key] = _check(properties[key], item, where + "." + key)
        elif extra is False:
            allowed = ", ".join(map(repr, properties)) or "none"
            raise _Violation(f"{where} has unexpected {key!r} (allowed: {allowed})")
        else:
            checked[key] = _check(extra, item, f"{where}.{key}") if isinstance(extra, Mapping) else item
    return checked


def _typed(types: list[Any], value: Any, where: str) -> Any:
    if len(types) == 1:  # the common case: one type, already right
        kind = types[0]
        if kind == "integer" and type(value) is int or kind == "string" and type(value) is str:
            return value
    for kind in types:
        if _is(kind, value):
            return float(value) if kind == "number" and isinstance(value, int) else value
    for kind in types:
        coerced = _coerce(kind, value)
        if coerced is not _NO_VALUE:
            return coerced
    need = " or ".join(map(str, types))
    raise _Violation(f"{where} must be {need}, got {_short(value)}")


def _is(kind: Any, value: Any) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    return True  # a type we do not know is not ours to refuse


def _coerce(kind: Any, value: Any) -> Any:
    """``value`` as ``kind`` when it is that value written another way (``"3"``, ``3.0``, ``"true"``)."""
    if kind == "integer":
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value.strip())
            except ValueError:
                number = _number(value)
                return int(number) if number is not None and number.is_integer() else _NO_VALUE
    elif kind == "number" and isinstance(value, str):
        number = _number(value)
        return number if number is not None else _NO_VALUE
    elif kind == "boolean" and isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    elif kind == "null" and isinstance(value, str) and value.strip().lower() in ("null", "none"):
        return None
    elif kind in ("object", "array") and isinstance(value, str):
        try:
            decoded = json.loads(value)
        except ValueError:
            return _NO_VALUE
        return decoded if _is(kind, decoded) else _NO_VALUE
    elif kind == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return _NO_VALUE


def _number(text: str) -> float | None:
    try:
        number = float(text.strip())
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _check_bounds(schema: Mapping[str, Any], value: Any, where: str) -> None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, fails in (
            ("minimum", lambda b: value < b),
            ("maximum", lambda b: value > b),
            ("exclusiveMinimum", lambda b: value <= b),
            ("exclusiveMaximum", lambda b: value >= b),
        ):
            bound = schema.get(key)
            if isinstance(bound, (int, float)) and not isinstance(bound, bool) and fails(bound):
                raise _Violation(f"{where} is {value}, past its {key} {bound}")
    sized = len(value) if isinstance(value, (str, list)) else None
    if sized is not None:
        for key, fails in (("minLength", sized.__lt__), ("maxLength", sized.__gt__), ("minItems", sized.__lt__), ("maxItems", sized.__gt__)):
            bound = schema.get(key)
            if isinstance(bound, int) and fails(bound):
                raise _Violation(f"{where} has length {sized}, past its {key} {bound}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
