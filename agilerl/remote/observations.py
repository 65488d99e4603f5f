"""Re-exports :mod:`agilerl.envs.observations`, where observation reading lives (the in-process
OpenEnv adapter reads observations the same way the remote client does)."""

from __future__ import annotations

from agilerl.envs.observations import (
    TEXT_FIELDS,
    ObservationProcessor,
    default_text,
    make_observation_reader,
    process_observation,
    text_from_field,
    tool_result_text,
)

__all__ = [
    "TEXT_FIELDS",
    "ObservationProcessor",
    "default_text",
    "make_observation_reader",
    "process_observation",
    "text_from_field",
    "tool_result_text",
]
