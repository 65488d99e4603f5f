"""``agilerl train``'s output folder: never mixed with an earlier run, and ``--overwrite``
deletes only a folder that is recognisably a run, nothing a user keeps there or above it."""

from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

from agilerl.errors import OutputDirError
from agilerl.train.checkpoint import CHECKPOINTS
from agilerl.train.metrics import METRICS_FILE
from agilerl.train.run_dir import RUN_MARKER, run_entries

__all__ = ["prepare_output_dir", "deletable_run_contents"]

_CHECKPOINT_NAME = re.compile(r"step-\d+(\.partial)?\Z")


def prepare_output_dir(output_dir: Path, *, manifest: Path, resume: bool, overwrite: bool) -> None:
    """Refuse a fresh run into a folder that holds anything (unless ``overwrite`` and it is safely
    a run's: then delete it, saying what goes). Under ``accelerate launch``/``torchrun`` rank 0
    alone decides (the launcher stops the others when it exits), so no two ranks delete at once."""
    if os.environ.get("RANK", "0") != "0":
        return
    if resume or not output_dir.is_dir() or not any(output_dir.iterdir()):
        return
    if not overwrite:
        what = "a run" if _looks_like_a_run(output_dir) else "files"
        raise OutputDirError(
            f"output_dir {output_dir} already holds {what}; a fresh run there would mix with it. "
            "Continue a run there with --resume, start over with --overwrite (deletes it, if it "
            "is a run), or pick another --output-dir."
        )
    deleted = deletable_run_contents(output_dir, manifest)
    print(f"overwrite: deleting {output_dir}: {deleted}", file=sys.stderr, flush=True)
    shutil.rmtree(output_dir)


def deletable_run_contents(output_dir: Path, manifest: Path) -> str:
    """What deleting ``output_dir`` would remove, as one line; ``OutputDirError`` when it is
    not safely a run's folder (a protected place, or it holds anything a run did not write)."""
    folder = output_dir.resolve()
    refuse = f"--overwrite refuses to delete {output_dir} ({folder})"
    keep = "nothing was deleted; pick another --output-dir"  # what to do instead
    protected = _protected_reason(output_dir, folder, manifest.resolve())
    if protected:
        raise OutputDirError(f"{refuse}: {protected}; {keep}.")
    names = {entry.name for entry in folder.iterdir()}
    if not _looks_like_a_run(folder):
        raise OutputDirError(
            f"{refuse}: it is not a run's folder (no {RUN_MARKER}, {METRICS_FILE} or {CHECKPOINTS}/); "
            f"{keep}."
        )
    foreign = sorted(names - run_entries(folder))
    checkpoints = folder / CHECKPOINTS
    if checkpoints.is_dir():
        foreign += [f"{CHECKPOINTS}/{p.name}" for p in sorted(checkpoints.iterdir()) if not _CHECKPOINT_NAME.match(p.name)]
    elif checkpoints.exists():
        foreign.append(CHECKPOINTS)
    if foreign:
        shown = ", ".join(foreign[:10]) + (f", ... ({len(foreign)} in all)" if len(foreign) > 10 else "")
        raise OutputDirError(
            f"{refuse}: it holds files the run did not write: {shown}; {keep}, or move those away."
        )
    return _describe(folder)


def _looks_like_a_run(folder: Path) -> bool:
    return any((folder / name).exists() for name in (RUN_MARKER, METRICS_FILE, CHECKPOINTS))


def _protected_reason(given: Path, folder: Path, manifest: Path) -> str | None:
    if given.is_symlink():
        return "it is a symbolic link"
    cwd, home = Path.cwd().resolve(), Path.home().resolve()
    if folder == folder.parent:
        return "it is the file system's root"
    if folder == home or folder in home.parents:
        return "it is your home folder" if folder == home else "it holds your home folder"
    if folder == cwd or folder in cwd.parents:
        return "it is the current folder" if folder == cwd else "it holds the current folder"
    if folder == manifest.parent or folder in manifest.parents:
        return f"it holds the manifest {manifest}"
    return None


def _describe(folder: Path) -> str:
    """``metrics.jsonl, checkpoints/ (step-000002, step-000004), reward_curve.png``."""
    parts = []
    for entry in sorted(folder.iterdir()):
        if entry.name == CHECKPOINTS and entry.is_dir():
            steps = sorted(p.name for p in entry.iterdir())
            parts.append(f"{CHECKPOINTS}/ ({', '.join(steps) or 'empty'})")
        else:
            parts.append(entry.name + ("/" if entry.is_dir() else ""))
    return ", ".join(parts)
