"""What a run reports: ``metrics.jsonl`` (one line per step), a live progress bar, and the
reward (or loss) curve as a PNG drawn from the jsonl, so the plot never disagrees with the log."""

from __future__ import annotations

import json
import math
import os
import sys
import time
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agilerl.errors import CheckpointError, PlotUnavailable

__all__ = [
    "METRICS_FILE",
    "REWARD_COMPONENT",
    "JUDGE_METRICS",
    "SUMMED_METRICS",
    "reduction_of",
    "combine_metrics",
    "reward_component_metrics",
    "judge_metrics",
    "MetricsLog",
    "read_metrics",
    "replace_file",
    "plot_curves",
    "draw_curves",
    "ProgressBar",
    "LineSchedule",
]

METRICS_FILE = "metrics.jsonl"

REWARD_COMPONENT = "reward/{}"
"""A reward component's mean over a step's finished episodes (``reward/correct``, ``reward/judge``)."""
JUDGE_METRICS = ("judge/calls", "judge/failures", "judge/cache_hits", "judge/latency_s", "judge/tokens")
"""What the LLM judges did since the last step (``latency_s``: the mean per call)."""


SUMMED_METRICS = frozenset({
    "rollout/generated_tokens", "rollout/generation_calls", "rollout/truncated", "rollout/context_truncated",
    "rollout/retries", "rollout/lost", "rollout/failures", "rollout/groups_dropped", "rollout/informative_groups",
    "rollout/dropped_stale", "rollout/dropped_stale_tokens",
    "judge/calls", "judge/failures", "judge/cache_hits", "judge/tokens",
    "agent/calls", "agent/failures",
})
"""Counts: a step's row holds their total over its gradient-accumulation batches and its ranks
(every drop, loss and judge call counted once), where other metrics are means."""


def reduction_of(key: str) -> str:
    """How a metric combines over a step's batches and ranks: ``max`` for a maximum (``*_max``:
    ``rollout/staleness_max`` is the step's largest), ``sum`` for a count, else ``mean``."""
    if key.endswith("_max"):
        return "max"
    return "sum" if key in SUMMED_METRICS else "mean"


