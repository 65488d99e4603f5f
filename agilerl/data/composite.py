"""A reward made of named, weighted rubrics, with gates: what ``environment.rubrics:`` builds.

    reward = sum(weight_i * score_i)   (an entry a failed gate zeroes counts 0)

Every entry's own score is a component (``name``); an entry that returns parts (a dict, a
``Reward``, an OpenEnv rubric's named children) adds them as ``name.part``. A gate zeroes the
whole reward, or the entries it names, unless a component reaches its threshold: "no credit for
format unless the answer is right". Entries that are async (judges) are awaited together, so a
sample waits for its slowest judge, not for the sum of them.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agilerl.data.reward import Reward, resolve_awaitable
from agilerl.data.rubric import Rubric, _as_reward
from agilerl.errors import EnvUnavailable, RubricError

__all__ = ["RubricEntry", "RubricGate", "CompositeRubric", "check_gate"]


@dataclass(frozen=True)
class RubricEntry:
    """One named part of the reward: a bound rubric and its weight."""

    name: str
    rubric: Rubric
    weight: float = 1.0


@dataclass(frozen=True)
class RubricGate:
    """Zero ``zeroes`` (entry names; empty: the whole reward) unless ``component`` >= ``min``."""

    component: str
    min: float = 1.0
    zeroes: tuple[str, ...] = ()


class CompositeRubric:
    """A weighted sum of named rubrics with gates; called like any rubric, it returns a ``Reward``.

    Build it from ``RubricEntry``/``RubricGate`` values (a manifest's ``rubrics:`` and
    ``rubric_gates:`` become exactly these); the checks here are the manifest's too, so a
    composite built in Python is refused for the same reasons with the same words.
    """

    def __init__(self, entries: Sequence[RubricEntry], gates: Sequence[RubricGate] = ()) -> None:
        if not entries:
            raise RubricError("a composite rubric needs at least one entry.")
        names = [e.name for e in entries]
        for name in names:
            if names.count(name) > 1:
                raise RubricError(f"rubrics: the name {name!r} is used twice; give each entry its own name.")
        for entry in entries:
            if not math.isfinite(entry.weight):
                raise RubricError(f"rubrics: entry {entry.name!r} has weight {entry.weight}; a weight is a finite number.")
        for gate in gates:
            check_gate(gate, names)
        self.entries = tuple(entries)
        self.gates = tuple(gates)
        self.__qualname__ = "composite(" + ", ".join(names) + ")"

    def check_columns(self, columns: Sequence[str]) -> None:
        """Every entry's ``answer``/``question`` columns exist (``Rubric.check_columns``)."""
        for entry in self.entries:
            entry.rubric.check_columns(columns)

    def __call__(self, **available: Any) -> Reward:
        """Score every entry (async ones together), apply the gates, weigh and sum."""
        raw = {e.name: self._call(e, available) for e in self.entries}
        if any(type(r) is not float and inspect.isawaitable(r) for r in raw.values()):
            raw = resolve_awaitable(_gather(raw))
        components: dict[str, float] = {}
        scores: dict[str, float] = {}
        for entry in self.entries:
            total, parts = _as_reward(raw[entry.name], entry.name, "this sample")
            scores[entry.name] = components[entry.name] = total
            components.update({f"{entry.name}.{part}": value for part, value in parts.items()})
        zeroed = self._zeroed(components) if self.gates else ()
        try:
            reward = math.fsum(e.weight * scores[e.name] for e in self.entries if e.name not in zeroed)
        except OverflowError:  # finite parts whose weighted sum is not
            raise RubricError(f"the weighted sum of {components} is past the largest float.") from None
        return Reward(reward, components)

    def _call(self, entry: RubricEntry, available: Mapping[str, Any]) -> Any:
        try:
            return entry.rubric.fn(**{k: available.get(k) for k in entry.rubric.keywords})
        except EnvUnavailable:
            raise
        except (Exception, SystemExit) as exc:  # sys.exit() in a rubric is its error, not the run's end
            raise RubricError(f"rubric entry {entry.name!r} raised {type(exc).__name__}: {exc}.") from exc

    def _zeroed(self, components: Mapping[str, float]) -> set[str]:
        """The entries the failed gates zero (all of them for a gate naming none)."""
        zeroed: set[str] = set()
        for gate in self.gates:
            if gate.component not in components:
                raise RubricError(
                    f"rubric gate on {gate.component!r}: no such component in this sample's scores "
                    f"(they are: {', '.join(components)})."
                )
            if components[gate.component] < gate.min:
                zeroed.update(gate.zeroes or (e.name for e in self.entries))
        return zeroed


def check_gate(gate: RubricGate, entry_names: Sequence[str]) -> None:
    """A gate names an entry (or an entry's part, ``entry.part``) and zeroes known entries."""
    if not math.isfinite(gate.min):
        raise RubricError(f"rubric gate on {gate.component!r}: min is {gate.min}; a threshold is a finite number.")
    head = gate.component.split(".", 1)[0]
    if gate.component not in entry_names and head not in entry_names:
        raise RubricError(
            f"rubric gate on {gate.component!r}: no rubric entry has that name (the entries: "
            f"{', '.join(entry_names)}); name an entry, or one of its parts as 'entry.part'."
        )
    unknown = [name for name in gate.zeroes if name not in entry_names]
    if unknown:
        raise RubricError(
            f"rubric gate on {gate.component!r} zeroes {', '.join(map(repr, unknown))}, which no "
            f"entry is named (the entries: {', '.join(entry_names)})."
        )


async def _gather(raw: dict[str, Any]) -> dict[str, Any]:
    names = [n for n, r in raw.items() if inspect.isawaitable(r)]
    results = await asyncio.gather(*(raw[n] for n in names))
    return {**raw, **dict(zip(names, results))}

