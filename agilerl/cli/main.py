"""Entry point of the ``agilerl`` command.

Each command group lives in its own module exposing ``add_parser(subparsers)``; modules import
their heavy dependencies inside the handlers, so ``agilerl --help`` stays fast.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from contextlib import nullcontext
from importlib import import_module

import agilerl
from agilerl.cli.json_output import json_only_stdout
from agilerl.errors import AgileRLError, MissingExtra, exception_text

__all__ = ["COMMAND_MODULES", "build_parser", "main"]

COMMAND_MODULES = (
    "agilerl.cli.manifest_cmd",
    "agilerl.cli.env_cmd",
    "agilerl.cli.plugins_cmd",
    "agilerl.cli.serve_cmd",
    "agilerl.cli.train_cmd",
    "agilerl.cli.eval_cmd",
    "agilerl.cli.view_cmd",
)



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agilerl",
        description="The environment layer for training LLMs with reinforcement learning.",
    )
    parser.add_argument("--version", action="version", version=f"agilerl {agilerl.__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        import_module(name).add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; user errors print one clear message and exit 2, never a traceback."""
    parser = build_parser()
    args = parser.parse_args(argv)
    handler = getattr(args, "handler", None)
    if handler is None:  # no command: say what the commands are, and fail like any bad usage
        parser.print_help(sys.stderr)
        return 2
    try:
        command = " ".join(v for k, v in vars(args).items() if k.endswith("command") and v)
        # --json: the JSON alone on stdout, whatever plugins and envs print meanwhile
        with MissingExtra.translate(f"agilerl {command}"), json_only_stdout() if getattr(args, "json", False) else nullcontext():
            return int(handler(args) or 0)
    except AgileRLError as exc:
        print(f"error: {exc}", file=sys.stderr)
        _print_notes(exc)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `agilerl ... | head` stopped reading: nothing left to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # a bug or an env's own failure: still no bare traceback
        if os.environ.get("AGILERL_DEBUG"):
            raise
        print(f"error: {exception_text(exc)}", file=sys.stderr)
        _print_notes(exc)
        print("(set AGILERL_DEBUG=1 for the traceback)", file=sys.stderr)
        return 1


def _print_notes(exc: BaseException) -> None:
    """What was added on the way out (the checkpoint a failed run saved, how to resume it)."""
    for note in getattr(exc, "__notes__", []):
        print(note, file=sys.stderr)
