"""Arguments checked against a tool's JSON Schema, and coerced where the schema says what a value is.

Models write every value as text in some formats (Qwen3-Coder's XML parameters), and often quote
numbers in JSON ones; a schema that says ``integer`` makes ``"3"`` the number 3. What cannot be
made to fit is a ``schema_violation`` naming the field, the value and what it needs. The subset
covered is what tool schemas use: ``type`` (or a list of types), ``properties``, ``required``,
``additionalProperties``, ``items``, ``enum``, ``const``, bounds, lengths, ``anyOf``/``oneOf``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from agilerl.tools.jsonvalue import loads

__all__ = ["check_arguments", "compile_check", "schema_problem"]

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


_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf")
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions")
_SCHEMA_ONE = ("additionalProperties", "items", "not", "contains", "propertyNames")
_COUNTS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties")


def schema_problem(schema: Any, where: str = "parameters", depth: int = 0) -> str | None:
    """The first keyword of ``schema`` that is not what JSON Schema says it is (``required: 5``,
    ``properties`` as a list, ``enum: 5``), named by its path; None when the keywords the checker
    reads are well-formed. A schema may be ``true``/``false``; unknown keywords are not ours."""
    if isinstance(schema, bool):
        return None
    if not isinstance(schema, Mapping):
        return f"{where} must be a JSON Schema object, got {_short(schema)}"
    if depth > _SCHEMA_DEPTH:
        return f"{where} nests deeper than {_SCHEMA_DEPTH} levels"
    kinds = schema.get("type")
    if "type" in schema and not (
        isinstance(kinds, str) or isinstance(kinds, list) and kinds and all(isinstance(k, str) for k in kinds)
    ):
        return f"{where}.type must be a type name or a list of them, got {_short(kinds)}"
    required = schema.get("required")
    if "required" in schema and not (isinstance(required, list) and all(isinstance(r, str) for r in required)):
        return f"{where}.required must be a list of property names, got {_short(required)}"
    if "enum" in schema and not isinstance(schema["enum"], list):
        return f"{where}.enum must be a list of the allowed values, got {_short(schema['enum'])}"
    for key in _BOUNDS.difference(_COUNTS):
        bound = schema.get(key)
        if key in schema and (isinstance(bound, bool) and not key.startswith("exclusive") or not isinstance(bound, (int, float))):
            return f"{where}.{key} must be a number, got {_short(bound)}"
    for key in _COUNTS:
        count = schema.get(key)
        if key in schema and (type(count) is not int or count < 0):
            return f"{where}.{key} must be a whole number >= 0, got {_short(count)}"
    for key in _SCHEMA_MAPS:
        if key in schema:
            members = schema[key]
            if not isinstance(members, Mapping):
                return f"{where}.{key} must be an object of schemas by name, got {_short(members)}"
            for name, member in members.items():
                if (problem := schema_problem(member, f"{where}.{key}.{name}", depth + 1)) is not None:
                    return problem
    for key in _SCHEMA_LISTS:
        if key in schema:
            options = schema[key]
            if not isinstance(options, list) or not options:
                return f"{where}.{key} must be a non-empty list of schemas, got {_short(options)}"
            for i, option in enumerate(options):
                if (problem := schema_problem(option, f"{where}.{key}[{i}]", depth + 1)) is not None:
                    return problem
    for key in _SCHEMA_ONE:
        if key in schema:
            members = schema[key] if key == "items" and isinstance(schema[key], list) else [schema[key]]
            for i, member in enumerate(members):
                path = f"{where}.{key}" + (f"[{i}]" if len(members) > 1 or members is schema[key] else "")
                if (problem := schema_problem(member, path, depth + 1)) is not None:
                    return problem
    return None


_SCHEMA_DEPTH = 32
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


def _kind(name: Any) -> Any:
    """A type name as JSON Schema spells it. Tool schemas written for code name types as their
    language does (``float``, ``double``, ``int64``, ``bool``, ``str``, ``list``, ``dict``); Qwen's
    reference parser and vLLM's read those (any ``num*`` or ``float*`` a number, ``int*``,
    ``uint*``, ``long*``, ``short*``, ``unsigned*`` an integer), and so does the check."""
    if not isinstance(name, str) or name in _JSON_TYPES:
        return name
    low = name.strip().lower()
    if low in _JSON_TYPES:
        return low
    if low.startswith(("num", "float", "double")):
        return "number"
    if low.startswith(("int", "uint", "long", "short", "unsigned")):
        return "integer"
    if low in ("bool", "binary"):
        return "boolean"
    if low in ("str", "text", "varchar", "char", "enum"):
        return "string"
    if low == "arr" or low.startswith("list"):
        return "array"
    if low.startswith("dict"):
        return "object"
    return name


_JSON_TYPES = frozenset({"string", "integer", "number", "boolean", "null", "object", "array"})


def _typed(types: list[Any], value: Any, where: str) -> Any:
    if len(types) == 1:  # the common case: one type, already right
        kind = types[0]
        if kind == "integer" and type(value) is int or kind == "string" and type(value) is str:
            return value
    if any(type(kind) is not str or kind not in _JSON_TYPES for kind in types):
        types = [_kind(kind) for kind in types]
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
        decoded, problem = loads(value)
        return decoded if problem is None and _is(kind, decoded) else _NO_VALUE
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
