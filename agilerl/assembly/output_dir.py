"""``agilerl train``'s output folder: never mixed with an earlier run, never written by two runs
at once (a running one holds a lock), and ``--overwrite`` deletes only a folder that is
recognisably a run, nothing a user keeps there or above it."""

from __future__ import annotations

import os
import re
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agilerl.errors import OutputDirError
from agilerl.train.checkpoint import CHECKPOINTS
from agilerl.train.metrics import METRICS_FILE
from agilerl.train.run_dir import RUN_LOCK, RUN_MARKER, run_entries

__all__ = ["hold_output_dir", "prepare_output_dir", "deletable_run_contents"]

_CHECKPOINT_NAME = re.compile(r"step-\d+(\.partial)?\Z")


@contextmanager
def hold_output_dir(output_dir: Path) -> Iterator[None]:
    """Hold ``output_dir``'s lock while the block runs: a second ``agilerl train`` on the same
    folder (a fresh run, or a ``--resume`` beside a running one) gets ``OutputDirError`` naming
    the folder and the holder's pid, instead of interleaving its metrics and checkpoints. The
    lock is the kernel's (``fcntl.flock``): it goes with the process, however it ends; the file
    is removed on a clean exit. Under a launcher rank 0 holds it for the whole run."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock to take
        yield
        return
    if os.environ.get("RANK", "0") != "0":
        yield
        return
    made_folder = not output_dir.exists()
    output_dir.mkdir(parents=True, exist_ok=True)
    path = output_dir / RUN_LOCK
    fd = _locked(path, fcntl)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        path.unlink(missing_ok=True)  # still held: a run starting now makes a new file and waits for none
        os.close(fd)
        if made_folder and not any(output_dir.iterdir()):
            output_dir.rmdir()  # a run refused before it wrote anything leaves nothing behind


def _locked(path: Path, fcntl: Any) -> int:
    """A descriptor of ``path`` holding its exclusive lock; the file is checked to be the one
    still at ``path`` (a run ending in between unlinks it), as lock files must be."""
    for _ in range(100):
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise OutputDirError(
                f"output_dir {path.parent} is in use by another agilerl train (pid {holder}); wait "
                "for it to end (or stop it: Ctrl-C saves), or pick another --output-dir."
            ) from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed that file as it ended: lock the new one
    raise OutputDirError(f"output_dir {path.parent}: its lock file {path} keeps changing; is another run starting there?")


def prepare_output_dir(output_dir: Path, *, manifest: Path, resume: bool, overwrite: bool) -> None:
    """Refuse a fresh run into a folder that holds anything (unless ``overwrite`` and it is safely
    a run's: then delete it, saying what goes). Under ``accelerate launch``/``torchrun`` rank 0
    alone decides (the launcher stops the others when it exits), so no two ranks delete at once."""
    if os.environ.get("RANK", "0") != "0":
        return
    if resume or not output_dir.is_dir() or not _entries(output_dir):
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
    for entry in _entries(output_dir):  # the lock stays: this run holds it
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def _entries(folder: Path) -> list[Path]:
    """What ``folder`` holds, less the lock file (held by a run, never content)."""
    return [entry for entry in folder.iterdir() if entry.name != RUN_LOCK]


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
    for entry in sorted(_entries(folder)):
        if entry.name == CHECKPOINTS and entry.is_dir():
            steps = sorted(p.name for p in entry.iterdir())
            parts.append(f"{CHECKPOINTS}/ ({', '.join(steps) or 'empty'})")
        else:
            parts.append(entry.name + ("/" if entry.is_dir() else ""))
    return ", ".join(parts)
