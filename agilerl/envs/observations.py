"""Turning an observation (a JSON object, remote or an in-process OpenEnv one) into the text the model reads.

Three ways, in order: ``observation_field`` (a dotted path), ``observation_processor`` (a
function of the observation dict), or the default rules of ``default_text``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agilerl.errors import ObservationError

ObservationProcessor = Callable[[dict[str, Any]], str]

TEXT_FIELDS = ("text", "prompt", "message", "observation", "stdout", "output", "content", "response")
"""Fields the default rules read, first present string wins."""

_NOT_CONTENT = frozenset({"metadata", "done", "reward", "truncated"})


def text_from_field(observation: dict[str, Any], path: str) -> str:
    """The value at a dotted path (``result.content.0.text``; integers index lists), as text."""
    value: Any = observation
    for part in path.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            raise ObservationError(
                f"observation_field {path!r}: no {part!r} in the observation "
                f"(its fields: {', '.join(map(str, observation)) or 'none'}). "
                "Fix observation_field, or use an observation_processor."
            )
    return value if isinstance(value, str) else _compact_json(value)


def tool_result_text(observation: dict[str, Any]) -> str | None:
    """The text content of an MCP tool result (``CallToolObservation``), or None if not one."""
    error = observation.get("error")
    if isinstance(error, dict) and error.get("message"):
        return f"Error: {error['message']}"
    result = observation.get("result")
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        content = result.get("content")
        if isinstance(content, list):
            texts = [c["text"] for c in content if isinstance(c, dict) and isinstance(c.get("text"), str)]
            if texts:
                return "\n".join(texts)
        if "data" in result and result["data"] is not None:
            data = result["data"]
            return data if isinstance(data, str) else _compact_json(data)
    return None


def default_text(observation: dict[str, Any]) -> str:
    """The default rules, in order:

    1. an MCP tool result: its text content (or ``Error: <message>``);
    2. the first of ``TEXT_FIELDS`` holding a string;
    3. the one string field, when there is exactly one;
    4. ``""`` when the observation holds nothing but metadata/done/reward/truncated.
    Anything else is ambiguous: an error asks for ``observation_field`` or a processor.
    """
    if "tool_name" in observation or "result" in observation:
        text = tool_result_text(observation)
        if text is not None:
            return text
    for name in TEXT_FIELDS:
        value = observation.get(name)
        if isinstance(value, str):
            return value
    content = {k: v for k, v in observation.items() if k not in _NOT_CONTENT}
    strings = [v for v in content.values() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    if not content:
        return ""
    raise ObservationError(
        f"cannot tell which field of the remote observation is its text (fields: "
        f"{', '.join(map(str, content))}); set observation_field (e.g. "
        f"{next(iter(content))!r}) or observation_processor in the manifest."
    )


def make_observation_reader(
    observation_field: str | None = None,
    observation_processor: str | ObservationProcessor | None = None,
    *,
    base_dir: str | Path | None = None,
) -> ObservationProcessor:
    """The one function a client uses to read observations, from the manifest's choices."""
    if observation_field and observation_processor:
        raise ObservationError(
            "observation_field and observation_processor exclude each other; keep one."
        )
    if observation_field:
        path = observation_field
        return lambda observation: text_from_field(observation, path)
    if observation_processor is None:
        return default_text
    if isinstance(observation_processor, str):
        from agilerl.registry import resolve

        processor = resolve("processor", observation_processor, base_dir=base_dir)
    else:
        processor = observation_processor
    if not callable(processor):
        raise ObservationError(
            f"observation_processor {observation_processor!r} is a {type(processor).__name__}, "
            "not a function; name a function that takes the observation dict and returns str."
        )
    return _checked(processor, observation_processor)


def process_observation(
    observation: dict[str, Any],
    observation_field: str | None = None,
    observation_processor: str | ObservationProcessor | None = None,
    *,
    base_dir: str | Path | None = None,
) -> str:
    """The prompt text of one observation payload, read exactly as ``RemoteEnvClient`` reads it.

    Replaces AgileRL's ``TokenObservationWrapper``: text stays text, the harness tokenizes it.
    """
    return make_observation_reader(observation_field, observation_processor, base_dir=base_dir)(observation)


def _checked(processor: ObservationProcessor, ref: object) -> ObservationProcessor:
    def read(observation: dict[str, Any]) -> str:
        text = processor(observation)
        if not isinstance(text, str):
            raise ObservationError(
                f"observation_processor {ref!r} returned {type(text).__name__}; it must return str."
            )
        return text

    return read


def _compact_json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
