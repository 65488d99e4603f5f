"""Adaptive task sampling: tasks whose groups were informative are drawn more often.

A group is informative when its finished rollouts' rewards differ: a group-relative algorithm
learns nothing from a group that all solved or all failed. Each unit (a dataset row; for an env
without rows, a bucket of seeds, ``seed % SEED_BUCKETS``) keeps its last ``HISTORY`` outcomes and
scores ``(informative + 1/2) / (seen + 1)``: 1/2 unseen, 0.9 after four informative groups, 0.1
after four that were not. A draw is uniform over the units with probability ``floor``, else in
proportion to the scores, so every unit keeps at least ``floor / N`` of the draws: solved and
hopeless rows come back, and are measured again (a row can become informative as the policy moves).

Everything is integer arithmetic (scores scaled to integers, a Fenwick tree of them) or the
generator's own state, so ranks that merge the same outcomes in the same order hold the same
weights, and a checkpoint's state draws exactly what an unbroken run would have.
"""

from __future__ import annotations

import random
from array import array
from collections.abc import Iterable, Sequence
from typing import Any

from agilerl.errors import InvalidArgument

__all__ = ["SEED_BUCKETS", "HISTORY", "AdaptiveSampler", "state_of", "restore"]

SEED_BUCKETS = 64
"""Units of an env without rows: seeds ``s`` with the same ``s % SEED_BUCKETS`` share statistics
(an env whose task family or level follows the seed's residue gets the full benefit; one that
hashes its seed sees buckets that look alike, and draws in effect uniformly)."""

HISTORY = 4
"""Outcomes each unit remembers: recent enough that a row the policy has learned drops back."""

_SCALE = 60  # divisible by every seen + 1 (1 .. HISTORY + 1): the weights are exact integers


class AdaptiveSampler:
    """Weighted draws over ``units`` (see the module doc); ``rng`` is the caller's generator."""

    def __init__(self, units: int, floor: float) -> None:
        if units < 1:
            raise InvalidArgument(f"adaptive task sampling needs at least one task, got {units}")
        if not 0 < floor <= 1:
            raise InvalidArgument(f"task_sampling_floor must be in (0, 1], got {floor}")
        self.units, self.floor = units, floor
        self._history: dict[int, tuple[int, int]] = {}  # unit -> (outcomes seen, their bits, newest lowest)
        self._tree = _SumTree(units, _weight(0, 0))

    def draw(self, rng: random.Random) -> int:
        """One unit: uniform with probability ``floor``, else in proportion to its score."""
        if rng.random() < self.floor:
            return rng.randrange(self.units)
        return self._tree.find(rng.randrange(self._tree.total))

    def record(self, outcomes: Iterable[tuple[int, bool]]) -> None:
        """Count ``(unit, informative)`` outcomes, in order."""
        for unit, informative in outcomes:
            if not 0 <= unit < self.units:
                raise InvalidArgument(f"task unit {unit} is outside 0..{self.units - 1}")
            seen, bits = self._history.get(unit, (0, 0))
            before = _weight(seen, bits)
            seen, bits = min(seen + 1, HISTORY), ((bits << 1) | int(informative)) & ((1 << HISTORY) - 1)
            self._history[unit] = (seen, bits)
            self._tree.add(unit, _weight(seen, bits) - before)

    def probability(self, unit: int) -> float:
        """The chance that one draw picks ``unit`` (what the tests and the docs reason about)."""
        seen, bits = self._history.get(unit, (0, 0))
        return self.floor / self.units + (1 - self.floor) * _weight(seen, bits) / self._tree.total

    def state(self) -> list[list[int]]:
        """The outcomes remembered, ``[unit, seen, bits]`` each (JSON-able)."""
        return [[unit, seen, bits] for unit, (seen, bits) in sorted(self._history.items())]

    def load(self, state: Sequence[Sequence[int]]) -> None:
        """Restore :meth:`state` (the weights are rebuilt from it: integers, so exactly)."""
        self._history = {}
        weights = [_weight(0, 0)] * self.units
        for unit, seen, bits in state:
            if not 0 <= unit < self.units or not 0 <= seen <= HISTORY:
                raise InvalidArgument(f"task sampler state: entry {[unit, seen, bits]} does not fit {self.units} tasks")
            self._history[int(unit)] = (int(seen), int(bits))
            weights[unit] = _weight(seen, bits)
        self._tree = _SumTree.of(weights)


def _weight(seen: int, bits: int) -> int:
    """The score ``(informative + 1/2) / (seen + 1)`` times ``2 * _SCALE``: an exact integer."""
    return _SCALE * (2 * bin(bits).count("1") + 1) // (seen + 1)


class _SumTree:
    """A Fenwick tree of integer weights: add to one and draw by prefix sum, both O(log n)."""

    def __init__(self, size: int, fill: int) -> None:
        self.size = size
        self.total = size * fill
        self._tree = array("q", [0]) * (size + 1)
        for i in range(1, size + 1):  # each node sums the (i & -i) weights ending at i
            self._tree[i] = fill * (i & -i)

    @classmethod
    def of(cls, weights: Sequence[int]) -> _SumTree:
        tree = cls(len(weights), 0)
        for i, weight in enumerate(weights, start=1):
            tree._tree[i] += weight
            parent = i + (i & -i)
            if parent <= tree.size:
                tree._tree[parent] += tree._tree[i]
        tree.total = sum(weights)
        return tree

    def add(self, index: int, delta: int) -> None:
        self.total += delta
        i = index + 1
        while i <= self.size:
            self._tree[i] += delta
            i += i & -i

    def find(self, target: int) -> int:
        """The index whose weight covers ``target`` in ``0 .. total - 1`` (cumulative order)."""
        position, step = 0, 1 << (self.size.bit_length() - 1)
        while step:
            nxt = position + step
            if nxt <= self.size and self._tree[nxt] <= target:
                position, target = nxt, target - self._tree[nxt]
            step >>= 1
        return position


def state_of(rng: random.Random) -> list[Any]:
    """A generator's state as JSON-able lists."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def restore(rng: random.Random, state: Sequence[Any]) -> None:
    """Undo :func:`state_of`."""
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))
