"""Built-in observation processors: functions from a remote observation dict to the model's text.

Name one in a manifest (``observation_processor: json``) when the default rules do not fit.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["json_text", "code_output"]


def json_text(observation: dict[str, Any]) -> str:
    """The whole observation (minus metadata) as compact JSON: for structured observations."""
    content = {k: v for k, v in observation.items() if k != "metadata"}
    return json.dumps(content, ensure_ascii=False, separators=(",", ":"), default=str)


def code_output(observation: dict[str, Any]) -> str:
    """A code-execution result (``stdout``, ``stderr``, ``exit_code``) as one readable block."""
    parts = []
    stdout = observation.get("stdout") or ""
    stderr = observation.get("stderr") or ""
    if stdout:
        parts.append(f"stdout:\n{stdout.rstrip()}")
    if stderr:
        parts.append(f"stderr:\n{stderr.rstrip()}")
    if "exit_code" in observation:
        parts.append(f"exit code: {observation['exit_code']}")
    return "\n".join(parts) or "(no output)"
