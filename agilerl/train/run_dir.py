"""What makes a folder a run's: a marker file naming the entries the run wrote there.

``--overwrite`` deletes a folder only when every entry in it is one of these, so a user's file
beside a run (or a manifest pointing ``output_dir`` at a folder of their own) is never deleted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["RUN_MARKER", "RUN_LOCK", "KNOWN_RUN_ENTRIES", "mark_run", "read_marker", "run_entries"]

RUN_MARKER = ".agilerl-run"
RUN_LOCK = ".agilerl-lock"
"""The file a running ``agilerl train`` holds locked (fcntl) and writes its pid into."""
KNOWN_RUN_ENTRIES = frozenset(
    {RUN_MARKER, RUN_LOCK, "metrics.jsonl", "metrics.jsonl.tmp", "reward_curve.png", "loss_curve.png",
     "checkpoints", "tracker_run.json", "tensorboard", "wandb", "rollouts.jsonl", "rollouts.jsonl.tmp",
     "rollout_images", "view.html"}
)
"""What a run writes at its top level, for runs from before the marker (and before a save)."""


def mark_run(output_dir: str | Path) -> None:
    """Create or update ``output_dir``'s marker: the entries there now, less those that were
    there before this folder's first run (they are someone else's)."""
    folder = Path(output_dir)
    folder.mkdir(parents=True, exist_ok=True)
    marker = read_marker(folder)
    present = {entry.name for entry in folder.iterdir()}
    if marker is None:
        marker = {"foreign": sorted(present - KNOWN_RUN_ENTRIES)}
    foreign = set(marker.get("foreign", []))
    marker["entries"] = sorted((present | {RUN_MARKER}) - foreign)
    (folder / RUN_MARKER).write_text(json.dumps(marker, indent=1) + "\n")


def read_marker(folder: Path) -> dict[str, Any] | None:
    """The marker's content, or None when the folder has none (or an unreadable one)."""
    try:
        marker = json.loads((folder / RUN_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def run_entries(folder: Path) -> set[str]:
    """The top-level names the run in ``folder`` wrote (by its marker, else the known ones)."""
    marker = read_marker(folder) or {}
    listed = marker.get("entries", [])
    return set(KNOWN_RUN_ENTRIES) | {str(name) for name in listed if isinstance(name, str)}
