"""The built-in trackers: accelerate's own, each opened as its users expect and, where the tool
can, continuing the same run on resume.

- ``tensorboard``: event files under ``<output_dir>/tensorboard``; a resumed run hides the
  events past its checkpoint (``purge_step``), as ``metrics.jsonl`` drops those lines.
- ``wandb``: run id kept across resumes (``resume="allow"``), files under ``<output_dir>/wandb``;
  ``WANDB_MODE=offline`` works offline (``wandb sync`` uploads later).
- ``trackio``: a local store (``TRACKIO_DIR``, default ``~/.cache/huggingface/trackio``); a
  resumed run continues the latest run of its name.
- ``mlflow``, ``aim``, ``comet_ml``, ``clearml``, ``dvclive``, ``swanlab``: accelerate's defaults,
  a new run each time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agilerl.train.tracking import TrackerRun, require_package

if TYPE_CHECKING:
    from accelerate.tracking import GeneralTracker

__all__ = [
    "tensorboard",
    "wandb",
    "trackio",
    "mlflow",
    "aim",
    "comet_ml",
    "clearml",
    "dvclive",
    "swanlab",
]


def tensorboard(run: TrackerRun) -> GeneralTracker:
    require_package("tensorboard", "tensorboard", "tensorboardX")
    from accelerate.tracking import TensorBoardTracker

    purge = {"purge_step": run.start_step + 1} if run.resuming else {}
    return TensorBoardTracker("tensorboard", run.output_dir, **purge)


def wandb(run: TrackerRun) -> GeneralTracker:
    require_package("wandb", "wandb")
    from accelerate.tracking import WandBTracker

    run.output_dir.mkdir(parents=True, exist_ok=True)
    return WandBTracker(run.project, name=run.name, id=run.run_id, resume="allow", dir=str(run.output_dir))


def trackio(run: TrackerRun) -> GeneralTracker:
    require_package("trackio", "trackio")
    from accelerate.tracking import TrackioTracker

    return TrackioTracker(run.project, name=run.name, resume="allow" if run.resuming else "never")


def _accelerate_default(name: str, module: str, package: str) -> Callable[[TrackerRun], GeneralTracker]:
    """accelerate's tracker ``name`` built as ``init_trackers`` builds it: the project first, and
    the output folder where the tracker keeps files."""

    def build(run: TrackerRun) -> GeneralTracker:
        require_package(name, module, package=package)
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        cls: Any = LOGGER_TYPE_TO_CLASS[name]
        if cls.requires_logging_directory:
            return cls(run.project, str(run.output_dir))
        return cls(run.project)

    build.__name__ = build.__qualname__ = name
    build.__doc__ = f"accelerate's {name} tracker (needs {package})."
    return build


mlflow = _accelerate_default("mlflow", "mlflow", "mlflow")
aim = _accelerate_default("aim", "aim", "aim")
comet_ml = _accelerate_default("comet_ml", "comet_ml", "comet-ml")
clearml = _accelerate_default("clearml", "clearml", "clearml")
dvclive = _accelerate_default("dvclive", "dvclive", "dvclive")
swanlab = _accelerate_default("swanlab", "swanlab", "swanlab")
