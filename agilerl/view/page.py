"""The page: one self-contained HTML file (styles, script, data and pictures inline; no request
leaves it), bounded in size however long the run.

A run's metrics are all embedded (a row per step). Its records are embedded whole while they fit
``budget`` bytes; past that each step keeps the records a reader looks for first (the lowest and
highest reward, a failed tool call, a truncated or failed episode), then the rest in group order,
and steps are sampled evenly when even one record each would not fit. The page says how many it
holds of how many; ``--serve`` reads any step's records whole on demand.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agilerl.view.sources import Entry, Source

__all__ = ["PAGE_BUDGET", "IMAGE_BUDGET", "SERVED_STEP_LIMIT", "choose", "step_summary", "run_data", "page_data", "render_page", "step_data", "page_title", "write_page"]

PAGE_BUDGET = 24 * 2**20
"""Bytes of records a page embeds at most (the JSON lines' size; a page of 100k records weighs
about this plus its metrics, see bench/README.md)."""
IMAGE_BUDGET = 8 * 2**20
"""Bytes of pictures (thumbnails) a page embeds at most; past it a picture shows as its size."""
SERVED_STEP_LIMIT = 2000
"""Records a served step sends at once at most (the lowest, highest and flagged first)."""
_ASSETS = Path(__file__).parent / "assets"


def choose(entries: Sequence[Entry], budget: int) -> list[Entry]:
    """The entries a page of ``budget`` bytes holds (all when they fit), in file order."""
    total = sum(e.length for e in entries)
    if total <= budget:
        return list(entries)
    by_step: dict[int, list[Entry]] = {}
    for entry in entries:
        by_step.setdefault(entry.step, []).append(entry)
    steps = sorted(by_step)
    room = max(1, int(budget / (total / len(entries))))
    if room < len(steps):  # one record for each of ``room`` steps, evenly spread, the last included
        picked = sorted({steps[round(i * (len(steps) - 1) / max(1, room - 1))] for i in range(room)})
        steps = picked
    share = max(1, room // len(steps))
    chosen: list[Entry] = []
    for step in steps:
        chosen += _first_looked_at(by_step[step], share)
    chosen.sort(key=lambda e: e.offset)
    return chosen


def _first_looked_at(entries: list[Entry], count: int) -> list[Entry]:
    """``count`` of a step's entries: the extremes and the flagged ones first, then group order."""
    scored = [e for e in entries if e.reward is not None]
    first: list[Entry] = []
    if scored:
        first += [min(scored, key=lambda e: e.reward), max(scored, key=lambda e: e.reward)]  # type: ignore[arg-type, return-value]
    for flag in ("failed_tool", "truncated", "error"):
        first += [e for e in entries if flag in e.flags][:1]
    order: dict[int, Entry] = {}  # by offset: each record once
    for entry in [*first, *entries]:
        order.setdefault(entry.offset, entry)
        if len(order) == count:
            break
    return list(order.values())


def step_summary(entries: Sequence[Entry]) -> list[list[Any]]:
    """``[step, records, mean reward]`` for every step that has records."""
    sums: dict[int, list[float]] = {}
    for entry in entries:
        row = sums.setdefault(entry.step, [0, 0.0, 0])
        row[0] += 1
        if entry.reward is not None:
            row[1] += entry.reward
            row[2] += 1
    return [[step, int(n), (total / scored) if scored else None] for step, (n, total, scored) in sorted(sums.items())]


def run_data(source: Source, budget: int, image_budget: int = IMAGE_BUDGET) -> dict[str, Any]:
    """One run's part of the page: every metrics row, every step's count, the chosen records."""
    chosen = choose(source.entries, budget)
    records = source.read(chosen)
    return {
        "name": source.name,
        "kind": source.kind,
        "path": str(source.records_path or source.folder),
        "metrics": source.metrics,
        "steps": step_summary(source.entries),
        "total": len(source.entries),
        "records": records,
        "images": _bounded(source.images(records), image_budget),
    }


def _bounded(images: dict[str, str], budget: int) -> dict[str, str]:
    kept: dict[str, str] = {}
    spent = 0
    for name, url in images.items():
        if spent + len(url) > budget:
            break
        kept[name] = url
        spent += len(url)
    return kept


def page_data(sources: Sequence[Source], *, budget: int = PAGE_BUDGET, live: bool = False) -> dict[str, Any]:
    """What the page's script reads: each run (the budget shared between them) and the mode."""
    share = budget // max(1, len(sources))
    return {"runs": [run_data(s, share, IMAGE_BUDGET // max(1, len(sources))) for s in sources], "live": live}


def step_data(source: Source, step: int) -> dict[str, Any]:
    """A step's records for the served page (at most ``SERVED_STEP_LIMIT``) and their pictures."""
    entries = [e for e in source.entries if e.step == step]
    if len(entries) > SERVED_STEP_LIMIT:
        entries = sorted(_first_looked_at(entries, SERVED_STEP_LIMIT), key=lambda e: e.offset)
    records = source.read(entries)
    return {"step": step, "records": records, "images": _bounded(source.images(records), IMAGE_BUDGET)}


def render_page(data: dict[str, Any], *, title: str) -> str:
    """The HTML: the template with its style, its script and ``data`` inline."""
    template = (_ASSETS / "page.html").read_text()
    # inside <script type="application/json">: "<" escaped, so no text in the data can end the element
    payload = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")
    parts = {
        "__TITLE__": _escape(title),
        "/*__STYLE__*/": (_ASSETS / "viewer.css").read_text(),
        "/*__SCRIPT__*/": (_ASSETS / "viewer.js").read_text(),
        "__DATA__": payload,
    }
    out = template.replace("__TITLE__", parts.pop("__TITLE__"))  # before the rest: no text is read as a slot
    for key, value in parts.items():
        head, _, tail = out.partition(key)  # each slot once: what is put in is never searched again
        out = head + value + tail
    return out


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


def page_title(sources: Sequence[Source]) -> str:
    return "agilerl view: " + " vs ".join(s.name for s in sources)


def write_page(sources: Sequence[Source], out: str | Path, *, budget: int = PAGE_BUDGET) -> Path:
    """The page of ``sources`` written to ``out``."""
    out = Path(out)
    out.write_text(render_page(page_data(sources, budget=budget), title=page_title(sources)), encoding="utf-8")
    return out
