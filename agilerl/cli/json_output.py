"""A ``--json`` command's stdout carries its JSON alone, so ``| jq`` always works.

The command runs inside ``agilerl.stdout_guard.StdoutToStderr``: whatever anyone else writes to
stdout (a plugin or an env, through ``print``, ``os.write(1, ...)`` or a C extension, from any
thread) goes to stderr. The JSON, written with :func:`print_json`, goes to the real stdout.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from agilerl.stdout_guard import StdoutToStderr

__all__ = ["json_only_stdout", "print_json"]

_json_out: TextIO | None = None  # the real stdout while a --json command runs
_running = False  # inside json_only_stdout (where a None _json_out means stdout was closed)


@contextmanager
def json_only_stdout() -> Iterator[None]:
    """Run a ``--json`` command with stdout sent to stderr (the module's docstring). A thread the
    command leaves running (an env's, a plugin's) may still write: the guard is told so before it
    is left, so fd 1 stays on stderr for the rest of the process and nothing lands after the
    JSON, not even in the moment between leaving the guard and looking."""
    global _json_out, _running
    before = set(threading.enumerate())
    with StdoutToStderr() as guard:
        _json_out, _running = guard.real_stdout(), True
        try:
            yield
        finally:
            try:
                if _json_out is not None:
                    _json_out.flush()
            except (OSError, ValueError):  # a broken pipe (| head): the JSON's reader has gone
                pass
            _json_out, _running = None, False
            if any(thread.is_alive() for thread in set(threading.enumerate()) - before):
                guard.keep_fd_1_on_stderr()


def print_json(value: Any) -> None:
    """Write ``value`` as indented JSON to the real stdout (``sys.stdout`` outside a ``--json`` run)."""
    out = _json_out if _running else sys.stdout
    if out is None:  # stdout closed by the caller (``>&-``): nowhere to write, as print finds it
        return
    out.write(json.dumps(value, indent=2) + "\n")
    out.flush()
