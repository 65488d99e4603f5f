"""What the model did, sample by sample: ``rollouts.jsonl``, one JSON line per training sample.

``training.record_rollouts`` picks how many (``all``, N per step, 0). Each line holds the step it
trained, its episode and group, the reward and its parts, the exact ``token_ids`` and ``mask``
(1 on tokens the policy generated), ``versions`` and staleness when the policy reports versions,
and ``turns``: the tokens cut where the speaker changes, decoded, with each model turn's tool
calls and each env turn's pictures (thumbnails in ``rollout_images/``, named by their pixels, so
a picture shown on every step is stored once). The file follows ``metrics.jsonl``'s rules
(``MetricsLog``): a step's lines are on disk before its metrics row and its checkpoint, and a
resume drops the lines past the checkpoint and a torn last line. ``agilerl view`` reads it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from agilerl.rollout.pipeline import staleness
from agilerl.rollout.tool_routing import TURN_TOOL_CALLS
from agilerl.train.metrics import MetricsLog, _finite  # non-finite numbers as null, as in metrics rows

if TYPE_CHECKING:
    from agilerl.images import EnvImage
    from agilerl.rollout.trajectory import Trajectory

__all__ = ["ROLLOUTS_FILE", "IMAGES_DIR", "THUMBNAIL_PX", "RolloutRecorder", "sample_records", "save_thumbnail"]

ROLLOUTS_FILE = "rollouts.jsonl"
IMAGES_DIR = "rollout_images"
THUMBNAIL_PX = 256
"""A recorded picture's longest side at most: records stay small, the page shows what the env showed."""
_TOOL_RESULT_CHARS = 2000
"""A tool call's result, cut to this in its record (the env turn's text holds it whole)."""


class RolloutRecorder:
    """Collects a step's samples as it plays (``add``) and writes them with the step's row (``write``)."""

    def __init__(
        self, output_dir: str | Path, tokenizer: Any, keep: int | Literal["all"], *, start_step: int = 0
    ) -> None:
        self.output_dir = Path(output_dir)
        self.tokenizer = tokenizer
        self.keep = keep
        self.log = MetricsLog(self.output_dir, start_step=start_step, file=ROLLOUTS_FILE)
        self._pending: list[dict[str, Any]] = []
        self._groups = self._slots = 0  # the step's groups and slots in the batches added so far

    def add(self, trajectories: Sequence[Trajectory], *, version: int) -> None:
        """Record the samples of one batch's ``trajectories`` (slot order, so groups stay whole), up
        to the step's share; ``version`` is the policy version the update trains (staleness is
        measured from it). A step of several batches (gradient accumulation) numbers its groups
        and slots on from the last batch's, so a record's ``group`` is the one it was compared in."""
        room = None if self.keep == "all" else int(self.keep) - len(self._pending)
        for index, traj in enumerate(trajectories):
            if room is not None and room <= 0:
                break
            records = sample_records(traj, self.tokenizer, self.output_dir, version=version, index=self._slots + index)
            if room is not None:
                records = records[:room]
                room -= len(records)
            for record in records:
                record["group"] += self._groups
            self._pending += records
        self._groups += max((t.group for t in trajectories), default=-1) + 1
        self._slots += len(trajectories)

    def write(self, step: int) -> None:
        """The step's records, on disk before this returns (before the step's metrics row)."""
        pending, self._pending = self._pending, []
        self._groups = self._slots = 0
        if pending:
            self.log.append([{"step": step, **record} for record in pending])


def sample_records(
    traj: Trajectory, tokenizer: Any, output_dir: Path, *, version: int | None = None, index: int = 0
) -> list[dict[str, Any]]:
    """One record per training sample of the episode ``traj`` (without its ``step``)."""
    samples = traj.samples
    components = traj.info.get("reward_components") or {}
    calls = traj.info.get(TURN_TOOL_CALLS) or []
    out = []
    for number, sample in enumerate(samples):
        record: dict[str, Any] = {
            "episode": traj.episode,
            "sample": number,
            "samples": len(samples),
            "group": traj.group,
            "index": index,
            "seed": traj.seed,
            "row_index": traj.row_index,
            "reward": _finite(traj.total_reward),
            "rewards": [_finite(r) for r in traj.rewards],
            "reward_components": {str(k): _finite(v) for k, v in components.items()},
            "terminated": traj.terminated,
            "truncated": traj.truncated,
            "truncated_by": traj.info.get("truncated_by"),
            "error": traj.error,
            "turns": _turns(sample, traj.rewards, calls, tokenizer, output_dir),
            "token_ids": list(sample.token_ids),
            "mask": [int(m) for m in sample.action_mask],
        }
        if sample.versions is not None:
            record["versions"] = list(sample.versions)
            if version is not None:
                mean, most = staleness([sample], version)
                record["staleness"] = {"mean": mean, "max": most}
        out.append(record)
    return out


