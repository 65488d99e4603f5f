"""A scored dataset's reward as weighted, named rubric entries (``rubrics:``) and the gates that
zero it (``rubric_gates:``), with the checks that tie gates to entries."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from agilerl.manifest.settings import ManifestModel

__all__ = ["RubricEntrySpec", "RubricGateSpec", "check_rubric_entries"]

_NAME_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"


class RubricEntrySpec(ManifestModel):
    """One named, weighted part of the reward (an item of ``rubrics:``)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        pattern=_NAME_PATTERN, description="The component's name: its metric is reward/<name>."
    )
    rubric: str = Field(
        min_length=1, description="Registered rubric name, 'module:attr' or 'path/to/file.py:attr'."
    )
    weight: float = Field(1.0, description="The reward is the sum of weight x score.")
    config: dict[str, Any] | None = Field(
        None,
        description="When given, the rubric is a factory called with these keywords (a judge's "
        "base_url, model, prompt, ...) and what it returns scores.",
    )


class RubricGateSpec(ManifestModel):
    """An item of ``rubric_gates:``: no credit unless a component reaches ``min``."""

    model_config = ConfigDict(extra="forbid")

    component: str = Field(min_length=1, description="An entry's name, or 'entry.part'.")
    min: float = Field(1.0, description="The component's score must be >= this.")
    zeroes: list[str] | None = Field(
        None, description="The entries zeroed when the gate fails; left out: the whole reward."
    )


def check_rubric_entries(names: list[str], gates: list[RubricGateSpec]) -> None:
    """Each rubric entry named once; each gate on an entry (or 'entry.part') that exists."""
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(
            f"rubrics: the name {duplicates[0]!r} is used twice; give each entry its own name."
        )
    for gate in gates:
        head = gate.component.split(".", 1)[0]
        if gate.component not in names and head not in names:
            raise ValueError(
                f"rubric_gates: {gate.component!r} is no rubric entry's name (the entries: "
                f"{', '.join(names)}); name an entry, or one of its parts as 'entry.part'."
            )
        unknown = [z for z in gate.zeroes or [] if z not in names]
        if unknown:
            raise ValueError(
                f"rubric_gates: the gate on {gate.component!r} zeroes {', '.join(map(repr, unknown))}, "
                f"which no entry is named (the entries: {', '.join(names)})."
            )
