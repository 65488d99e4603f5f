"""What the tool calls of a batch of episodes come to, as metrics: calls per episode, the share
that ran, failures by status (``unknown_tool`` among them), and turns with no call at all.

Each episode keeps its counts in ``Trajectory.info["tool_stats"]`` (``count_calls`` per turn),
so the numbers survive a trajectory's trip through the collector and every rank's batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from agilerl.tools.calls import CALL_STATUSES

__all__ = ["TOOL_STATS_KEY", "count_calls", "tool_call_metrics"]

TOOL_STATS_KEY = "tool_stats"


def count_calls(totals: dict[str, Any], records: list[Mapping[str, Any]] | None) -> None:
    """Add one model turn's call records (``info["tool_calls"]``) to an episode's counts."""
    stats = totals.setdefault(TOOL_STATS_KEY, {"turns": 0, "calls": 0, "no_call_turns": 0})
    stats["turns"] += 1
    if not records:
        stats["no_call_turns"] += 1
        return
    for record in records:
        stats["calls"] += 1
        status = str(record.get("status", "ok"))
        stats[status] = stats.get(status, 0) + 1


def tool_call_metrics(episodes: Iterable[Mapping[str, Any] | None]) -> dict[str, float]:
    """``tools/...`` over episodes' ``tool_stats`` (None: an episode without tool parsing);
    empty when no episode parsed tool calls."""
    rows = [e for e in episodes if e]
    if not rows:
        return {}
    n = len(rows)
    calls = math.fsum(r.get("calls", 0) for r in rows)
    turns = math.fsum(r.get("turns", 0) for r in rows)
    ok = math.fsum(r.get("ok", 0) for r in rows)
    metrics = {
        "tools/calls_per_episode": calls / n,
        "tools/well_formed_rate": ok / calls if calls else 0.0,
        "tools/ok_calls_per_turn": ok / turns if turns else 0.0,
        "tools/no_call_turns_per_episode": math.fsum(r.get("no_call_turns", 0) for r in rows) / n,
    }
    for status in CALL_STATUSES[1:]:
        metrics[f"tools/failed/{status}"] = math.fsum(r.get(status, 0) for r in rows) / n
    return metrics