def _turns(
    sample: Trajectory, rewards: Sequence[float], calls: Sequence[Any], tokenizer: Any, output_dir: Path
) -> list[dict[str, Any]]:
    """The sample's tokens cut where the turn or the speaker changes: ``prompt`` (before the first
    answer), ``model`` (generated: its turn's reward and tool calls) and ``env`` (the rest: the
    template's close, the observation, the next opening; its pictures)."""
    ids, mask, turn_ids = sample.token_ids, sample.action_mask, sample.turn_ids
    media = sample.media
    placeholders = frozenset(media.placeholder_ids) if media is not None else frozenset()
    pictures = _pictures_at(sample, output_dir) if media is not None and media.images else {}
    turns: list[dict[str, Any]] = []
    start = 0
    for end in range(1, len(ids) + 1):
        if end < len(ids) and turn_ids[end] == turn_ids[start] and mask[end] == mask[start]:
            continue
        turn = turn_ids[start]
        role = "model" if mask[start] else "prompt" if turn < 0 else "env"
        entry: dict[str, Any] = {"role": role, "turn": turn, "start": start, "end": end,
                                 "text": _decode(tokenizer, ids[start:end], placeholders)}
        if role == "model" and 0 <= turn < len(rewards):
            entry["reward"] = _finite(rewards[turn])
            if turn < len(calls) and calls[turn]:
                entry["tool_calls"] = [_call(c) for c in calls[turn] if isinstance(c, dict)]
        shown = [image for at, images in pictures.items() if start <= at < end for image in images]
        if shown:
            entry["images"] = shown
        turns.append(entry)
        start = end
    return turns


def _decode(tokenizer: Any, ids: Sequence[int], placeholders: frozenset[int]) -> str:
    """The ids as text, special tokens shown; a run of image placeholders as one, with its count."""
    parts: list[str] = []
    run: list[int] = []
    at = 0
    while at < len(ids):
        if ids[at] in placeholders:
            end = at
            while end < len(ids) and ids[end] == ids[at]:
                end += 1
            if run:
                parts.append(tokenizer.decode(run, skip_special_tokens=False))
                run = []
            parts.append(tokenizer.decode([ids[at]], skip_special_tokens=False) + (f"\u00d7{end - at}" if end - at > 1 else ""))
            at = end
            continue
        run.append(ids[at])
        at += 1
    if run:
        parts.append(tokenizer.decode(run, skip_special_tokens=False))
    return "".join(parts)


def _call(record: dict[str, Any]) -> dict[str, Any]:
    """A tool call's record, its result cut to a bound."""
    call = dict(record)
    result = call.get("result")
    if isinstance(result, str) and len(result) > _TOOL_RESULT_CHARS:
        call["result"] = result[:_TOOL_RESULT_CHARS] + f"... [{len(result) - _TOOL_RESULT_CHARS} more characters]"
    return call


def _pictures_at(sample: Trajectory, output_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Each image turn's pictures, by the position of its first placeholder token (saved as thumbnails)."""
    from agilerl.generation.media import _images_in  # how many pictures a turn's processor output holds

    media = sample.media
    assert media is not None
    placeholders = frozenset(media.placeholder_ids)
    where = [i for i, (t, m) in enumerate(zip(sample.token_ids, sample.action_mask)) if t in placeholders and not m]
    out: dict[int, list[dict[str, Any]]] = {}
    seen = image = 0
    for chunk, count in zip(media.chunks, media.placeholder_counts):
        n = _images_in(chunk)
        at = where[seen] if count and seen < len(where) else 0
        out.setdefault(at, []).extend(save_thumbnail(i, output_dir) for i in media.images[image : image + n])
        seen += count
        image += n
    return out


def save_thumbnail(image: EnvImage, output_dir: Path) -> dict[str, Any]:
    """``image`` as a JPEG of at most ``THUMBNAIL_PX`` a side under ``rollout_images/`` (written
    once per picture, atomically; a noisy 256x256 picture is ~25 kB as JPEG, ~100 kB as PNG), and
    the entry a record holds for it."""
    folder = output_dir / IMAGES_DIR
    name = f"{image.checksum()[:20]}.jpg"
    path = folder / name
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        thumb = image.pil().copy()
        thumb.thumbnail((THUMBNAIL_PX, THUMBNAIL_PX))
        partial = path.with_name(f"{name}.{os.getpid()}.tmp")
        thumb.save(partial, format="JPEG", quality=85)
        os.replace(partial, path)
    return {"file": f"{IMAGES_DIR}/{name}", "width": image.width, "height": image.height}