def combine_metrics(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Several batches' metrics as one row, each key by :func:`reduction_of` over the parts that have it."""
    keys = sorted({key for part in parts for key in part})
    out: dict[str, float] = {}
    for key in keys:
        values = [part[key] for part in parts if key in part]
        how = reduction_of(key)
        out[key] = max(values) if how == "max" else math.fsum(values) if how == "sum" else math.fsum(values) / len(values)
    return out


def reward_component_metrics(episodes: Iterable[Mapping[str, float] | None]) -> dict[str, float]:
    """``reward/<name>``: each component's mean over ``episodes`` (each one's summed
    components; an episode without a component counts 0 for it). Empty when none has any."""
    rows = [dict(e or {}) for e in episodes]
    names = sorted({name for row in rows for name in row})
    if not rows:
        return {}
    return {REWARD_COMPONENT.format(name): math.fsum(row.get(name, 0.0) for row in rows) / len(rows) for name in names}


def judge_metrics() -> dict[str, float]:
    """``judge/...`` since the last call (empty when no judge was ever built in this process)."""
    from agilerl.data.judge import take_judge_metrics

    taken = take_judge_metrics()
    return {key: taken.get(key, 0.0) for key in JUDGE_METRICS} if taken is not None else {}


class MetricsLog:
    """Appends one JSON object per step, each line on disk (fsync) before the step's checkpoint.

    A resumed run first drops the lines past its checkpoint (and a torn last line, with a
    warning) by replacing the file atomically: a kill at any moment leaves the old file or the
    new one, never a truncated history. ``file`` names another log kept by the same rules
    (``rollouts.jsonl``: several lines per step, ``append``).
    """

    def __init__(self, output_dir: str | Path, *, start_step: int = 0, file: str = METRICS_FILE) -> None:
        self.path = Path(output_dir) / file
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept: list[dict[str, Any]] = []
        if start_step:
            records, torn = _read(self.path)
            if torn is not None:
                print(
                    f"warning: {self.path}: dropped its torn last line ({torn!r}), cut off by a crash "
                    "while it was written; the step it held is trained again",
                    file=sys.stderr, flush=True,
                )
            kept = [r for r in records if r.get("step", 0) <= start_step]
        replace_file(self.path, "".join(json.dumps(r) + "\n" for r in kept))

    def write(self, step: int, metrics: Mapping[str, float], info: Mapping[str, Any] | None = None) -> None:
        """One line: ``step``, ``info`` as given (e.g. the engine, on a run's first line), then
        the metrics (non-finite values as null)."""
        self.append([{"step": step, **(info or {}), **{k: _finite(v) for k, v in metrics.items()}}])

    def append(self, records: Sequence[Mapping[str, Any]]) -> None:
        """Whole JSON lines, each holding its ``step``, in one write, on disk before this returns."""
        with self.path.open("a") as f:
            f.write("".join(json.dumps(record) + "\n" for record in records))
            f.flush()
            os.fsync(f.fileno())


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl`` (none if the file does not exist; a torn last line,
    left by a crash mid-write, is not a record)."""
    return _read(Path(path))[0]


def replace_file(path: Path, text: str) -> None:
    """Write ``text`` to a temporary file beside ``path``, fsync it, rename it over ``path``."""
    partial = path.with_name(path.name + ".tmp")
    with partial.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)  # the rename itself survives a power loss
    finally:
        os.close(folder)


def _read(path: Path) -> tuple[list[dict[str, Any]], str | None]:
    """The records of ``path`` and its torn last line (None when there is none)."""
    if not path.is_file():
        return [], None
    lines = path.read_text(errors="replace").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                return records, line[:80]
            raise CheckpointError(
                f"{path} line {number} is not JSON ({exc.msg}): the file was edited or damaged; "
                f"remove that line (the run's other rows are intact) and resume again."
            ) from None
        if isinstance(record, dict):
            records.append(record)
    return records, None


def plot_curves(
    metrics_path: str | Path, png_path: str | Path, keys: Sequence[str], *, title: str
) -> Path | None:
    """Plot ``keys`` against ``step`` from the jsonl (matplotlib's Agg backend: no display);
    without matplotlib, warn ``PlotUnavailable`` and return None: a run never fails for its plot.

    ``keys`` is ``(train_key, eval_key)``: the train curve is a line, the evaluations (a few
    points, greedy) big markers drawn on top, so they never hide in the train curve's noise.
    """
    try:
        import matplotlib
    except ImportError:
        warnings.warn(
            PlotUnavailable(
                f"no {Path(png_path).name}: plotting needs matplotlib (pip install "
                f"'agilerl-envlayer[plot]'); the numbers are in {metrics_path}"
            ),
            stacklevel=2,
        )
        return None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = draw_curves(read_metrics(metrics_path), keys, title=title)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return Path(png_path)


def draw_curves(records: Sequence[Mapping[str, Any]], keys: Sequence[str], *, title: str) -> Any:
    """The figure :func:`plot_curves` saves: the train curve, the evaluations on top, labelled axes."""
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 4))
    for index, key in enumerate(keys):
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if not points:
            continue
        steps, values = zip(*points)
        if index == 0:  # the train curve: one point per step
            ax.plot(steps, values, color="tab:blue", linewidth=1.5, marker="." if len(points) < 30 else None,
                    label=key, zorder=2)
        else:  # evaluations: few, and what the run is judged by
            ax.plot(steps, values, color="tab:orange", linestyle="--", linewidth=1, marker="D", markersize=7,
                    markeredgecolor="black", label=key, zorder=3)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    ax.set_xlabel("step (optimiser steps)")
    ax.set_ylabel(_quantity(keys))
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    return fig


def _quantity(keys: Sequence[str]) -> str:
    """The y axis' label: what the keys measure (``train/reward`` and ``eval/reward``: a reward)."""
    names = {key.rpartition("/")[2] for key in keys}
    name = names.pop() if len(names) == 1 else ", ".join(sorted(names))
    return {"reward": "mean reward per episode", "loss": "loss"}.get(name, name)


class ProgressBar:
    """Where the run is: a rich bar (elapsed and time left labelled, latest reward and loss) or,
    with ``show=False`` and ``lines=True`` (``--no-progress`` on rank 0), one plain line every
    tenth of the run or every ``LINE_EVERY_S`` seconds, whichever comes first, so a log file is
    never silent for minutes. Where stderr is no terminal (a log file, a pipe) the bar is those
    lines too: rich would squeeze it to one cut line there. ``TTY_COMPATIBLE=1`` forces the bar."""

    LINE_EVERY_S = 30.0
    _SHOWN = (("reward", "train/reward"), ("loss", "train/loss"), ("eval reward", "eval/reward"), ("eval loss", "eval/loss"),
              ("staleness", "rollout/staleness_mean"))

    def __init__(self, total: int, start: int, show: bool = True, *, lines: bool = False) -> None:
        self.total, self.start, self.show, self.lines = total, start, show, lines and not show
        self._progress: Any = None
        self._task: Any = None
        self._latest: dict[str, float] = {}  # evaluation results stay shown until the next one
        self._schedule = LineSchedule(total, start, self)

    @contextmanager
    def running(self) -> Iterator[ProgressBar]:
        if not self.show:
            yield self
            return
        from rich.console import Console

        console = Console(stderr=True)
        if not console.is_terminal:  # rich's test: TTY_COMPATIBLE and FORCE_COLOR, else isatty
            self.show, self.lines = False, True
            yield self
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("elapsed"),
            TimeElapsedColumn(),
            TextColumn("left"),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=console,
        )
        with self._progress:
            self._task = self._progress.add_task("", total=self.total, completed=self.start)
            yield self

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        self._latest.update(metrics)
        if self._progress is not None:
            self._progress.update(self._task, completed=step, description=self._metrics_text())
        elif self.lines and step > self.start and self._schedule.due(step):
            print(f"step {step}/{self.total}  {self._metrics_text()}  {self._schedule.times(step)}",
                  file=sys.stderr, flush=True)

    def log(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)
        elif self.lines:
            print(text, file=sys.stderr, flush=True)

    TOP_COMPONENTS = 3
    """The reward components shown beside the reward: the largest in size, latest step."""

    def _metrics_text(self) -> str:
        shown = [(label, key) for label, key in self._SHOWN if self._latest.get(key) is not None]
        prefix = REWARD_COMPONENT.format("")
        components = [k for k, v in self._latest.items() if k.startswith(prefix) and v is not None]
        components.sort(key=lambda k: -abs(self._latest[k]))
        shown[1:1] = [(k, k) for k in components[: self.TOP_COMPONENTS]]  # right after the reward
        return "  ".join(f"{label} {self._latest[key]:.3f}" for label, key in shown)


class LineSchedule:
    """When a plain progress line is due (a log file, a pipe): every tenth of the work, every
    ``owner.LINE_EVERY_S`` seconds (read at each call), and at the end; and the times it shows.
    ``ProgressBar`` (train) and eval's episode lines share it."""

    def __init__(self, total: int, start: int, owner: Any) -> None:
        self.total, self.start, self._owner = total, start, owner
        self._started = self._last_at = time.monotonic()
        self._last = start
        self._every = max(1, (total - start) // 10)

    def due(self, done: int) -> bool:
        now = time.monotonic()
        if done >= self.total or done - self._last >= self._every or now - self._last_at >= self._owner.LINE_EVERY_S:
            self._last, self._last_at = done, now
            return True
        return False

    def times(self, done: int) -> str:
        """``elapsed 0:00:12  left ~0:00:18``."""
        elapsed = time.monotonic() - self._started
        left = elapsed / max(1, done - self.start) * (self.total - done)
        return f"elapsed {_clock(elapsed)}  left ~{_clock(left)}"


def _clock(seconds: float) -> str:
    """``0:01:05``, as rich's time columns show it."""
    whole = int(seconds)
    return f"{whole // 3600}:{whole % 3600 // 60:02d}:{whole % 60:02d}"


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
