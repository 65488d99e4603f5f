"""What the viewer reads: a training run's folder (``metrics.jsonl``, ``rollouts.jsonl``, the
pictures in ``rollout_images/``) or an eval results file, as plain JSON files only.

A ``Source`` indexes its records by byte offset as they are read (a few numbers each), so a run
of 100k records is indexed once and any step's records are read back by seeking; ``refresh``
reads only what was appended since (``--serve`` on a running training). A line still being
written (no newline yet) waits for the next refresh; a file rewritten shorter (a resume cut it
back) is read again from the start.
"""

from __future__ import annotations

import base64
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agilerl.errors import InvalidArgument

__all__ = ["METRICS", "ROLLOUTS", "Entry", "Source", "open_source"]

METRICS = "metrics.jsonl"
ROLLOUTS = "rollouts.jsonl"


@dataclass
class Entry:
    """One record's place in its file and what the filters need, without its text."""

    step: int
    offset: int
    length: int
    reward: float | None
    group: int
    flags: tuple[str, ...]
    """``failed_tool``, ``truncated``, ``error``: what the page filters on."""


@dataclass
class Source:
    """One run (or eval file) as the viewer sees it."""

    name: str
    kind: str
    """``train`` (a run's folder) or ``eval`` (a results file)."""
    folder: Path
    records_path: Path | None
    metrics_path: Path | None
    metrics: list[dict[str, Any]] = field(default_factory=list)
    entries: list[Entry] = field(default_factory=list)
    _read: dict[str, tuple[int, int]] = field(default_factory=dict)
    """Per file: (bytes read, the file's identity), for ``refresh``."""

    def refresh(self) -> tuple[int, int]:
        """Read what the files gained since the last call: ``(new metrics rows, new records)``;
        a file that was rewritten (shorter, or another file) is read again whole."""
        rows = entries = 0
        if self.metrics_path is not None:
            lines, restarted = self._tail(self.metrics_path)
            if restarted:
                self.metrics = []
            fresh = [row for _, line in lines if (row := _object(line)) is not None]
            self.metrics += [_finite_row(row) for row in fresh]
            rows = len(fresh)
        if self.records_path is not None:
            lines, restarted = self._tail(self.records_path)
            if restarted:
                self.entries = []
            before = len(self.entries)
            for offset, line in lines:
                if (entry := _entry(line, offset, self.kind, len(self.entries))) is not None:
                    self.entries.append(entry)
            entries = len(self.entries) - before
        return rows, entries

    def read(self, entries: list[Entry]) -> list[dict[str, Any]]:
        """The page's form of ``entries``' records (turns normalised, pictures by file name)."""
        if self.records_path is None or not entries:
            return []
        out = []
        with self.records_path.open("rb") as f:
            for entry in entries:
                f.seek(entry.offset)
                record = _object(f.read(entry.length))
                if record is not None:  # a line damaged past its head is left out
                    out.append(self._normalised(record, entry))
        return out

    def images(self, records: list[dict[str, Any]]) -> dict[str, str]:
        """The pictures ``records`` show, as data URLs by file name (each once)."""
        out: dict[str, str] = {}
        root = self.folder.resolve()
        for record in records:
            for turn in record["turns"]:
                for image in turn.get("images", ()):
                    name = image.get("file")
                    if not isinstance(name, str) or name in out:
                        continue
                    path = (root / name).resolve()
                    if not path.is_relative_to(root) or not path.is_file():
                        continue  # only the run's own files: a record never points the page elsewhere
                    mime = "image/jpeg" if path.suffix.lower() in (".jpg", ".jpeg") else "image/png"
                    out[name] = f"data:{mime};base64,{base64.b64encode(path.read_bytes()).decode('ascii')}"
        return out

    def _tail(self, path: Path) -> tuple[list[tuple[int, bytes]], bool]:
        """The whole new lines of ``path`` since the last read, with their offsets, and whether
        the file was read again from its start."""
        if not path.is_file():
            return [], False
        stat = path.stat()
        identity = stat.st_ino
        done, seen = self._read.get(str(path), (0, identity))
        restarted = seen != identity or stat.st_size < done
        if restarted:
            done = 0
        with path.open("rb") as f:
            f.seek(done)
            data = f.read()
        end = data.rfind(b"\n") + 1  # a line without its newline is still being written
        out = []
        at = 0
        while at < end:
            stop = data.index(b"\n", at)
            if data[at:stop].strip():
                out.append((done + at, data[at:stop]))
            at = stop + 1
        self._read[str(path)] = (done + end, identity)
        return out, restarted

    def _normalised(self, record: dict[str, Any], entry: Entry) -> dict[str, Any]:
        if self.kind == "eval":
            record = _eval_record(record)
        record["step"] = entry.step
        record["flags"] = list(entry.flags)
        return record


