"""A ``--json`` command's stdout carries its JSON alone, so ``| jq`` always works.

While the command runs, everything anyone else writes to stdout (a plugin or an env, through
``print``, ``os.write(1, ...)`` or a C extension, from any thread) goes to stderr: ``sys.stdout``
is ``sys.stderr`` and file descriptor 1 is a copy of 2. The JSON, written with
:func:`print_json`, goes to a copy of the real stdout kept aside.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["json_only_stdout", "print_json"]

_json_out: TextIO | None = None  # the real stdout while a --json command runs
_running = False  # inside json_only_stdout (where a None _json_out means stdout was closed)


@contextmanager
def json_only_stdout() -> Iterator[None]:
    """Run a ``--json`` command with stdout sent to stderr (the module's docstring).

    On the way out fd 1 and ``sys.stdout`` are put back, unless a thread the command started is
    still running (an env's, a plugin's left past its deadline): fd 1 then stays on stderr for
    the rest of the process, as that thread may still write to it, and ``sys.stdout`` writes to
    the real stdout."""
    global _json_out, _running
    stdout = sys.stdout
    _flush(stdout)
    try:
        real_fd: int | None = os.dup(1)
    except OSError:  # fd 1 closed by the caller: nothing to keep clean there
        real_fd = None
    else:
        os.dup2(2, 1)
    on_fd_1 = real_fd is not None and _fileno(stdout) == 1
    # where stdout is not fd 1 (a caller's own stream, pytest's capsys), the JSON goes to that stream
    _json_out = os.fdopen(real_fd, "w", encoding=getattr(stdout, "encoding", None), closefd=False) if on_fd_1 else stdout
    sys.stdout = sys.stderr
    _running = True
    before = set(threading.enumerate())
    try:
        yield
    finally:
        _flush(_json_out)
        _flush(sys.stderr)
        left = any(thread.is_alive() for thread in set(threading.enumerate()) - before)
        if real_fd is not None and left:
            sys.stdout = _json_out  # fd 1 stays on stderr (real_fd stays open: sys.stdout writes there)
        else:
            if real_fd is not None:
                os.dup2(real_fd, 1)
                os.close(real_fd)
            sys.stdout = stdout
        _json_out, _running = None, False


def print_json(value: Any) -> None:
    """Write ``value`` as indented JSON to the real stdout (``sys.stdout`` outside a ``--json`` run)."""
    out = _json_out if _running else sys.stdout
    if out is None:  # stdout closed by the caller (``>&-``): nowhere to write, as print finds it
        return
    out.write(json.dumps(value, indent=2) + "\n")
    out.flush()


def _flush(stream: Any) -> None:
    try:
        stream.flush()
    except (AttributeError, OSError, ValueError):  # None, closed, a broken pipe, or not a file
        pass


def _fileno(stream: Any) -> int | None:
    try:
        return int(stream.fileno())
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is an OSError
        return None
