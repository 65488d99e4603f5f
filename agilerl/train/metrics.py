"""What a run reports: ``metrics.jsonl`` (one line per step), a live progress bar, and the
reward (or loss) curve as a PNG drawn from the jsonl, so the plot never disagrees with the log."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agilerl.errors import PlotUnavailable

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """Appends one JSON object per step; a resumed run first drops lines past its checkpoint."""

    def __init__(self, output_dir: str | Path, *, start_step: int = 0) -> None:
        self.path = Path(output_dir) / METRICS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= start_step] if start_step else []
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))

    def write(self, step: int, metrics: Mapping[str, float], info: Mapping[str, Any] | None = None) -> None:
        """One line: ``step``, ``info`` as given (e.g. the engine, on a run's first line), then
        the metrics (non-finite values as null)."""
        record = {"step": step, **(info or {}), **{k: _finite(v) for k, v in metrics.items()}}
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a ``metrics.jsonl`` (none if the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_curves(
    metrics_path: str | Path, png_path: str | Path, keys: Sequence[str], *, title: str
) -> Path:
    """Plot ``keys`` against ``step`` from the jsonl (matplotlib's Agg backend: no display)."""
    try:
        import matplotlib
    except ImportError:
        raise PlotUnavailable(
            f"no {Path(png_path).name}: plotting needs matplotlib (pip install 'agilerl-envlayer[plot]'); "
            f"the numbers are in {metrics_path}"
        ) from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = read_metrics(metrics_path)
    fig, ax = plt.subplots(figsize=(7, 4))
    for key in keys:
        points = [(r["step"], r[key]) for r in records if r.get(key) is not None]
        if points:
            steps, values = zip(*points)
            ax.plot(steps, values, marker="o" if len(points) < 30 else None, label=key)
    ax.set_xlabel("step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)
    return Path(png_path)


class ProgressBar:
    """A rich progress bar whose description shows the latest reward and loss."""

    def __init__(self, total: int, start: int, show: bool = True) -> None:
        self.total, self.start, self.show = total, start, show
        self._progress: Any = None
        self._task: Any = None
        self._latest: dict[str, float] = {}  # evaluation results stay shown until the next one

    @contextmanager
    def running(self) -> Iterator[ProgressBar]:
        if not self.show:
            yield self
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.description}"),
            console=Console(stderr=True),
        )
        with self._progress:
            self._task = self._progress.add_task("", total=self.total, completed=self.start)
            yield self

    def update(self, step: int, metrics: Mapping[str, float]) -> None:
        if self._progress is None:
            return
        self._latest.update(metrics)
        shown = [
            f"{label} {self._latest[key]:.3f}"
            for label, key in (
                ("reward", "train/reward"), ("loss", "train/loss"),
                ("eval reward", "eval/reward"), ("eval loss", "eval/loss"),
            )
            if self._latest.get(key) is not None
        ]
        self._progress.update(self._task, completed=step, description="  ".join(shown))

    def log(self, text: str) -> None:
        if self._progress is not None:
            self._progress.console.print(text)


def _finite(value: float) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None