def open_source(path: str | Path) -> Source:
    """A run's folder (holding ``metrics.jsonl`` or ``rollouts.jsonl``) or an eval ``.jsonl``."""
    path = Path(path)
    if path.is_file() and path.name in (ROLLOUTS, METRICS):  # a run's own file: the run
        path = path.parent
    if path.is_dir():
        records, metrics = path / ROLLOUTS, path / METRICS
        if not records.exists() and not metrics.exists():
            raise InvalidArgument(
                f"{path} holds neither {ROLLOUTS} nor {METRICS}: give a training run's output_dir "
                "(agilerl train writes them there) or an agilerl eval results file"
            )
        source = Source(path.name, "train", path, records, metrics)
    elif path.is_file():
        source = Source(path.stem, "eval", path.parent, path, None)
    else:
        raise InvalidArgument(f"{path} does not exist: give a training run's output_dir or an eval results .jsonl")
    source.refresh()
    if source.kind == "eval" and source.entries and not _looks_like_eval(source):
        raise InvalidArgument(
            f"{path} is not an eval results file (its rows hold no task and messages); give the "
            "file agilerl eval wrote (--output), or a training run's output_dir"
        )
    return source


def _looks_like_eval(source: Source) -> bool:
    first = source.read(source.entries[:1])
    return bool(first) and "turns" in first[0] and first[0].get("group") is not None


_BULK = (b', "turns": ', b', "messages": ')
"""Where a record's bulk begins (the trainer's and eval's key order): the index parses the head."""
_FAILED_CALL = re.compile(rb'"status": "(?!ok")')
"""A tool call record whose status is not ``ok`` (inside a JSON string the quotes are escaped)."""


def _object(line: bytes) -> dict[str, Any] | None:
    """A line's JSON object; None for a damaged line (skipped: the rest is still shown)."""
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _head(line: bytes) -> dict[str, Any] | None:
    """The fields before a record's bulk (its turns or messages), parsed alone: indexing 100k
    records then reads a few hundred bytes of each, not their transcripts and token ids."""
    for key in _BULK:
        cut = line.find(key)
        if cut > 0:
            head = _object(line[:cut] + b"}")
            if head is not None:
                return head
    return _object(line)


def _entry(line: bytes, offset: int, kind: str, number: int) -> Entry | None:
    """The filters' view of one record line, or None when it is not a record."""
    record = _head(line)
    if record is None:
        return None
    flags = []
    if kind == "eval":
        step, group = 0, _int(record.get("task"), number)
    else:
        step, group = _int(record.get("step"), 0), _int(record.get("group"), 0)
    if _FAILED_CALL.search(line):
        flags.append("failed_tool")
    if record.get("truncated"):
        flags.append("truncated")
    if record.get("error"):
        flags.append("error")
    return Entry(step, offset, len(line), _number(record.get("reward")), group, tuple(flags))


def _eval_record(row: dict[str, Any]) -> dict[str, Any]:
    """An eval row in the page's form: its messages as turns (the model's apart from the env's),
    each model turn with the tool calls the harness parsed (status included) when the row has them."""
    calls = (row.get("info") or {}).get("turn_tool_calls") or []
    turns: list[dict[str, Any]] = []
    model_turn = -1
    for message in row.get("messages") or []:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        content = message.get("content")
        text = content if isinstance(content, str) else "" if content is None else json.dumps(content)
        if role == "assistant":
            if not turns or turns[-1]["role"] != "model":
                model_turn += 1
            entry: dict[str, Any] = {"role": "model", "turn": model_turn, "text": text}
            if model_turn < len(calls) and not any(t.get("tool_calls") for t in turns if t["turn"] == model_turn):
                entry["tool_calls"] = calls[model_turn]
            elif message.get("tool_calls") and not calls:
                entry["tool_calls"] = [_called(c) for c in message["tool_calls"] if isinstance(c, dict)]
            if model_turn < len(row.get("rewards") or []):
                entry["reward"] = row["rewards"][model_turn]
        else:
            label = f"{role}: {message['name']}\n" if role == "tool" and message.get("name") else ""
            entry = {"role": "prompt" if model_turn < 0 else "env", "turn": model_turn, "text": label + text}
        turns.append(entry)
    return {
        "episode": f"task {row.get('task')} sample {row.get('sample')}",
        "sample": 0,
        "samples": 1,
        "group": row.get("task"),
        "index": row.get("sample"),
        "seed": row.get("seed"),
        "row_index": row.get("row_index"),
        "reward": row.get("reward"),
        "rewards": row.get("rewards") or [],
        "reward_components": row.get("reward_components") or {},
        "terminated": row.get("terminated"),
        "truncated": row.get("truncated"),
        "truncated_by": row.get("truncated_by"),
        "error": row.get("error"),
        "passed": row.get("passed"),
        "turns": turns,
    }


def _called(call: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI-style call from a transcript (it ran: the env answered it)."""
    function = call.get("function") or {}
    return {"name": function.get("name"), "arguments": function.get("arguments"), "status": "ok"}


def _finite_row(row: dict[str, Any]) -> dict[str, Any]:
    """A metrics row whose numbers a browser's JSON reads (NaN and infinities as null)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in row.items()}


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
