"""Experiment trackers: ``training.report_to`` sends what ``metrics.jsonl`` gets (same keys, same
steps) to TensorBoard, wandb, trackio and the rest, through accelerate's own trackers
(``Accelerator(log_with=...)``, ``init_trackers``, ``log``), on rank 0 only.

A tracker is a registered kind (``register_trackers``): a callable ``(run: TrackerRun) ->
accelerate.tracking.GeneralTracker``. The run's identity is kept in ``<output_dir>/tracker_run.json``,
so a resumed run continues the same tracker run where the tracker can.
"""

from __future__ import annotations

import importlib.util
import json
import math
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agilerl.errors import TrackerUnavailable

if TYPE_CHECKING:
    from accelerate import Accelerator
    from accelerate.tracking import GeneralTracker

    from agilerl.manifest.settings import TrainingSettings

__all__ = ["RUN_FILE", "TrackerRun", "require_package", "Tracking", "flat_config", "run_config"]

RUN_FILE = "tracker_run.json"


@dataclass(frozen=True)
class TrackerRun:
    """What a tracker factory gets: the run to open, or to continue when ``start_step > 0``."""

    project: str
    name: str
    run_id: str  # the same across a run's resumes
    output_dir: Path  # where a tracker keeps local files (TensorBoard's events, wandb's offline runs)
    start_step: int = 0  # the checkpoint's step when resuming; steps after it are logged again

    @property
    def resuming(self) -> bool:
        return self.start_step > 0


def require_package(tracker: str, *modules: str, package: str | None = None) -> None:
    """Fail in one line naming the package unless one of ``modules`` is installed (found, not
    imported: the check costs nothing, so every rank makes it and none waits on a rank that failed)."""
    for module in modules:
        try:
            if importlib.util.find_spec(module) is not None:
                return
        except (ImportError, ValueError):  # a parent package missing, or a module without a spec
            continue
    raise TrackerUnavailable(tracker, package or modules[0])


class Tracking:
    """The trainer's trackers: built before its accelerator (they go in as ``log_with``), started
    with the run's settings as config, fed every metrics row, finished however the run ends."""

    def __init__(self, settings: TrainingSettings, start_step: int = 0) -> None:
        from agilerl.registry import resolve

        output_dir = Path(settings.output_dir)
        saved = _read_run_file(output_dir) if start_step else {}
        self.run = TrackerRun(
            project=settings.project,
            name=settings.run_name or saved.get("name") or output_dir.resolve().name,
            run_id=saved.get("run_id") or uuid.uuid4().hex[:12],
            output_dir=output_dir,
            start_step=start_step,
        )
        names = list(dict.fromkeys(settings.report_to))  # each tracker once, in the order given
        self.trackers: list[GeneralTracker] = [resolve("tracker", name)(self.run) for name in names]
        self._accelerator: Accelerator | None = None

    @contextmanager
    def running(self, accelerator: Accelerator, config: Mapping[str, Any]) -> Iterator[None]:
        """Start the trackers (rank 0) with ``config`` and finish them when the block ends."""
        if not self.trackers:
            yield
            return
        if accelerator.is_main_process:
            self.run.output_dir.mkdir(parents=True, exist_ok=True)
            (self.run.output_dir / RUN_FILE).write_text(
                json.dumps({"name": self.run.name, "run_id": self.run.run_id}) + "\n"
            )
        accelerator.init_trackers(self.run.project, config=flat_config(config))
        self._accelerator = accelerator
        try:
            yield
        finally:
            self._accelerator = None
            if accelerator.is_main_process:
                for tracker in accelerator.trackers:
                    tracker.finish()

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """One metrics row at ``step``, as ``metrics.jsonl`` has it (non-finite values left out,
        as the jsonl's nulls are)."""
        if self._accelerator is None:
            return
        values = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
        self._accelerator.log(values, step=step)


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """``{"training": {"lr": ...}}`` as ``{"training.lr": ...}``: every tracker takes flat scalars
    (TensorBoard's hparams take nothing else); lists and None are written as JSON text."""
    flat: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_config(value, prefix=name + "."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, default=str)
    return flat


def run_config(settings: TrainingSettings, algorithm: Any, engine: str) -> dict[str, Any]:
    """The run's settings as its trackers' config: ``training:``, the algorithm's options, the engine."""
    return {
        "training": settings.model_dump(mode="json"),
        "algorithm": {"class": type(algorithm).__name__, **algorithm.config.model_dump(mode="json")},
        "engine": engine,
    }


def _read_run_file(output_dir: Path) -> dict[str, str]:
    try:
        saved = json.loads((output_dir / RUN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}

