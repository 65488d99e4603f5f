"""Turning an observation (a JSON object, remote or an in-process OpenEnv one) into the text the model reads.

Three ways, in order: ``observation_field`` (a dotted path), ``observation_processor`` (a
function of the observation dict), or the default rules of ``default_text``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from agilerl.errors import EnvProtocolError, ObservationError

__all__ = [
    "ObservationProcessor",
    "TEXT_FIELDS",
    "text_from_field",
    "tool_result_text",
    "execution_text",
    "messages_text",
    "fields_text",
    "default_text",
    "make_observation_reader",
    "process_observation",
]

ObservationProcessor = Callable[[dict[str, Any]], str]

TEXT_FIELDS = ("text", "prompt", "message", "observation", "output", "content", "response")
"""Fields that are obviously the text (also as a name's last part: ``echoed_message``)."""

_NOT_CONTENT = frozenset({"metadata", "done", "reward", "truncated", "images"})


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


def execution_text(observation: dict[str, Any]) -> str | None:
    """What running code printed and raised (OpenEnv's coding env: ``stdout``/``stderr``/
    ``exit_code``; its REPL env: the same under ``result``, with ``exception``), or None if the
    observation is not a code run. stdout alone reads as itself; anything else is labelled."""
    run = observation.get("result") if isinstance(observation.get("result"), dict) else observation
    if not isinstance(run.get("stdout"), str) and not isinstance(run.get("stderr"), str):
        return None
    parts = [run["stdout"]] if run.get("stdout") else []
    if isinstance(run.get("stderr"), str) and run["stderr"]:
        parts.append(f"stderr:\n{run['stderr']}")
    if run.get("exception"):
        parts.append(f"exception: {run['exception']}")
    exit_code = run.get("exit_code")
    if isinstance(exit_code, int) and not isinstance(exit_code, bool) and exit_code != 0:
        parts.append(f"exit code: {exit_code}")
    if len(parts) == 1 and run.get("stdout"):
        return str(run["stdout"])
    return "\n".join(part.rstrip("\n") for part in parts)


def messages_text(observation: dict[str, Any]) -> str | None:
    """The contents of a non-empty chat-like ``messages`` list, one per line (OpenEnv's
    TextArena env: the game's feedback lives there, its ``prompt`` names the game after turn 1)."""
    messages = observation.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    if not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
        return None
    return "\n".join(m["content"] for m in messages)


def fields_text(content: dict[str, Any]) -> str:
    """Every field that holds something (not None, not ""), one ``name: value`` line each (a grid
    one row a line), so the model sees what the env said when no field is obviously the text."""
    lines = []
    for name, value in content.items():
        if value is None or value == "":
            continue
        if isinstance(value, str):
            lines.append(f"{name}:\n{value}" if "\n" in value else f"{name}: {value}")
        elif isinstance(value, list) and value and all(isinstance(row, list) for row in value):
            lines.append(f"{name}:")
            lines.extend(_compact_json(row) for row in value)
        else:
            lines.append(f"{name}: {_compact_json(value)}")
    return "\n".join(lines)


def default_text(observation: dict[str, Any]) -> str:
    """The default rules, in order (the first that applies wins):

    1. an MCP tool result (``tool_name``): its text content, or ``Error: <message>``;
    2. a code run (``stdout``/``stderr``, at the top or under ``result``): stdout, then the
       labelled stderr, exception and a non-zero exit code;
    3. a non-empty chat-like ``messages`` list: its contents, one per line;
    4. the first field of ``TEXT_FIELDS``, or named ``*_<one of them>``, that holds a string;
    5. the one field, when the observation holds a single string;
    6. ``""`` when it holds nothing but metadata/done/reward/truncated;
    7. otherwise every field, compactly (``fields_text``): never one field that hides the rest.
    """
    if "tool_name" in observation:
        text = tool_result_text(observation)
        if text is not None:
            return text
    for rule in (execution_text, messages_text):
        text = rule(observation)
        if text is not None:
            return text
    for name in TEXT_FIELDS:
        if isinstance(observation.get(name), str):
            return str(observation[name])
    for name, value in observation.items():
        if isinstance(value, str) and str(name).rpartition("_")[2] in TEXT_FIELDS:
            return value
    content = {k: v for k, v in observation.items() if k not in _NOT_CONTENT and v is not None}
    if len(content) == 1 and isinstance(next(iter(content.values())), str):
        return str(next(iter(content.values())))
    return fields_text(content)


def make_observation_reader(
    observation_field: str | None = None,
    observation_processor: str | ObservationProcessor | None = None,
    *,
    base_dir: str | Path | None = None,
    image_field: str | None = None,
) -> ObservationProcessor:
    """The one function a client uses to read observations, from the manifest's choices: text
    (``str``), or text and images (an ``ImageObservation``) when the payload carries images
    (our server's ``images``, or the env's own ``image_field``; see ``agilerl.envs.image_fields``)."""
    text_reader = _text_reader(observation_field, observation_processor, base_dir=base_dir)
    from agilerl.envs.image_fields import with_images_reader

    return with_images_reader(text_reader, image_field)


def _text_reader(
    observation_field: str | None,
    observation_processor: str | ObservationProcessor | None,
    *,
    base_dir: str | Path | None,
) -> ObservationProcessor:
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
    def read(observation: dict[str, Any]) -> Any:
        text = processor(observation)
        if not isinstance(text, str):
            if not isinstance(text, dict):
                raise ObservationError(
                    f"observation_processor {ref!r} returned {type(text).__name__}; it must return str "
                    "(or a mapping with 'text' and 'image'/'images')."
                )
            from agilerl.images import observation_from

            try:  # a processor may return the protocol's mapping: text and image(s)
                return observation_from(text, f"observation_processor {ref!r}")
            except EnvProtocolError as exc:
                raise ObservationError(str(exc)) from None
        return text

    return read


def _compact_json(value: Any) -> str:
    import json

    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
