"""What a batch's agent episodes come to, as metrics (each episode keeps its counts in
``Trajectory.info["agent"]``, so they survive the trip through the collector and every rank's batch)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

__all__ = ["AGENT_STATS_KEY", "agent_metrics"]

AGENT_STATS_KEY = "agent"
"""``Trajectory.info`` key of an episode's agent counts: calls, samples, failed, call_s."""


def agent_metrics(trajectories: Iterable[Any]) -> dict[str, float]:
    """``agent/...`` over a batch's agent episodes (empty when none is one): ``calls`` and
    ``failures`` in all, ``samples_per_episode`` and ``call_s`` (seconds per call) on average."""
    rows = [t.info[AGENT_STATS_KEY] for t in trajectories if isinstance(t.info.get(AGENT_STATS_KEY), dict)]
    if not rows:
        return {}
    calls = sum(r["calls"] for r in rows)
    return {
        "agent/calls": float(calls),
        "agent/failures": float(sum(r["failed"] for r in rows)),
        "agent/samples_per_episode": statistics.fmean(r["samples"] for r in rows),
        "agent/call_s": sum(r["call_s"] for r in rows) / calls if calls else 0.0,
    }
