"""Stdout kept for the command's own output while other code runs: ``StdoutToStderr``.

While it is entered, what anyone writes to stdout (``print``, ``os.write(1, ...)``, a C
extension, from any thread) goes to stderr: ``sys.stdout`` is ``sys.stderr`` and file
descriptor 1 is a copy of 2. Plugin code runs inside it (so a plugin that prints at import
cannot break ``--json``), and so does a whole ``--json`` command, which writes its JSON to
``real_stdout()``.

Nested and concurrent uses share one redirection (a count under a lock); the last one out puts
fd 1 back. Where a thread is left running past its caller (a plugin past its deadline, an
env's), fd 1 stays on stderr for the rest of the process, as that thread may still write to it,
and ``sys.stdout`` then sends the left threads' writes to stderr, everyone else's to a copy of
the real stdout. A ``--json`` command that leaves threads running keeps fd 1 and ``sys.stdout``
on stderr once it is left (``keep_fd_1_on_stderr``): its JSON has been written.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, TextIO

__all__ = ["StdoutToStderr"]


class StdoutToStderr:
    """The redirection (the module's docstring); enter it with ``with``."""

    _lock = threading.Lock()
    _depth = 0
    _saved_fd: int | None = None
    _saved_stdout: Any = None
    _left: set[threading.Thread] = set()
    _keep = False  # the last one out leaves fd 1 on stderr (keep_fd_1_on_stderr)

    def __enter__(self) -> StdoutToStderr:
        cls = type(self)
        with cls._lock:
            if cls._depth == 0:
                cls._saved_stdout = sys.stdout
                _flush(sys.stdout)
                try:
                    saved: int | None = os.dup(1)
                except OSError:  # no fd 1 at all (closed by the caller): nothing to guard there
                    saved = None
                else:
                    try:
                        os.dup2(2, 1)
                    except OSError:
                        os.close(saved)
                        saved = None
                cls._saved_fd = saved
                sys.stdout = sys.stderr
            cls._depth += 1
        return self

    def real_stdout(self) -> TextIO | None:
        """Where the command's own output goes meanwhile: the real stdout (a copy of fd 1 as it
        was), or the stream ``sys.stdout`` was when that was no fd 1 (a caller's own, pytest's
        capture); None when fd 1 was closed by the caller (``>&-``): nowhere to write."""
        cls = type(self)
        stdout, saved = cls._saved_stdout, cls._saved_fd
        if _fileno(stdout) != 1:
            return stdout
        if saved is None:
            return None
        return os.fdopen(saved, "w", encoding=getattr(stdout, "encoding", None), closefd=False)

    def left_running(self, threads: list[threading.Thread]) -> None:
        """Threads that outlive their caller: their output keeps going to stderr."""
        with type(self)._lock:
            type(self)._left.update(threads)

    def keep_fd_1_on_stderr(self) -> None:
        """When the last guard is left, fd 1 stays a copy of stderr for the rest of the process,
        and ``sys.stdout`` is put back (so its writes go there too): for a ``--json`` command that
        leaves threads running, so nothing lands after its JSON, not even as the guard is left.
        Unlike ``left_running``, nothing is remembered past that exit: a later guard (a caller
        that runs commands in process) puts its own fd 1 back."""
        with type(self)._lock:
            type(self)._keep = True

    def __exit__(self, *exc: object) -> None:
        cls = type(self)
        with cls._lock:
            cls._depth -= 1
            if cls._depth:
                return
            _flush(sys.stderr)
            stdout, saved = cls._saved_stdout, cls._saved_fd
            cls._left = {thread for thread in cls._left if thread.is_alive()}
            if cls._keep:
                cls._keep = False
                if saved is not None:
                    os.close(saved)
                sys.stdout = stdout
                return
            if not cls._left:
                if saved is not None:
                    os.dup2(saved, 1)
                    os.close(saved)
                sys.stdout = stdout
                return
            if saved is not None and _fileno(stdout) == 1:  # fd 1 stays on stderr: write ours past it
                stdout = os.fdopen(
                    saved, "w", buffering=1 if stdout.line_buffering else -1, encoding=stdout.encoding,
                    errors=stdout.errors, closefd=False,
                )
            elif saved is not None:
                os.close(saved)
            sys.stdout = _StdoutToStderrFor(stdout, cls._left)


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


class _StdoutToStderrFor:
    """``sys.stdout`` once threads are left running: their writes go to stderr, all others' to
    the real stdout."""

    def __init__(self, stdout: Any, threads: set[threading.Thread]) -> None:
        self._stdout = stdout
        self._threads = threads

    def _target(self) -> Any:
        return sys.stderr if threading.current_thread() in self._threads else self._stdout

    def write(self, text: str) -> int:
        return self._target().write(text)

    def flush(self) -> None:
        self._target().flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stdout, name)
