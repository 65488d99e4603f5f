"""``agilerl train MANIFEST``: train the manifest's model on its environment."""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["add_parser"]


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train",
        help="Train the manifest's model with its algorithm on its environment.",
        description="Train with the manifest's model:, algorithm: and training: sections. Writes "
        "metrics.jsonl, a reward (or loss) curve and checkpoints under training.output_dir. "
        "Ctrl-C saves a checkpoint and stops; --resume continues from it.",
    )
    parser.add_argument("manifest", help="Path to a manifest YAML file.")
    parser.add_argument("--max-steps", type=int, help="Override training.max_steps.")
    parser.add_argument("--output-dir", help="Override training.output_dir.")
    parser.add_argument("--seed", type=int, help="Override training.seed.")
    parser.add_argument(
        "--resume", nargs="?", const="latest", metavar="CHECKPOINT",
        help="Continue from a checkpoint folder (default: the latest under output_dir).",
    )
    parser.add_argument(
        "--overwrite", action="store_true",
        help="Delete output_dir first when it holds an earlier run: only a folder of a run's own "
        "files, never /, home, the current folder or the manifest's (default: refuse, never mix runs).",
    )
    parser.add_argument("--no-progress", action="store_true", help="No progress bar.")
    parser.set_defaults(handler=_train)


def _train(args: argparse.Namespace) -> int:
    from agilerl.assembly.output_dir import hold_output_dir
    from agilerl.cli.manifest_cmd import load_manifest_reporting_warnings

    manifest = load_manifest_reporting_warnings(args.manifest)
    output_dir = Path(args.output_dir or manifest.output_dir)
    with hold_output_dir(output_dir), _stops_as_interrupt():  # one run at a time in a folder
        return _train_holding(args, manifest, output_dir)


def _train_holding(args: argparse.Namespace, manifest: Any, output_dir: Path) -> int:
    from agilerl.assembly.from_manifest import train_from_manifest
    from agilerl.assembly.output_dir import prepare_output_dir
    from agilerl.errors import CheckpointError
    from agilerl.train.checkpoint import saved_checkpoints

    prepare_output_dir(output_dir, manifest=Path(args.manifest), resume=args.resume is not None, overwrite=args.overwrite)
    overrides = {"max_steps": args.max_steps, "output_dir": str(output_dir), "seed": args.seed}
    try:
        result = train_from_manifest(
            manifest, overrides=overrides, resume=args.resume, show_progress=not args.no_progress
        )
    except KeyboardInterrupt:  # a second Ctrl-C after the save (a burst): still say how to go on
        _stopping()
        if saved_checkpoints(output_dir) and _is_rank_0():
            print(f"resume with: {_resume_command(args)}", file=sys.stderr, flush=True)
        raise
    except Exception as exc:  # whatever ended the run, say how to continue it if it can be
        # a checkpoint the resume itself refused is not one to suggest resuming from again
        if not isinstance(exc, CheckpointError) and saved_checkpoints(output_dir):
            exc.add_note(f"resume with: {_resume_command(args)}")
        raise
    _leave_process_group()
    if result.interrupted:
        _stopping()
    if result.rank != 0:
        return 130 if result.interrupted else 0  # rank 0 reports for every process
    shown = {k: round(v, 4) for k, v in result.metrics.items() if k.split("/")[0] in ("train", "eval")}
    print(f"{'stopped' if result.interrupted else 'finished'} at step {result.step}: {shown}")
    print(f"metrics:    {result.output_dir / 'metrics.jsonl'}")
    if (result.output_dir / "rollouts.jsonl").is_file():
        print(f"samples:    {result.output_dir / 'rollouts.jsonl'} (see them: agilerl view {result.output_dir})")
    if result.plot is not None:
        print(f"plot:       {result.plot}")
    if result.checkpoint is not None:
        print(f"checkpoint: {result.checkpoint}")
        if result.interrupted:
            print(f"resume with: {_resume_command(args)}")
    return 130 if result.interrupted else 0


def _leave_process_group() -> None:
    """Under a launcher, every rank leaves the process group together before it exits: a gloo or
    NCCL group still open as the interpreter ends can abort a rank at exit ("terminate called
    without an active exception"), failing a run that finished."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        from accelerate import PartialState

        state = PartialState()
        state.wait_for_everyone()
        state.destroy_process_group()


_STOPS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


@contextmanager
def _stops_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP (the terminal or the ssh session closed) stop a run as Ctrl-C does, from
    the command's start: in the loop the trainer saves a checkpoint and the command says how to
    resume; during setup (the model, the envs, a fleet's replicas) what was started is closed
    and the command says it was interrupted, instead of dying with its replicas or Ray cluster
    left behind. Under ``nohup`` (SIGHUP ignored) the run outlives its terminal. The handlers are
    put back as they were at the end."""
    from agilerl.concurrency import stop_signals

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in _STOPS}
    hangup = getattr(signal, "SIGHUP", None)
    for signum in stop_signals():  # SIGTERM unless someone set a handler of their own
        if signum == hangup or (signum == signal.SIGTERM and previous[signum] is signal.SIG_DFL):
            signal.signal(signum, signal.default_int_handler)  # KeyboardInterrupt, as Ctrl-C
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # stopping: the process ends next
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def _stopping() -> None:
    """The run is stopping (saved, or failed): the rest of a burst of Ctrl-Cs cannot cut its
    last words (where it was saved, how to resume) or the interpreter's exit short; the signals
    stay ignored, as the process is about to end."""
    if threading.current_thread() is threading.main_thread():
        for signum in _STOPS:
            signal.signal(signum, signal.SIG_IGN)


def _is_rank_0() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _resume_command(args: argparse.Namespace) -> str:
    """This command again, continuing from the latest checkpoint: same manifest and overrides."""
    words = ["agilerl", "train", args.manifest]
    for flag, value in (("--max-steps", args.max_steps), ("--output-dir", args.output_dir), ("--seed", args.seed)):
        if value is not None:
            words += [flag, str(value)]
    if args.no_progress:
        words.append("--no-progress")
    return shlex.join([*words, "--resume"])
